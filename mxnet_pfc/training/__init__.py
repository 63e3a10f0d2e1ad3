"""The trainer and the files of a run: configuration, the run's plan and learning
rate, the MXNet module that joins backbone and head, checkpoints and resuming,
metrics and the output folder.
"""
