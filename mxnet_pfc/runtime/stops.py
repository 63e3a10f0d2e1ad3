"""Why a rank stops, said truthfully: its own error, another rank's, a lost rank, or an interruption.

horovodrun and mpirun end every rank with SIGTERM both when the user presses
Ctrl-C and when one rank has failed, so a rank cannot tell the two apart from
the signal. What it can see:
- failure records: a rank that stops on an error of its own writes
  OUTPUT/logs/failed-rankR.txt (its message) before it exits; the other ranks
  read them (the output folder is shared, as checkpoints require). A rank
  stopped by a signal or by losing the others records that too, so its exit
  is explained, though it is no failure of its own;
- the processes of the other ranks on its own host (their pids are exchanged at
  start-up): a rank killed without a word (SIGKILL, the out-of-memory killer, a
  crash) is a process that is gone;
- stall records: a rank that made no progress for --stall_timeout (watchdog.py)
  records where it was, stuck outside collectives or waiting in one, and ends.
With none of these, the stop is an interruption (Ctrl-C, or a stop request).

See docs/DESIGN.md section 6.3.
"""
from __future__ import annotations

import atexit
import faulthandler
import glob
import logging
import os
import signal
import socket
import sys
import threading
import traceback
import zlib

import mxnet as mx

from mxnet_pfc.runtime import comm, reading, slurm
from mxnet_pfc.runtime.errors import PfcError, mxnet_reason
from mxnet_pfc.runtime.files import RecordFileError, read_record_bytes
from mxnet_pfc.runtime.logs import ROOT_LOGGER
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.runtime.run_lock import boot_id

log = logging.getLogger(ROOT_LOGGER)

_state = {"run": None, "peers": []}     # this run's output folder; (rank, host, pid) of every rank


def start(run: RunFolder) -> None:
    """Learn where failure records go and which processes the other ranks are (collective: every rank)."""
    _state["run"] = run
    _record_crashes(run)
    reading.note_in(run.reading_record(comm.rank()))
    host = zlib.crc32(f"{socket.gethostname()} {boot_id()}".encode())     # same kernel: pids comparable
    _state["peers"] = [(r, int(h), int(pid)) for r, (h, pid) in enumerate(comm.gather_rows([host, os.getpid()]))]


def _record_crashes(run: RunFolder) -> None:
    """A crash inside MXNet or Horovod (SIGSEGV, SIGABRT, ...) writes every thread's Python stack to
    logs/crash-rankR.txt before MXNet's own handler runs, for this rank's log reader and the other
    ranks' messages (other_rank_cause); the file is removed at a normal exit while still empty."""
    path = run.crash_record(comm.rank())
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
    _state["crash_cleanup"] = remove_if_empty
    atexit.register(remove_if_empty)        # a normal exit; _abort() for comm.abort, which skips atexit


def _abort(code: int) -> None:
    """comm.abort, without leaving this rank's empty crash file behind."""
    cleanup = _state.get("crash_cleanup")
    if cleanup is not None:
        cleanup()
    comm.abort(code)


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


SIGNALLED = "signal: "       # the record of a rank stopped by a signal, not by a failure of its own
LOST_CONTACT = "lost contact: "   # the record of a rank that stopped because it lost the others (a cut link
                                  # ends every rank so): it ended with a word, and the failure is not its own
STALLED = "stalled: "       # a rank that made no progress outside any collective (watchdog.py): the stuck one
WAITED = "waited: "         # a rank that made no progress waiting in a collective (for a stuck rank)
# Records that explain a rank's exit but are no error of the run's own: the elastic supervisor
# relaunches after them (a stall is a lost rank: a hung file system or device, not bad input).
NOT_OWN_FAILURE = (SIGNALLED, LOST_CONTACT, STALLED, WAITED)


def clear_records(run: RunFolder) -> None:
    """Remove the failure records, crash and stack dumps and progress counts of an earlier run in this
    folder (rank 0, before the others start)."""
    for kind in (run.failure_record, run.crash_record, run.stacks_record, run.progress_record, run.reading_record):
        for path in glob.glob(kind("*")):
            os.remove(path)


def record_failure(message: str) -> None:
    """Leave this rank's reason for stopping where the other ranks look for it. A failure of its own
    or a stall, once recorded, stays: a signal or a lost contact that follows it does not replace it."""
    run = _state["run"]
    if run is None:
        return
    if message.startswith((SIGNALLED, LOST_CONTACT)):
        kept = read_records(run, [comm.rank()]).get(comm.rank(), "")
        if kept and not kept.startswith((SIGNALLED, LOST_CONTACT)):
            return
    try:
        with open(run.failure_record(comm.rank()), "w") as f:
            f.write(message + "\n")
    except OSError:            # a full disk may be the very failure; the launcher's output still has it
        pass


def read_records(run: RunFolder, ranks) -> "dict[int, str]":
    """{rank: message} of the failure records of `ranks` in the run's logs."""
    found = {}
    for rank in ranks:
        try:       # a record is a line or two: bounded, and never a FIFO that blocks the reader
            found[rank] = read_record_bytes(run.failure_record(rank), 1 << 16).decode("utf-8", "replace").strip()
        except (OSError, RecordFileError):
            continue
    return found


def first_failure(records: "dict[int, str]") -> "str | None":
    """'rank R failed: MESSAGE' for the lowest rank whose record is a failure of its own (not a
    signal, a lost contact or a stall; an empty record, cut off while written, says nothing), or None."""
    failures = sorted((rank, message) for rank, message in records.items()
                      if message and not message.startswith(NOT_OWN_FAILURE))
    if not failures:
        return None
    rank, message = failures[0]
    return f"rank {rank} failed: {message}"


def _records() -> "dict[int, str]":
    """{rank: message} of the other ranks' records."""
    if _state["run"] is None:          # before start(): no records to read yet
        return {}
    return read_records(_state["run"], (rank for rank in range(comm.size()) if rank != comm.rank()))


def _gone_local_peers(accounted: "set[int]") -> "list[tuple[int, int]]":
    me = next((host for rank, host, _ in _state["peers"] if rank == comm.rank()), None)
    gone = []
    for rank, host, pid in _state["peers"]:
        if host == me and rank != comm.rank() and rank not in accounted and not os.path.exists(f"/proc/{pid}"):
            gone.append((rank, pid))
    return gone


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


def other_rank_cause() -> "str | None":
    """What is known of another rank's failure (a failure or stall record, or a local rank gone), or None."""
    records = _records()
    failure = first_failure(records)
    if failure is not None:
        return failure
    stall = stall_cause(records)
    if stall is not None:
        from mxnet_pfc.runtime import watchdog  # imported late: watchdog.py records through this module
        own = watchdog.own_wait()
        return f"{stall}; {own}" if own else stall
    if _state["run"] is not None:
        # the first dump written: a rank whose peer crashed may crash too, inside MXNet, as it stops
        crashes = []
        for rank in range(comm.size()):
            path = _state["run"].crash_record(rank)
            crash = crash_summary(path) if rank != comm.rank() else None
            if crash:
                crashes.append((os.stat(path).st_mtime_ns, rank, path, crash))
        if crashes:
            _, rank, path, crash = min(crashes)
            return f"rank {rank} crashed: {crash} (every thread's stack: {path})"
    gone = _gone_local_peers(set(records))
    if gone:
        rank, pid = gone[0]
        return (f"rank {rank} (pid {pid}, this host) ended without a message: killed (SIGKILL, the out-of-memory "
                f"killer) or crashed; the launcher's output gives its exit status")
    return None


def _lost_contact_cause() -> "str | None":
    """'rank R lost contact ...' for the lowest other rank that stopped on a lost peer, or None."""
    lost = sorted(rank for rank, message in _records().items() if message.startswith(LOST_CONTACT))
    if not lost:
        return None
    return f"rank {lost[0]} lost contact with the other ranks (a rank or host became unreachable, or ended)"


def explain_signal(signum: int) -> str:
    """The message of a rank that received `signum` from its launcher or the user. A rank that lost
    contact is named here (the launcher ends the others after it), not as a cause in stop_on_error:
    a rank that lost contact itself says so in its own words."""
    name = signal.Signals(signum).name
    cause = other_rank_cause() or _lost_contact_cause()
    if cause is not None:
        return f"stopping: {cause}; the launcher then ended this rank ({name}); resume with --resume latest"
    ending = slurm.job_ending()
    if ending is not None:
        return (f"stopping: {ending}; Slurm sent {name} to every task; submit the job again with "
                f"--resume latest to continue from the last checkpoint")
    job = slurm.job_id()
    if job:         # inside a Slurm job that did not show as ending in time: say it may be Slurm's doing
        return (f"stopping: interrupted ({name}: Ctrl-C, a stop request, or Slurm ending job {job}, which its "
                f"controller did not confirm in {slurm.ENDING_TIMEOUT:g} s); continue with --resume latest "
                f"(from the last checkpoint)")
    return (f"stopping: interrupted ({name}: Ctrl-C, or a stop request to the launcher or this process); "
            f"continue with the same command plus --resume latest (from the last checkpoint)")


def watch_signals() -> None:
    """Say why this rank stops on SIGTERM or SIGINT, even while its main thread waits inside MXNet.

    A Python signal handler runs only when the main thread is back in Python, and it
    may be waiting in MXNet for a collective that never ends. Python's C-level handler
    writes the signal's number to the wakeup fd at once, so a thread of ours reads it,
    logs and exits.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: None)     # keeps the C handler; the thread acts
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def wait() -> None:
        while True:
            signum = os.read(read_fd, 1)[0]
            if signum in (signal.SIGTERM, signal.SIGINT):
                record_failure(SIGNALLED + signal.Signals(signum).name)
                message = explain_signal(signum)
                # straight to stderr, no lock; on a line of its own (rank 0's progress bar may hold one)
                os.write(2, f"\nrank {comm.rank()}: {message}\n".encode())
                log.error(message)
                _abort(128 + signum)

    threading.Thread(target=wait, daemon=True, name="signals").start()


def stop_on_error(error: Exception) -> int:
    """End this rank after `error`, saying what really happened; returns the exit code (1).

    A lost peer is reported with the cause other ranks recorded, if any; the
    project's own errors (PfcError), the system's (OSError, MemoryError), MXNet's
    and Horovod's are one line; anything else is a defect of ours, reported with
    its traceback. A rank of a distributed job exits at once (comm.abort).
    """
    lost = isinstance(error, comm.LostRankError) or comm.lost_peer(error)
    expected = (lost or comm.raised_by_horovod(error)
                or isinstance(error, (PfcError, OSError, MemoryError, mx.base.MXNetError)))
    if not expected:            # the traceback, and every rank told which rank
        record_failure(f"{type(error).__name__}: {error} (an unexpected error: see rank {comm.rank()}'s log)")
        log.exception(f"stopping on an unexpected error: {type(error).__name__}: {error}")
        if not log.handlers:
            traceback.print_exc()
        _abort(1)
    if isinstance(error, mx.base.MXNetError) and not lost:     # MXNet's one line, without its C++ stack
        error = type(error)(mxnet_reason(error))
    if lost:
        contact = str(error) if isinstance(error, comm.LostRankError) else comm.lost_peer_message()
        cause = other_rank_cause()
        record_failure(LOST_CONTACT + contact)      # so that no rank takes this one's exit for a silent death
        ending = None if cause else slurm.job_ending()      # None at once outside a Slurm job
        if ending is not None:      # scancel, a time limit: another task got Slurm's SIGTERM and left first
            cause = f"{ending}; Slurm ended the other tasks first"
        error = comm.LostRankError(f"{cause} ({contact})" if cause else contact)
    elif not isinstance(error, comm.RankFailedError):
        record_failure(f"{type(error).__name__}: {error}")     # for the ranks the launcher ends next
    hint = "; resume with --resume latest" if lost else ""
    log.error(f"stopping: {error}{hint}")
    # on a line of its own: rank 0's progress bar may hold the current one
    print(f"\nrank {comm.rank()}: {type(error).__name__}: {error}{hint}", file=sys.stderr)
    if lost or comm.is_distributed():
        # MXNet's and Horovod's exit handlers would wait on a failed collective, or raise
        # ("Horovod has been shut down") once another rank has stopped
        _abort(1)
    return 1
