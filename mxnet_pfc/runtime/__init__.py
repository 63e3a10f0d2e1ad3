"""The processes of a run: Horovod (comm, the only importer of horovod in a rank), how a
failure on one rank ends every rank (stops), the progress watchdog, the output
folder's lock, seeding, devices, the log, shared errors and file writing, the
one reader of model graphs (symbol_file), the
paths under a run's output folder (run_folder) and the records the trainer and the
supervisor exchange there (run_records), a rank's environment before the trainer
starts (rank), and the elastic supervisor that relaunches the trainer. Nothing here
imports the head.
"""
