"""An output folder that already holds a run: continued (--resume), moved aside (--start_over), or refused.

Starting afresh in a folder that holds checkpoints would mix two runs: the new
run's metrics would replace the old ones, `--resume latest` would later pick
whichever checkpoint sorts newest, and pruning would delete one run's
checkpoints for the other's. So a fresh run there is refused with the choices;
--start_over moves the earlier run's files to OUTPUT/earlier-runs/TIME/ and
deletes nothing. Rank 0 decides this under the output lock, before any rank
writes into the folder. See docs/DESIGN.md section 5.5.
"""
from __future__ import annotations

import os
import time

from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.run_folder import RunFolder


class OutputHoldsRunError(PfcError, RuntimeError):
    """A fresh run asked for in an output folder that holds another run's checkpoints."""


def prepare(run: RunFolder, resume: str, start_over: bool) -> str:
    """Refuse, or move the earlier run aside; returns a log line ('' when the folder holds no run).

    Called on rank 0 with the output lock held.
    """
    newest = checkpoints.latest(run.checkpoints)
    if newest is None or resume:
        return ""
    if not start_over:
        raise OutputHoldsRunError(
            f"{run.root} holds a run (its newest checkpoint: {newest.describe()}). Continue it with --resume latest, "
            f"or start afresh with --start_over true (moves that run to {run.earlier_runs}/) or another "
            f"--output")
    aside = os.path.join(run.earlier_runs, time.strftime("%Y%m%d-%H%M%S"))
    while os.path.exists(aside):
        aside += "-again"
    os.makedirs(aside)
    for path in run.run_files():
        if os.path.lexists(path):
            os.rename(path, os.path.join(aside, os.path.basename(path)))
    return f"--start_over: the earlier run in {run.root} (newest checkpoint {newest.describe()}) moved to {aside}"
