"""Each rank's progress watchdog: a rank stuck outside collectives never hangs the job.

Horovod's stall check acts only under MPI. Under Gloo (horovodrun, config.sh,
the elastic supervisor) a rank blocked outside collectives (a hung read, a
deadlock) leaves the others waiting in their next collective forever, and a
thread blocked in Gloo cannot be interrupted from Python. So a daemon thread
of each rank watches that rank's progress:
- progress is a training step done (`progress`), a collective entered (comm.py
  notes each), and, inside `working` sections (setup, verification,
  checkpoints: long, but live), the main thread moving: its stack or its CPU
  time changed since the last look;
- a rank waiting in a collective while another rank makes progress (rank 0
  verifying) waits for a live peer, which is no stall: each rank writes its
  progress count to OUTPUT/logs/progress-rankR.txt at most every timeout/8 s,
  and a waiting rank reads the others';
- no progress for timeout/4 s: a warning saying where the rank is;
- for the whole --stall_timeout: every thread's stack to
  OUTPUT/logs/stacks-rankR.txt, a record (failure_records.STALLED: stuck outside
  any collective, or WAITED: waiting in one), and the rank ends (failure_records.abort).
  A stuck rank ends at once; the launcher then ends the others, whose messages
  name it and where it was (stops.other_rank_cause). A rank waiting in a
  collective gives the stuck rank timeout/4 s more to end first.
The elastic supervisor takes a stall for a lost rank and relaunches
(failure_records.NOT_OWN_FAILURE). See docs/DESIGN.md section 6.6.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
import time
import traceback
from contextlib import contextmanager

from mxnet_pfc.runtime import comm, failure_records
from mxnet_pfc.runtime.failure_records import STALLED, WAITED
from mxnet_pfc.runtime.logs import ROOT_LOGGER
from mxnet_pfc.runtime.run_folder import RunFolder

log = logging.getLogger(ROOT_LOGGER)

OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep     # the package
COMM = os.path.join(OURS, "runtime", "comm.py")        # where a collective waits: the caller says more
# the libraries a main thread waits inside while a collective is under way
LIBRARIES = tuple(os.path.dirname(spec.origin) + os.sep for spec in map(importlib.util.find_spec, ("mxnet", "horovod"))
                  if spec is not None and spec.origin)

# timeout: --stall_timeout (0: not started); marked: the last progress marked by the code (a step, a
# working section's start or end); live: the last sign of life (marked, or the main thread moving in a
# working section); working: what the running working section does, or None
_state = {"timeout": 0.0, "marked": 0.0, "live": 0.0, "working": None}


def start(run: RunFolder, timeout: float) -> None:
    """Watch this rank from now on (after stops.start: records go to its logs folder); timeout 0: off."""
    if timeout <= 0:
        return
    now = time.monotonic()
    _state.update(timeout=timeout, marked=now, live=now)
    watch = _Watch(run, timeout)
    threading.Thread(target=watch.run, daemon=True, name="watchdog").start()


def progress() -> None:
    """A unit of the run's work is done (a training step)."""
    _state["marked"] = _state["live"] = time.monotonic()


@contextmanager
def working(what: str):
    """Long work that marks no steps (setup, verification, a checkpoint): live while the main thread moves,
    so a long verification never trips the watchdog and a hung read inside one still does."""
    before = _state["working"]
    progress()
    _state["working"] = what
    try:
        yield
    finally:
        _state["working"] = before
        progress()


def own_wait() -> "str | None":
    """'rank R waited for it in collective 'X' for N s' when this rank entered a collective after its last
    progress, for the message of a rank that stops on another's stall; else None."""
    name, entered = comm.last_collective()
    if not _state["timeout"] or name is None or entered < _state["marked"]:
        return None
    return f"rank {comm.rank()} waited for it in collective '{name}' for {time.monotonic() - entered:.0f} s"


def _frames(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


def _describe(frame) -> str:
    return f"{frame.f_code.co_qualname} ({os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno})"


def where(frame) -> str:
    """'FUNCTION (FILE:LINE)' of the innermost frame, and the innermost of this package's when that is
    another's or comm.py ('read (folders.py:88)', 'sleep_a_while (x.py:3), called from Trainer.run
    (trainer.py:250)')."""
    if frame is None:
        return "an unknown place (the main thread has ended)"
    text = _describe(frame)
    if not frame.f_code.co_filename.startswith(OURS) or frame.f_code.co_filename == COMM:
        ours = next((f for f in _frames(frame)
                     if f.f_code.co_filename.startswith(OURS) and f.f_code.co_filename != COMM), None)
        if ours is not None:
            text += f", called from {_describe(ours)}"
    return text


def _stacks() -> str:
    """Every thread's Python stack, innermost call last."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    return "\n".join(f"Thread {names.get(ident, ident)} (most recent call last):\n"
                     + "".join(traceback.format_stack(frame))
                     for ident, frame in sys._current_frames().items())


def _thread_cpu_ticks(native_id: int) -> "int | None":
    """User + system CPU time of one thread of this process, in clock ticks (/proc)."""
    try:
        fields = open(f"/proc/self/task/{native_id}/stat").read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])


class _Watch:
    """The watchdog thread's own bookkeeping."""

    def __init__(self, run: RunFolder, timeout: float):
        self.run_folder, self.timeout = run, timeout
        self.warn_after, self.beat_every, self.tick = timeout / 4, timeout / 8, min(5.0, timeout / 40)
        self.rank, self.world = comm.rank(), comm.size()
        self.main = threading.main_thread()
        self.seen_main = None           # (stack, CPU time) of the main thread at the last look, in working sections
        self.beats, self.beat_at, self.beat_live = 0, float("-inf"), float("-inf")
        self.peers: "dict[int, tuple[str, float]]" = {}     # rank: (its progress count, when seen to change)
        self.warned = self.recorded = False

    def run(self) -> None:
        try:
            while True:
                time.sleep(self.tick)
                self.look()
        except Exception as error:      # a defect of ours: say so, and leave the run unwatched
            log.exception(f"the progress watchdog stopped: {type(error).__name__}: {error}")

    def look(self) -> None:
        now = time.monotonic()
        frame = sys._current_frames().get(self.main.ident)
        if _state["working"] is not None:
            seen = (tuple((f.f_code, f.f_lineno) for f in _frames(frame)), _thread_cpu_ticks(self.main.native_id))
            if seen != self.seen_main:
                _state["live"] = now
            self.seen_main = seen
        else:
            self.seen_main = None
        name, entered = comm.last_collective()
        live = max(_state["live"], entered)
        self.beat(now, live)
        waiting = (name if name is not None and entered >= _state["marked"] and frame is not None
                   and frame.f_code.co_filename.startswith(LIBRARIES) else None)
        if waiting is not None and now - live >= 2 * self.tick:
            live = max(live, self.peers_live(now))
        idle = now - live
        if idle < self.warn_after:
            if self.warned:
                log.info("progress again: the stall above is over")
                self.warned = False
            if self.recorded:       # waited past the timeout, then the others went on: no stall to report
                self.recorded = False
                path = self.run_folder.failure_record(self.rank)
                if failure_records.read(self.run_folder, [self.rank]).get(self.rank, "").startswith(WAITED):
                    os.remove(path)
            return
        place = f"waiting in collective '{waiting}' at {where(frame)}" if waiting else f"in {where(frame)}"
        if not self.warned:
            self.warned = True
            log.warning(f"no progress for {idle:.0f} s, {place}; this rank stops the job after "
                        f"{self.timeout:g} s without progress (--stall_timeout)")
        if idle < self.timeout:
            return
        if waiting is None:         # the stuck rank: it ends now, and the launcher ends the others
            self.stop(STALLED + f"made no progress for {idle:.0f} s, stuck in {where(frame)}, outside any "
                                      f"collective (every thread's stack: {self.dump_stacks(idle, place)})")
            return
        if not self.recorded:
            self.recorded = True
            failure_records.write(self.run_folder, self.rank,
                                  WAITED + f"in collective '{waiting}' for {idle:.0f} s, at {where(frame)} "
                                  f"(every thread's stack: {self.dump_stacks(idle, place)})")
        others = failure_records.read(self.run_folder, (r for r in range(self.world) if r != self.rank))
        if any(message.startswith(STALLED) for message in others.values()) \
                or idle >= self.timeout + self.warn_after:
            self.stop(None)

    def beat(self, now: float, live: float) -> None:
        """Write this rank's progress count when it made progress, at most every timeout/8 s."""
        if live <= self.beat_live or now - self.beat_at < self.beat_every:
            return
        self.beats, self.beat_at, self.beat_live = self.beats + 1, now, live
        path = self.run_folder.progress_record(self.rank)
        try:
            with open(path + ".tmp", "w") as f:
                f.write(f"{self.beats}\n")
            os.replace(path + ".tmp", path)
        except OSError:         # a full disk: the waiting ranks then see no progress of this one
            pass

    def peers_live(self, now: float) -> float:
        """When this rank last saw another rank's progress count change (0.0: never)."""
        for rank in range(self.world):
            if rank == self.rank:
                continue
            try:
                count = open(self.run_folder.progress_record(rank)).read().strip()
            except OSError:
                continue
            before = self.peers.get(rank)
            if count and (before is None or before[0] != count):
                self.peers[rank] = (count, now if before is not None else 0.0)     # the first read: a baseline
        return max((seen for _, seen in self.peers.values()), default=0.0)

    def dump_stacks(self, idle: float, place: str) -> str:
        """Every thread's stack to OUTPUT/logs/stacks-rankR.txt (to this rank's log if that fails); its path."""
        path = self.run_folder.stacks_record(self.rank)
        text = f"rank {self.rank}: no progress for {idle:.0f} s, {place}\n\n{_stacks()}"
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as error:
            log.error(f"{path}: {error}; every thread's stack:\n{text}")
        return path

    def stop(self, record: "str | None") -> None:
        """Record (unless done), say why on stderr and in the log, and end this rank."""
        if record is not None:
            failure_records.write(self.run_folder, self.rank, record)
        records = failure_records.read(self.run_folder, range(self.world))
        cause = failure_records.stall_cause(records) or f"rank {self.rank} made no progress for {self.timeout:g} s"
        message = f"stopping: {cause}; resume with --resume latest"
        os.write(2, f"\nrank {self.rank}: {message}\n".encode())    # on a line of its own (a progress bar)
        log.error(message)
        failure_records.abort(1)
