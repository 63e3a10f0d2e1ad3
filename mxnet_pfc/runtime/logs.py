"""The run's log: a file per rank (OUTPUT/logs/rankR.log); rank 0 also prints to stdout.

Every module logs through a child of the "mxnet_pfc" logger, so configuring
that one logger here is enough.
"""
from __future__ import annotations

import logging
import os
import sys

from mxnet_pfc.runtime.run_folder import RunFolder

ROOT_LOGGER = "mxnet_pfc"
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"      # with the date: a run lasts days


def setup(run: RunFolder, rank: int) -> str:
    """Send the project's log records to OUTPUT/logs/rankR.log (and stdout on rank 0); returns the file."""
    log = logging.getLogger(ROOT_LOGGER)
    os.makedirs(run.logs, exist_ok=True)
    path = run.log_file(rank)
    formatter = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s", TIME_FORMAT)
    handlers = [logging.FileHandler(path)]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    for handler in handlers:
        handler.setFormatter(formatter)
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return path
