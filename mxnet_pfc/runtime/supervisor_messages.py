"""What the trainer and the elastic supervisor tell each other, through files in OUTPUT.

The supervisor asks a running trainer to stop at its next periodic checkpoint
(the stop request); the trainer says that it stopped there (the stopped
record), that it ended normally (the finished record), or that the output
lock refused it (the busy record). The supervisor puts a launch id in every
rank's environment and the trainer writes it into its finished and busy
records, so that a supervisor believes only its own job's records, never an
earlier run's or a bystander's. Both sides import this module; the paths are
RunFolder's. See docs/DESIGN.md section 6.5.

A rank also notes the file it is reading whole (reading.py): a rank that
dies reading it (a crash, the out-of-memory killer) leaves the note behind
(died_reading), and a supervisor that sees the same file kill a rank twice
from the same checkpoint stops relaunching: that is the file's doing, not a
lost rank.
"""
from __future__ import annotations

import glob
import logging
import os

from mxnet_pfc.runtime.files import RecordFileError, read_json, read_record_bytes, write_json
from mxnet_pfc.runtime.run_folder import RunFolder

log = logging.getLogger(__name__)

LAUNCH_ENV = "MXNET_PFC_LAUNCH"     # the supervisor's id of a launch, in every rank's environment
# The real path of the output folder a supervisor launched the job for, in the job's environment: a
# supervisor adopts (and may stop) only a process launched for its own folder.
OUTPUT_ENV = "MXNET_PFC_OUTPUT"


def launch_id() -> "str | None":
    """This process's launch id (None when no supervisor launched it)."""
    return os.environ.get(LAUNCH_ENV) or None


def read(path: str) -> "dict | None":
    """The JSON record at `path`, or None when it is absent or unreadable (said in the log: a damaged record
    counts as none)."""
    try:
        value = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, RecordFileError) as error:
        log.warning(f"{error}; taken as no record")
        return None
    if not isinstance(value, dict):
        log.warning(f"{path}: not a record (a JSON object); taken as no record")
        return None
    return value


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
    """Before a launch: no request or word of an earlier job may be taken for the new one's (a job that ends
    before its trainer clears the logs' records would otherwise leave an earlier job's reading notes)."""
    for path in (run.stop_request, run.stopped_record, run.busy_record,
                 *glob.glob(RunFolder(glob.escape(run.root)).reading_record("*"))):
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


# ------------------------------------------------------------------ the supervisor's side, after a job
def died_reading(run: RunFolder, rank: int) -> "str | None":
    """The file rank `rank` of the job that ended was reading when it died (reading.py's note), or None. A
    rank that ended with a word of its own (a failure record: an error, a signal, a lost contact, a stall)
    did not die of it."""
    if os.path.exists(run.failure_record(rank)):
        return None
    try:
        file = read_record_bytes(run.reading_record(rank), 4096).decode("utf-8", "replace").strip()
    except (OSError, RecordFileError):
        return None
    return file or None
