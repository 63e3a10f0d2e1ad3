"""The records a rank leaves in OUTPUT/logs when it stops, read by the other ranks and the supervisor.

A rank that stops writes logs/failed-rankR.txt: its own error's message, or
one of the prefixes below for a stop that is not its own failure (a signal, a
lost peer, a stall). A crash inside MXNet or Horovod leaves every thread's
Python stack in logs/crash-rankR.txt (faulthandler). Plain files and no MXNet:
the supervisor reads them from outside the job. What each rank does with them
is stops.py's and watchdog.py's; docs/DESIGN.md section 6.3.
"""
from __future__ import annotations

import atexit
import faulthandler
import glob
import logging
import os
import sys

from mxnet_pfc.runtime.files import RecordFileError, read_record_bytes
from mxnet_pfc.runtime.run_folder import RunFolder

SIGNALLED = "signal: "       # the record of a rank stopped by a signal, not by a failure of its own
LOST_CONTACT = "lost contact: "   # the record of a rank that stopped because it lost the others (a cut link
                                  # ends every rank so): it ended with a word, and the failure is not its own
STALLED = "stalled: "       # a rank that made no progress outside any collective (watchdog.py): the stuck one
WAITED = "waited: "         # a rank that made no progress waiting in a collective (for a stuck rank)
# Records that explain a rank's exit but are no error of the run's own: the elastic supervisor
# relaunches after them (a stall is a lost rank: a hung file system or device, not bad input).
NOT_OWN_FAILURE = (SIGNALLED, LOST_CONTACT, STALLED, WAITED)
RECORD_BYTES = 1 << 16      # a record is a line or two

_crash_file = {"cleanup": None}     # this process's crash record, removed at exit while empty


def write(run: RunFolder, rank: int, message: str) -> None:
    """Leave rank `rank`'s reason for stopping where the other ranks look for it. A failure of its own
    or a stall, once recorded, stays: a signal or a lost contact that follows it does not replace it."""
    if message.startswith((SIGNALLED, LOST_CONTACT)):
        kept = read(run, [rank]).get(rank, "")
        if kept and not kept.startswith((SIGNALLED, LOST_CONTACT)):
            return
    try:
        with open(run.failure_record(rank), "w") as f:
            f.write(message + "\n")
    except OSError:            # a full disk may be the very failure; the launcher's output still has it
        pass


def read(run: RunFolder, ranks) -> "dict[int, str]":
    """{rank: message} of the failure records of `ranks` in the run's logs."""
    found = {}
    for rank in ranks:
        try:       # bounded, and never a FIFO that blocks the reader
            found[rank] = read_record_bytes(run.failure_record(rank), RECORD_BYTES).decode("utf-8", "replace").strip()
        except (OSError, RecordFileError):
            continue
    return found


def clear(run: RunFolder) -> None:
    """Remove the failure records, crash and stack dumps and progress counts of an earlier run in this
    folder (rank 0, before the others start)."""
    for kind in (run.failure_record, run.crash_record, run.stacks_record, run.progress_record, run.reading_record):
        for path in glob.glob(kind("*")):
            os.remove(path)


def first_failure(records: "dict[int, str]") -> "str | None":
    """'rank R failed: MESSAGE' for the lowest rank whose record is a failure of its own (not a
    signal, a lost contact or a stall; an empty record, cut off while written, says nothing), or None."""
    failures = sorted((rank, message) for rank, message in records.items()
                      if message and not message.startswith(NOT_OWN_FAILURE))
    if not failures:
        return None
    rank, message = failures[0]
    return f"rank {rank} failed: {message}"


def stall_cause(records: "dict[int, str]") -> "str | None":
    """'rank R made no progress for N s, stuck in F (FILE:LINE), outside any collective ...' for the lowest
    rank stuck outside collectives, then what each rank waiting in a collective recorded; None without
    stall records."""
    stuck = sorted((rank, message[len(STALLED):]) for rank, message in records.items()
                   if message.startswith(STALLED))
    waited = sorted((rank, message[len(WAITED):]) for rank, message in records.items()
                    if message.startswith(WAITED))
    if not stuck and not waited:
        return None
    parts = [f"rank {rank} {text}" for rank, text in stuck[:1]]
    parts += [f"rank {rank} waited{' for it' if stuck else ''} {text}" for rank, text in waited]
    if not stuck:
        parts.append("no rank stuck outside collectives left a record (one may be frozen, or stuck where "
                     "Python cannot run: see the launcher's output and the stack dumps in OUTPUT/logs)")
    return "; ".join(parts)


def capture_crashes(run: RunFolder, rank: int) -> None:
    """A crash inside MXNet or Horovod (SIGSEGV, SIGABRT, ...) writes every thread's Python stack to
    logs/crash-rankR.txt before MXNet's own handler runs, for this rank's log reader and the other
    ranks' messages; the file is removed at a normal exit (or abort) while still empty."""
    path = run.crash_record(rank)
    try:
        crash_file = open(path, "w")
    except OSError:
        faulthandler.enable(all_threads=True)        # stderr, then
        return
    faulthandler.enable(file=crash_file, all_threads=True)

    def remove_if_empty():
        faulthandler.disable()
        crash_file.close()
        if os.path.exists(path) and os.path.getsize(path) == 0:
            os.remove(path)
    _crash_file["cleanup"] = remove_if_empty
    atexit.register(remove_if_empty)        # a normal exit; abort() skips atexit and calls it itself


def crash_summary(path: str) -> "str | None":
    """'Segmentation fault in FILE, line N in FUNCTION' from a faulthandler dump; None if empty."""
    try:       # every thread's stack: some KB (bounded, and never a FIFO that blocks the reader)
        lines = read_record_bytes(path).decode("utf-8", "replace").splitlines()
    except (OSError, RecordFileError):
        return None
    fatal = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Fatal Python error:")), None)
    if fatal is None:
        return None
    current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
    frame = lines[current + 1].strip() if current is not None and current + 1 < len(lines) else ""
    where = f" in {frame}" if frame.startswith("File") else " outside Python code"
    return f"{fatal}{where}"


def abort(code: int) -> None:
    """Exit now, without MXNet's and Horovod's exit handlers, leaving no empty crash record behind.

    After a failed collective those handlers wait for operations that can never
    complete (or raise again), so a clean exit could hang instead of ending the job.
    """
    cleanup = _crash_file["cleanup"]
    if cleanup is not None:
        cleanup()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
