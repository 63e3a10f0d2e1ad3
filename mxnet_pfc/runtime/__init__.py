"""The ground floor: the processes of a run and its files. Horovod (comm, the only importer of horovod
in a rank), how a failure on one rank ends every rank (stops), the progress watchdog, the output
folder's lock, seeding, devices, the log, shared errors and file reading and writing, the one reader
of model graphs (symbol_file) and of MXNet's array files (mxnet_files), the paths under a run's output
folder (run_folder), and what a run leaves there, readable without MXNet: its checkpoints' names,
order and state.json (checkpoints), the failure records of its ranks (failure_records) and the
records the trainer and the supervisor exchange (supervisor_messages). A rank's environment
(rank_environment) and its launcher (launch_rank, which config.sh execs), Slurm's facts (slurm), and
the elastic supervisor that relaunches the trainer, and unit rows (vectors). Nothing here imports a higher floor
(docs/DESIGN.md's table of floors).
"""
