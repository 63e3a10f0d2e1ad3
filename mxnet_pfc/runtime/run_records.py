"""What the trainer and the elastic supervisor tell each other, through files in OUTPUT.

The supervisor asks a running trainer to stop at its next periodic checkpoint
(the stop request); the trainer says that it stopped there (the stopped
record), that it ended normally (the finished record), or that the output
lock refused it (the busy record). The supervisor puts a launch id in every
rank's environment and the trainer writes it into its finished and busy
records, so that a supervisor believes only its own job's records, never an
earlier run's or a bystander's. Both sides import this module; the paths are
RunFolder's. See docs/DESIGN.md section 6.5.
"""
from __future__ import annotations

import json
import os

from mxnet_pfc.runtime.files import write_json
from mxnet_pfc.runtime.run_folder import RunFolder

LAUNCH_ENV = "MXNET_PFC_LAUNCH"     # the supervisor's id of a launch, in every rank's environment


def launch_id() -> "str | None":
    """This process's launch id (None when no supervisor launched it)."""
    return os.environ.get(LAUNCH_ENV) or None


def read(path: str) -> "dict | None":
    """The JSON record at `path`, or None when it is absent or unreadable."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def clear(path: str) -> None:
    """Remove the record at `path` if there is one."""
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


# ------------------------------------------------------------------ the supervisor's side
def request_stop(run: RunFolder, available: int) -> None:
    """Ask the running trainer to stop after its next periodic checkpoint (to relaunch on `available` slots)."""
    with open(run.stop_request, "w") as f:
        f.write(f"{available}\n")


def clear_for_launch(run: RunFolder) -> None:
    """Before a launch: no request or word of an earlier job may be taken for the new one's."""
    for path in (run.stop_request, run.stopped_record, run.busy_record):
        clear(path)


# ------------------------------------------------------------------ the trainer's side (rank 0)
def stop_requested(run: RunFolder) -> bool:
    return os.path.exists(run.stop_request)


def record_stopped(run: RunFolder, step: int, world_size: int) -> None:
    """The run stopped at the checkpoint of `step` on request; the request is done with."""
    write_json(run.stopped_record, {"step": step, "world_size": world_size})
    os.remove(run.stop_request)


def record_finished(run: RunFolder, **fields) -> None:
    """The run's own word that it ended normally, written last. "Finished" is read from it, never inferred
    from an exit status or an absent failure record: a supervisor that adopted a job cannot see the job's
    exit status. A run clears it as it starts."""
    write_json(run.finished_record, {**fields, "launch": launch_id()})


def record_busy(run: RunFolder, message: str) -> None:
    """Rank 0 refused by the output lock: say so to the supervisor that launched it (a refusal is no lost
    rank, and the lock's holder is the job to watch). A run started by hand has no supervisor to tell."""
    if launch_id() is not None and os.path.isdir(run.elastic):
        try:
            write_json(run.busy_record, {"refused": message, "launch": launch_id()})
        except OSError:
            pass
