"""The trainer and the files of a run: trainer (the loop: python -m mxnet_pfc.train),
config (fields, presets, --help), run_plan (steps, classes, the global batch),
lr_schedule, module (the MXNet module that joins backbone and head), checkpoint
(writing a checkpoint's arrays, every rank together; its names and state.json are
runtime/checkpoints.py's), resume (what changed since
it), metrics (the progress line and metrics.jsonl) and output_folder (a fresh run,
a resume, or --start_over).
"""
