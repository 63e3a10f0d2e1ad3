"""Why a rank stops, said truthfully: its own error, another rank's, a lost rank, or an interruption.

horovodrun and mpirun end every rank with SIGTERM both when the user presses
Ctrl-C and when one rank has failed, so a rank cannot tell the two apart from
the signal. What it can see:
- failure records (failure_records.py): a rank that stops on an error of its
  own writes OUTPUT/logs/failed-rankR.txt (its message) before it exits; the other ranks
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

import logging
import os
import signal
import socket
import sys
import threading
import traceback
import zlib

import mxnet as mx

from mxnet_pfc.runtime import comm, failure_records, reading, slurm, watchdog
from mxnet_pfc.runtime.errors import PfcError, mxnet_reason
from mxnet_pfc.runtime.failure_records import LOST_CONTACT, SIGNALLED, abort
from mxnet_pfc.runtime.logs import ROOT_LOGGER
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.runtime.run_lock import boot_id

log = logging.getLogger(ROOT_LOGGER)

_state = {"run": None, "peers": []}     # this run's output folder; (rank, host, pid) of every rank


def start(run: RunFolder) -> None:
    """Learn where failure records go and which processes the other ranks are (collective: every rank)."""
    _state["run"] = run
    failure_records.capture_crashes(run, comm.rank())
    reading.note_in(run.reading_record(comm.rank()))
    host = zlib.crc32(f"{socket.gethostname()} {boot_id()}".encode())     # same kernel: pids comparable
    _state["peers"] = [(r, int(h), int(pid)) for r, (h, pid) in enumerate(comm.gather_rows([host, os.getpid()]))]


def record_failure(message: str) -> None:
    """This rank's failure record (failure_records.write), once start() has named the run's folder."""
    if _state["run"] is not None:
        failure_records.write(_state["run"], comm.rank(), message)


def _records() -> "dict[int, str]":
    """{rank: message} of the other ranks' records."""
    if _state["run"] is None:          # before start(): no records to read yet
        return {}
    return failure_records.read(_state["run"], (rank for rank in range(comm.size()) if rank != comm.rank()))


def _gone_local_peers(accounted: "set[int]") -> "list[tuple[int, int]]":
    me = next((host for rank, host, _ in _state["peers"] if rank == comm.rank()), None)
    gone = []
    for rank, host, pid in _state["peers"]:
        if host == me and rank != comm.rank() and rank not in accounted and not os.path.exists(f"/proc/{pid}"):
            gone.append((rank, pid))
    return gone


def other_rank_cause() -> "str | None":
    """What is known of another rank's failure (a failure or stall record, or a local rank gone), or None."""
    records = _records()
    failure = failure_records.first_failure(records)
    if failure is not None:
        return failure
    stall = failure_records.stall_cause(records)
    if stall is not None:
        own = watchdog.own_wait()
        return f"{stall}; {own}" if own else stall
    if _state["run"] is not None:
        # the first dump written: a rank whose peer crashed may crash too, inside MXNet, as it stops
        crashes = []
        for rank in range(comm.size()):
            path = _state["run"].crash_record(rank)
            crash = failure_records.crash_summary(path) if rank != comm.rank() else None
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
                abort(128 + signum)

    threading.Thread(target=wait, daemon=True, name="signals").start()


def stop_on_error(error: Exception) -> int:
    """End this rank after `error`, saying what really happened; returns the exit code (1).

    A lost peer is reported with the cause other ranks recorded, if any; the
    project's own errors (PfcError), the system's (OSError, MemoryError), MXNet's
    and Horovod's are one line; anything else is a defect of ours, reported with
    its traceback. A rank of a distributed job exits at once (failure_records.abort).
    """
    lost = isinstance(error, comm.LostRankError) or comm.lost_peer(error)
    expected = (lost or comm.raised_by_horovod(error)
                or isinstance(error, (PfcError, OSError, MemoryError, mx.base.MXNetError)))
    if not expected:            # the traceback, and every rank told which rank
        record_failure(f"{type(error).__name__}: {error} (an unexpected error: see rank {comm.rank()}'s log)")
        log.exception(f"stopping on an unexpected error: {type(error).__name__}: {error}")
        if not log.handlers:
            traceback.print_exc()
        abort(1)
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
        abort(1)
    return 1
