"""One run per output folder: OUTPUT/RUNNING.lock names the run that holds the folder.

Two runs writing into one folder would interleave their logs and metrics and
replace each other's checkpoints, so a second run is refused at start-up with
the holder's host, process, start time and command. A killed run cannot
release its lock, so a lock is stale, and is taken over, when its holder is
gone:
- on the same machine (same host name and boot), when its process no longer
  exists (the process's start time is compared too: pids are reused);
- from another host sharing the folder, when the holder has not refreshed the
  file for STALE_SECONDS. The holder touches it every HEARTBEAT_SECONDS; ages
  are measured on the file system's own clock (the modification time of a
  file written just now), so clocks that differ between hosts do not matter.
A lock names the folder it holds (its real path): a lock copied with its
folder (`cp -a A B`) names A, and holds nothing in B. The path is compared on
the holder's own host only, where it means the same folder.

See docs/DESIGN.md section 6.2.
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
import time
from dataclasses import dataclass

from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.files import RecordFileError, read_json

LOCK_NAME = "RUNNING.lock"
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 60.0


def lock_path(folder: str) -> str:
    """The lock file of a held folder: OUTPUT/RUNNING.lock (the trainer's), OUTPUT/elastic/RUNNING.lock (the
    supervisor's)."""
    return os.path.join(folder, LOCK_NAME)


class OutputBusyError(PfcError, RuntimeError):
    """Another run holds the output folder."""


def boot_id() -> str:
    try:
        return open("/proc/sys/kernel/random/boot_id").read().strip()
    except OSError:
        return ""


def process_stat(pid: int) -> "tuple[int, str] | None":
    """(parent pid, start time in clock ticks since boot) of process `pid`, or None when there is none.

    A process that has ended but is not reaped yet (a zombie: an orphan whose new parent, pid 1 of a
    container, may never reap it) is none.
    """
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()      # proc(5) fields 3 on, counted after the name
    if fields[0] in ("Z", "X"):                        # field 3: the state
        return None
    return int(fields[1]), fields[19]                  # fields 4 and 22


def _process_start(pid: int) -> "str | None":
    """The start time of process `pid`, or None when there is no such process."""
    stat = process_stat(pid)
    return None if stat is None else stat[1]


def _filesystem_now(folder: str) -> float:
    """The current time on the clock of the file system holding `folder` (as it stamps files)."""
    probe = os.path.join(folder, f".clock-{socket.gethostname()}-{os.getpid()}")
    with open(probe, "w"):
        pass
    try:
        return os.stat(probe).st_mtime
    finally:
        os.remove(probe)


@dataclass(frozen=True)
class Holder:
    host: str
    boot_id: str
    pid: int
    process_start: str
    started: float
    command: str
    folder: str = ""        # the real path of the folder held ("": a lock of an older version)

    @classmethod
    def this_process(cls, folder: str) -> "Holder":
        spec = getattr(sys.modules["__main__"], "__spec__", None)       # python -m NAME: show NAME
        program = ["python", "-m", spec.name] if spec is not None else sys.argv[:1]
        return cls(socket.gethostname(), boot_id(), os.getpid(), _process_start(os.getpid()) or "",
                   time.time(), shlex.join(program + sys.argv[1:]), os.path.realpath(folder))

    @classmethod
    def from_record(cls, value) -> "Holder | None":
        """The holder a lock file's JSON names, or None when it is not a lock's (a field missing, unknown or
        of the wrong type)."""
        types = dict(host=str, boot_id=str, pid=int, process_start=str, started=(int, float), command=str,
                     folder=str)
        if (not isinstance(value, dict) or not set(types) - {"folder"} <= set(value) <= set(types)
                or not all(isinstance(value[name], types[name]) for name in value)
                or not 0 <= value["started"] < 1e11):          # a time the clock can show
            return None
        return cls(**value)

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on host {self.host}, started {when}, command: {self.command}"

    def gone(self, lock_age: float, folder: str) -> "tuple[bool, str]":
        """(whether the holder is gone, how that was decided) for the lock of `folder`, last refreshed
        `lock_age` s ago. A holder of this host that holds another folder is gone from this one."""
        if self.host == socket.gethostname() and self.boot_id == boot_id():
            if self.folder and self.folder != os.path.realpath(folder):
                return True, f"it holds another folder, {self.folder} (this lock was copied from there)"
            alive = _process_start(self.pid) == self.process_start
            return not alive, f"its process {self.pid} on this host {'is running' if alive else 'has ended'}"
        if lock_age > STALE_SECONDS:
            return True, f"it has not been refreshed for {lock_age:.0f} s (more than {STALE_SECONDS:.0f} s)"
        return False, f"it was refreshed {lock_age:.0f} s ago by host {self.host}"


def _read(path: str) -> "tuple[Holder | None, float, str]":
    """(holder, modification time, what is wrong with it) of the lock at `path`; holder None while it is
    being written, or when it is damaged."""
    mtime = os.stat(path).st_mtime
    try:
        value = read_json(path)
    except RecordFileError as error:
        return None, mtime, str(error)
    holder = Holder.from_record(value)
    return holder, mtime, "" if holder else f"{path}: not a lock (its fields are not a holder's)"


class OutputLock:
    """The lock of one output folder, held by this process until release()."""

    def __init__(self, folder: str, took_over: str = ""):
        self.path = lock_path(folder)
        self.took_over = took_over        # what a stale lock said, when one was replaced
        self._stop = threading.Event()
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="output-lock")
        self._heartbeat.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                os.utime(self.path)
            except OSError:         # the folder is gone or unwritable: nothing a heartbeat can do
                pass

    def release(self) -> None:
        self._stop.set()
        try:
            os.remove(self.path)
        except OSError:
            pass


def holder_active(folder: str) -> bool:
    """Whether a run that is not gone holds `folder` (acquire would refuse it now)."""
    path = lock_path(folder)
    try:
        holder, mtime, _ = _read(path)
    except FileNotFoundError:
        return False
    age = _filesystem_now(folder) - mtime
    return age <= STALE_SECONDS if holder is None else not holder.gone(age, folder)[0]


def live_holder(folder: str) -> "Holder | None":
    """The run that holds `folder` and is not gone, or None (also while a lock is being written)."""
    try:
        holder, mtime, _ = _read(lock_path(folder))
    except FileNotFoundError:
        return None
    if holder is None or holder.gone(_filesystem_now(folder) - mtime, folder)[0]:
        return None
    return holder


def acquire(folder: str) -> OutputLock:
    """Hold `folder` for this run, or raise OutputBusyError naming the run that holds it."""
    os.makedirs(folder, exist_ok=True)
    path = lock_path(folder)
    mine = Holder.this_process(folder)
    took_over = ""
    for _ in range(5):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder, mtime, damage = _read(path)
            except FileNotFoundError:      # released meanwhile
                continue
            age = _filesystem_now(folder) - mtime
            if holder is None:             # being written by a run starting now, or a crash mid-write
                if age <= STALE_SECONDS:
                    raise OutputBusyError(f"{folder} is being taken by another run that is starting now, or its "
                                          f"lock is damaged ({damage}); choose another --output, or remove "
                                          f"the lock if no run is starting") from None
                gone, why = True, f"it is empty or damaged and {age:.0f} s old ({damage})"
            else:
                gone, why = holder.gone(age, folder)
            if not gone:
                raise OutputBusyError(
                    f"{folder} is in use by another run ({holder.describe()}); {why}. Two runs in one folder "
                    f"would replace each other's checkpoints: wait for it to end or stop it, or choose another "
                    f"--output") from None
            took_over = f"{holder.describe() if holder else path}: {why}"
            _remove_if_unchanged(path, mtime)
            continue
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(mine.__dict__, f)
        except OSError:          # a full disk: leave no empty lock behind
            os.remove(path)
            raise
        return OutputLock(folder, took_over)
    raise OutputBusyError(f"{folder}: could not take {path}: other runs keep taking and releasing it")


def _remove_if_unchanged(path: str, mtime: float) -> None:
    """Remove a stale lock, unless another run replaced it since it was read (then leave theirs)."""
    aside = f"{path}.stale-{socket.gethostname()}-{os.getpid()}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if os.stat(aside).st_mtime != mtime:          # a fresh lock was moved aside: put it back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
    os.remove(aside)
