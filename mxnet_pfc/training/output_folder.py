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

from mxnet_pfc.training import checkpoint
from mxnet_pfc.runtime.errors import PfcError

EARLIER_RUNS = "earlier-runs"
# What a run writes into its output folder (train.py, metrics.py, export.py): moved together by --start_over.
# The lock, the elastic supervisor's files and the image index (a cache of the data) stay.
RUN_FILES = ("checkpoints", "logs", "metrics.jsonl", "tensorboard", "config.json", "model-symbol.json",
             "model-0000.params", "model-verification.json", "model.onnx", "model-onnx-check.json")


class OutputHoldsRunError(PfcError, RuntimeError):
    """A fresh run asked for in an output folder that holds another run's checkpoints."""


def prepare(output: str, resume: str, start_over: bool) -> str:
    """Refuse, or move the earlier run aside; returns a log line ('' when the folder holds no run).

    Called on rank 0 with the output lock held.
    """
    newest = checkpoint.latest(os.path.join(output, "checkpoints"))
    if newest is None or resume:
        return ""
    if not start_over:
        raise OutputHoldsRunError(
            f"{output} holds a run (its newest checkpoint: {newest.describe()}). Continue it with --resume latest, "
            f"or start afresh with --start_over true (moves that run to {output}/{EARLIER_RUNS}/) or another "
            f"--output")
    aside = os.path.join(output, EARLIER_RUNS, time.strftime("%Y%m%d-%H%M%S"))
    while os.path.exists(aside):
        aside += "-again"
    os.makedirs(aside)
    moved = [name for name in RUN_FILES if os.path.lexists(os.path.join(output, name))]
    for name in moved:
        os.rename(os.path.join(output, name), os.path.join(aside, name))
    return f"--start_over: the earlier run in {output} (newest checkpoint {newest.describe()}) moved to {aside}"
