"""The trainer: trainer (the loop: python -m mxnet_pfc.train), config (fields, presets, --help, and
the configuration completed from the data: classes, network width, verification sets), run_length (the
global batch, the run's length in steps, its cost), lr_schedule, module (the MXNet module that joins
backbone and head), checkpoint (writing a checkpoint's arrays, every rank together; its names and
state.json are runtime/checkpoints.py's), resume (what changed since it), starting_point (--pretrained,
--init_centers), distill (--teacher), metrics (the progress line and metrics.jsonl), earlier_run (a
fresh run, a resume, or --start_over in a folder that holds a run) and insightface_run (their runs as
a starting point).
"""
