"""The elastic supervisor: relaunches the trainer on the hosts that remain, grows back when they return.

The command is `python -m mxnet_pfc.elastic` (mxnet_pfc/elastic.py: its options and what it does);
this module is its machinery: host discovery, launching and adopting a job (horovodrun in a session of
its own), the stop-at-checkpoint request, the timeline, and what to do when a job ends (decide: a pure
function of what is known of the end, tested as a table). See docs/DESIGN.md section 6.5.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from functools import cached_property

from mxnet_pfc.runtime import checkpoints, failure_records, slurm, supervisor_messages
from mxnet_pfc.runtime.errors import quoted
from mxnet_pfc.runtime.run_folder import RunFolder

log = logging.getLogger("mxnet_pfc.elastic")

EXIT_GAVE_UP = 3            # this command's status when it stops relaunching


# ------------------------------------------------------------------ hosts
@dataclass(frozen=True)
class Hosts:
    """Discovered hosts and their slots, in the order the script listed them."""
    slots: "tuple[tuple[str, int], ...]"

    @property
    def total(self) -> int:
        return sum(n for _, n in self.slots)

    def assign(self, max_np: int) -> "tuple[tuple[str, int], ...]":
        """The hosts and slots of a job of at most max_np ranks, filling hosts in listed order."""
        taken, left = [], max_np
        for host, n in self.slots:
            if left <= 0:
                break
            taken.append((host, min(n, left)))
            left -= min(n, left)
        return tuple(taken)


def parse_hosts(text: str, default_slots: int) -> Hosts:
    """`host:slots` or `host` lines; blank lines and # comments are skipped; a host with 0 slots is listed
    as not usable. Raises ValueError, also for more slots on a host, or more hosts, than Slurm allows
    (slurm.MAX_TASKS_PER_NODE, slurm.MAX_NODES): a damaged line, which would be passed on as -np."""
    slots = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, count = line.partition(":")
        try:
            n = int(count) if count else default_slots
        except ValueError:
            raise ValueError(f"line {number}: {quoted(line)} is not host:slots") from None
        if not host or n < 0:
            raise ValueError(f"line {number}: {quoted(line)} is not host:slots")
        if n > slurm.MAX_TASKS_PER_NODE:
            raise ValueError(f"line {number}: {quoted(line)}: {n:,} slots on a host, more than the "
                             f"{slurm.MAX_TASKS_PER_NODE:,} any host runs")
        slots[host] = n                       # a host listed twice: its last line counts
        if len(slots) > slurm.MAX_NODES:
            raise ValueError(f"line {number}: more than {slurm.MAX_NODES:,} hosts, which no allocation has")
    return Hosts(tuple((h, n) for h, n in slots.items() if n > 0))


def discover(script: str, default_slots: int, timeout: float = 60.0) -> Hosts:
    """Run the discovery script; raises RuntimeError naming what went wrong."""
    try:
        proc = subprocess.run(script, shell=True, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the host discovery script {script!r} did not finish in {timeout:g} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the host discovery script {script!r} exited with status {proc.returncode}: "
                           f"{proc.stderr.strip()[-500:]}")
    try:
        return parse_hosts(proc.stdout, default_slots)
    except ValueError as error:
        raise RuntimeError(f"the host discovery script {script!r} printed {error}") from None


# ------------------------------------------------------------------ the job
def _processes() -> "dict[int, tuple[int, str]]":
    """{pid: (parent pid, start time)} of every process of this host."""
    from mxnet_pfc.runtime.run_lock import process_stat
    table = {}
    for entry in os.listdir("/proc"):
        stat = process_stat(int(entry)) if entry.isdigit() else None
        if stat is not None:
            table[int(entry)] = stat
    return table


def launch_problem(pid: int, launch: str, output: str) -> "str | None":
    """Why process `pid` is not the job a supervisor launched as `launch` for the output folder `output` (a
    real path), or None when it is: its environment says (job.json may have been copied with its folder,
    or edited to name another process, which a supervisor would then stop as its job)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError as error:
        return f"its environment cannot be read ({error.strerror})"
    env = dict(item.partition(b"=")[::2] for item in environ if item)
    if env.get(supervisor_messages.LAUNCH_ENV.encode()) != launch.encode():
        return "it was not started with the launch id job.json records"
    trains = env.get(supervisor_messages.OUTPUT_ENV.encode())
    if trains is None:
        return "its environment names no output folder (not launched for this one, or by an older version)"
    if trains != output.encode():
        return f"it was launched for another output folder, {quoted(trains.decode(errors='replace'))}"
    return None


def _alive(pid: int, started: str) -> bool:
    """Whether process `pid` still runs and is the one that started at `started` (pids are reused)."""
    from mxnet_pfc.runtime.run_lock import process_stat
    stat = process_stat(pid)
    return stat is not None and stat[1] == started


class Job:
    """One horovodrun launch of the trainer, in a session of its own: launched by this supervisor, or
    adopted from one that is gone (then it is not our child: its exit status cannot be known, and its
    end is read from its records).

    horovodrun starts each local rank in a session of its own, and a rank whose
    launcher died is handed to init, so the job's processes cannot be found from
    horovodrun's pid at the end: `track` notes them (pid and start time) while
    the job runs, and `stop` kills whichever of them are still there.
    """

    def __init__(self, pid: int, started: str, proc: "subprocess.Popen | None" = None):
        self.pid, self.started, self.proc = pid, started, proc
        self.known: "dict[int, str]" = {}
        self.track()

    @classmethod
    def launch(cls, command: "list[str]", launch: str, output: str) -> "Job":
        """Start `command` as the launch `launch` for the output folder `output` (a real path), both in its
        environment (launch_problem)."""
        # the job's output on this command's own (each rank also logs to OUTPUT/logs/rankR.log)
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, supervisor_messages.LAUNCH_ENV: launch,
                                     supervisor_messages.OUTPUT_ENV: output})
        from mxnet_pfc.runtime.run_lock import process_stat
        stat = process_stat(proc.pid)
        return cls(proc.pid, stat[1] if stat else "", proc)

    def track(self) -> None:
        """Note every process now below horovodrun."""
        table = _processes()
        if self.pid not in table or table[self.pid][1] != self.started:
            return
        children = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [self.pid]
        while todo:
            pid = todo.pop()
            if pid in table:
                self.known.setdefault(pid, table[pid][1])
            todo.extend(children.get(pid, []))

    def running(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return _alive(self.pid, self.started)

    def stop(self, signum: int = signal.SIGTERM, grace: float = 30.0) -> "int | None":
        """Pass `signum` to horovodrun (it ends its ranks), then kill whatever is left after `grace` s.
        Returns horovodrun's exit status (None for an adopted job)."""
        if self.running():
            self.track()
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass
            deadline = time.time() + grace
            while self.running() and time.time() < deadline:
                time.sleep(0.1)
        table = _processes()
        for pid, started in self.known.items():
            if pid in table and table[pid][1] == started:        # the same process, not a reused pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        return self.proc.wait() if self.proc is not None else None


class HeldOutput:
    """A run of the output folder that no supervisor of this host launched (started by hand, or from
    another host): watched through its output lock only, and never stopped by us."""

    def __init__(self, output: str, holder):
        self.output, self.holder = output, holder

    def track(self) -> None:
        pass

    def running(self) -> bool:
        from mxnet_pfc.runtime import run_lock
        return run_lock.live_holder(self.output) == self.holder

    def stop(self, signum: int = signal.SIGTERM, grace: float = 0.0) -> None:
        return None


def wait_for_lock(output: str, timeout: float) -> None:
    """Until the output folder's run lock is free or its holder gone, at most `timeout` s: after a lost
    rank, the job's rank 0 on a lost host holds it until it has not been refreshed for
    run_lock.STALE_SECONDS (a launch refused meanwhile says so, and its holder is then adopted)."""
    from mxnet_pfc.runtime import run_lock
    deadline = time.time() + timeout
    while time.time() < deadline and run_lock.holder_active(output):
        time.sleep(1.0)


# ------------------------------------------------------------------ what to do next
@dataclass(frozen=True)
class Exit:
    """End the supervisor with `status`, after saying `say` on the timeline."""
    status: int
    say: str


@dataclass(frozen=True)
class Launch:
    """Launch the job (again), for `reason` (the timeline's `launch (REASON)`). A restart spends one of
    --max-restarts and waits for the output lock first; it remembers `death_reading` for the next end."""
    reason: str
    restart: bool = False
    death_reading: "tuple[str, str] | None" = None      # (file, starting checkpoint): see Supervisor


@dataclass(frozen=True)
class Adopt:
    """Say `say`, then watch the run that holds the output; launch for `reason` if it has already ended."""
    say: str
    reason: str


def decide_start(finished: "dict | None", finished_path: str, length: list, adopted: bool,
                 start_over: bool) -> "Exit | Launch":
    """Before the first launch: a finished run (its record `finished`, at `finished_path`) asked to train as
    long as `length` (max_update, num_epoch) is not launched again, unless a job was adopted or the run
    starts over."""
    if adopted or start_over or finished is None:
        return Launch("start")
    if finished.get("length") == length:
        return Exit(0, f"finished (the run's record {finished_path}): nothing to launch")
    return Launch(f"the finished run asked to train to --max_update/--num_epoch {length}, "
                  f"not {finished.get('length')}")


def decide(end, restarts: int, max_restarts: int, last_death_reading: "tuple[str, str] | None") \
        -> "Exit | Launch | Adopt":
    """What to do once a job has ended, from what is known of its end (`end`: JobEnd's attributes, read in
    this order and only as far as the decision needs them), the restarts spent and the last job's death
    reading a file. A failure of the run's own is not relaunched; a lost rank or host is, --max-restarts
    times; the same file killing a rank twice from the same checkpoint is the file's doing."""
    if end.interrupted is not None:
        left = " (not ours to stop: left running)" if end.left_running else ""
        why = f"{end.slurm_ending}: " if end.slurm_ending else ""   # scancel, a time limit: say so
        return Exit(128 + end.interrupted,
                    f"{why}interrupted ({signal.Signals(end.interrupted).name}): job stopped{left}")
    status = "exit status unknown: adopted" if end.code is None else f"exit {end.code}"
    if end.stopped:
        return Launch(f"grow: stopped at {end.held} to take more ranks")
    if end.finished:
        return Exit(0, "finished")
    if end.busy is not None:
        return Adopt(f"the job was refused by the output lock ({end.busy.get('refused')}): not a lost rank; "
                     f"watching the run that holds it", "the run that held the output has ended")
    failure = end.failure
    if failure is not None or end.code == 2:
        return Exit(1 if end.code is None else end.code,
                    f"failed on an error of its own ({status}): {failure or 'a configuration error'}; "
                    f"not relaunched")
    died = end.died
    death_reading = (died[1], end.held) if died is not None else None
    if died is not None and last_death_reading == death_reading:
        rank, file, how = died
        start = death_reading[1]
        return Exit(end.code or 1,
                    f"failed again on the same file ({status}): rank {rank} died reading {file} ({how}), twice, "
                    f"both times from {'the start' if start == '-' else 'checkpoint ' + start}: the file causes "
                    f"it, not a lost rank; not relaunched (replace or remove the file)")
    if restarts >= max_restarts:
        return Exit(EXIT_GAVE_UP, f"gave up: the job ended ({status}) without finishing and --max-restarts "
                                  f"{max_restarts} relaunches are spent")
    reason = f"restart {restarts + 1}/{max_restarts}: the job lost a rank or host ({status})"
    if died is not None:
        reason += f"; rank {died[0]} died reading {died[1]} ({died[2]})"
    return Launch(reason, restart=True, death_reading=death_reading)


class JobEnd:
    """What decide() knows of a job that has ended. Each record is read from OUTPUT when decide first asks
    for it, as the loop did before decide existed: a damaged record is said in the log as it is read, so
    one the decision does not need is neither read nor said."""

    def __init__(self, supervisor: "Supervisor", job: "Job | HeldOutput", code: "int | None", ranks: int):
        self._supervisor, self._ranks = supervisor, ranks
        self.code = code                                    # horovodrun's exit status (None: adopted)
        self.interrupted = supervisor.interrupted           # the signal that stopped this supervisor
        self.left_running = isinstance(job, HeldOutput)     # a run not ours to stop

    @cached_property
    def slurm_ending(self) -> "str | None":
        """Why Slurm ended the job (asked now if the job had ended before watch() could ask)."""
        known = self._supervisor.slurm_ending
        return slurm.job_ending() if known is None else known

    @cached_property
    def stopped(self) -> bool:
        """The job stopped at a checkpoint to take more ranks."""
        return supervisor_messages.read(self._supervisor.run_folder.stopped_record) is not None

    @cached_property
    def finished(self) -> bool:
        return self._supervisor.own_record(self._supervisor.run_folder.finished_record) is not None

    @cached_property
    def busy(self) -> "dict | None":
        """The job's record of its refusal by the output lock."""
        return self._supervisor.own_record(self._supervisor.run_folder.busy_record)

    @cached_property
    def failure(self) -> "str | None":
        return job_failure(self._supervisor.run_folder, self._ranks)

    @cached_property
    def died(self) -> "tuple[int, str, str] | None":
        return died_reading(self._supervisor.run_folder, self._ranks)

    @cached_property
    def held(self) -> str:
        return held(self._supervisor.run_folder)


# ------------------------------------------------------------------ the supervisor
def option_value(args: "list[str]", name: str) -> "str | None":
    """The value of trainer option `name` (`--name V` or `--name=V`, the last one wins) in args."""
    value = None
    for k, arg in enumerate(args):
        if arg == name and k + 1 < len(args):
            value = args[k + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def without_option(args: "list[str]", name: str) -> "list[str]":
    """args without `--name V` / `--name=V`."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def launcher_options(horovodrun_args: str, hosts: "list[str]") -> "list[str]":
    """The user's horovodrun options for a launch on `hosts`. When every host is this one (the others
    were lost), --network-interface(s) is left out: horovodrun 0.28 then accepts only the loopback
    interface ("No interface is found for address 127.0.0.1"), and local ranks talk over it anyway."""
    options = shlex.split(horovodrun_args)
    if not any(o.startswith("--network-interface") for o in options):      # also --network-interfaces
        return options                  # nothing to decide (and no name lookups)
    # horovodrun's own test of "local": the one horovod import outside comm (this process is no rank, and
    # imports no MXNet, which comm would load)
    from horovod.runner.util.network import filter_local_addresses
    if not filter_local_addresses(hosts):
        for name in ("--network-interface", "--network-interfaces"):
            options = without_option(options, name)
    return options


def job_failure(run: RunFolder, ranks: int) -> "str | None":
    """A failure of the run's own (a failure record that is not a signal or a lost contact), or None:
    a lost rank."""
    return failure_records.first_failure(failure_records.read(run, range(ranks)))


def died_reading(run: RunFolder, ranks: int) -> "tuple[int, str, str] | None":
    """(rank, file, how it died) for the lowest rank of the job that ended that died reading a file whole
    (reading.py's note), or None."""
    for rank in range(ranks):
        file = supervisor_messages.died_reading(run, rank)
        if file is not None:
            how = failure_records.crash_summary(run.crash_record(rank)) or "no crash record: killed (SIGKILL, " \
                                                                          "the out-of-memory killer) or its host lost"
            return rank, file, how
    return None


def newest_checkpoint(run: RunFolder):
    """The newest complete checkpoint of the output folder (checkpoints.Saved), or None."""
    return checkpoints.latest(run.checkpoints)


def held(run: RunFolder) -> str:
    """The newest checkpoint named by what it holds, or '-': for the timeline and messages."""
    saved = newest_checkpoint(run)
    return "-" if saved is None else saved.describe()


class Supervisor:
    def __init__(self, args: argparse.Namespace, trainer_args: "list[str]", output: str, start_over: bool,
                 length: "list" = ()):
        self.args, self.trainer_args, self.run_folder = args, trainer_args, RunFolder(output)
        self.output = os.path.realpath(output)      # what this supervisor's jobs are launched for
        self.start_over = start_over
        self.length = list(length)      # the run's length as asked for (max_update, num_epoch): see run()
        # with --start_over, the earlier run's newest checkpoint: launches start afresh while it is in place (the
        # trainer moves it aside as it starts; a job lost before that must not resume the earlier run)
        self.earlier_run = getattr(newest_checkpoint(self.run_folder), "path", None) if start_over else None
        self.launch_id: "str | None" = None      # of the job watched now (None: a run started by hand)
        self.restarts = 0
        # (file, starting checkpoint) of the last job, ended by a rank that died reading the file: the same
        # again is the file's doing, not a lost rank
        self.last_death_reading: "tuple[str, str] | None" = None
        self.interrupted: "int | None" = None
        self.slurm_ending: "str | None" = None      # why Slurm ended the job ('' : not Slurm); None: not asked
        os.makedirs(self.run_folder.elastic, exist_ok=True)
        os.makedirs(self.run_folder.logs, exist_ok=True)

    # -- records
    def event(self, ranks: "int | None", hosts, what: str) -> None:
        """One line of the timeline and of the log."""
        newest = held(self.run_folder)
        hosts_text = ",".join(f"{h}:{n}" for h, n in hosts) or "-"
        ranks_text = "?" if ranks is None else str(ranks)
        new = not os.path.exists(self.run_folder.timeline)
        with open(self.run_folder.timeline, "a") as f:
            if new:
                f.write("time\tcheckpoint\tranks\thosts\tevent\n")
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}\t{newest}\t{ranks_text}\t{hosts_text}\t{what}\n")
        log.info(f"[newest checkpoint {newest}; {ranks_text} ranks on {hosts_text}] {what}")

    # -- discovery
    def hosts_now(self) -> Hosts:
        try:
            return discover(self.args.host_discovery_script, self.args.slots_per_host)
        except RuntimeError as error:
            log.warning(f"{error}; counting no hosts this time")
            return Hosts(())

    def wait_for_hosts(self) -> "Hosts | None":
        """Hosts with at least --min-np slots, waiting up to --wait-timeout; None when they do not come."""
        deadline = time.time() + self.args.wait_timeout
        said = False
        while self.interrupted is None:
            hosts = self.hosts_now()
            if hosts.total >= self.args.min_np:
                return hosts
            if time.time() >= deadline:
                return None
            if not said:
                self.event(0, hosts.slots, f"waiting for at least {self.args.min_np} slots "
                                           f"(have {hosts.total}; up to {self.args.wait_timeout:g} s)")
                said = True
            self.sleep(self.args.discovery_interval)
        return None

    def sleep(self, seconds: float) -> None:
        end = time.time() + seconds
        while self.interrupted is None and time.time() < end:
            time.sleep(min(0.2, end - time.time()))

    # -- launching and adopting
    def command(self, assigned, resume: bool) -> "list[str]":
        args = self.trainer_args
        if resume:          # --start_over has done its work (or had none): this launch continues
            args = without_option(without_option(args, "--resume"), "--start_over") + ["--resume", "latest"]
        np_ = sum(n for _, n in assigned)
        spec = ",".join(f"{h}:{n}" for h, n in assigned)
        return [self.args.horovodrun, "--gloo", "-np", str(np_), "-H", spec,
                *launcher_options(self.args.horovodrun_args, [h for h, _ in assigned]),
                os.environ.get("PYTHON") or sys.executable, "-m", "mxnet_pfc.runtime.launch_rank", "--", *args]

    def launch(self, assigned, resume: bool) -> Job:
        """Start the job and record it (job.json) for a supervisor that may have to adopt it."""
        supervisor_messages.clear_for_launch(self.run_folder)
        self.launch_id = uuid.uuid4().hex
        job = Job.launch(self.command(assigned, resume), self.launch_id, self.output)
        from mxnet_pfc.runtime.files import write_json
        from mxnet_pfc.runtime.run_lock import boot_id
        write_json(self.run_folder.job_record, dict(
            pid=job.pid, started=job.started, host=socket.gethostname(), boot_id=boot_id(),
            ranks=sum(n for _, n in assigned), hosts=[list(a) for a in assigned], launch=self.launch_id,
            output=self.output))
        return job

    def own_record(self, path: str) -> "dict | None":
        """The record at `path` if the job watched now wrote it (its launch id; any for a run started by hand,
        which cleared older records as it started): never an earlier run's."""
        record = supervisor_messages.read(path)
        return record if record is not None and record.get("launch") == self.launch_id else None

    def adopt(self) -> "tuple[Job | HeldOutput, int | None, tuple] | None":
        """The live job of this output folder (its run lock held by a process that is not gone), or None.

        A job launched by a supervisor of this host (job.json names its horovodrun,
        still running) is adopted whole: its processes are tracked and stopped as
        our own. Any other holder (a run started by hand, or from another host) is
        watched through the lock until it lets go.
        """
        from mxnet_pfc.runtime import run_lock
        holder = run_lock.live_holder(self.run_folder.root)
        record = supervisor_messages.read(self.run_folder.job_record) or {}
        ours = self.recorded_job_runs(record)
        if holder is None and not ours:
            return None
        # a refusal recorded before this job is no word of it
        supervisor_messages.clear(self.run_folder.busy_record)
        self.earlier_run = None          # the live job is this folder's run now: --start_over has been done
        self.launch_id = record["launch"] if ours else None
        if ours:
            job = Job(record["pid"], record["started"])
            ranks = record.get("ranks") if isinstance(record.get("ranks"), int) else None
            hosts = record.get("hosts")
            assigned = tuple((h, n) for h, n in hosts) if isinstance(hosts, list) and all(
                isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], int)
                for a in hosts) else ()
            self.event(ranks, assigned, f"adopted the running job (horovodrun pid {job.pid}"
                                        + (f"; output held by {holder.describe()}" if holder else "")
                                        + "): watching it")
            return job, ranks, assigned
        self.event(None, (), f"adopted the running job holding the output ({holder.describe()}): watching its "
                             f"output lock until it ends")
        return HeldOutput(self.run_folder.root, holder), None, ()

    def recorded_job_runs(self, record: dict) -> bool:
        """Whether the job job.json names runs on this host and was launched for this output folder (then it is
        adopted, and stopped on Ctrl-C). A live process it names that was not is left alone, saying why:
        job.json may have been copied with its folder (`cp -a` of a live run), or edited."""
        from mxnet_pfc.runtime.run_lock import boot_id
        pid, started, launch = record.get("pid"), record.get("started"), record.get("launch")
        if not (record.get("host") == socket.gethostname() and record.get("boot_id") == boot_id()
                and isinstance(pid, int) and isinstance(started, str) and isinstance(launch, str)
                and _alive(pid, started)):
            return False        # no job of this host that still runs: nothing to adopt, nothing to say
        why = launch_problem(pid, launch, self.output)
        if why is None and record.get("output") != self.output:
            why = f"job.json was written for another output folder, {quoted(record.get('output'))}"
        if why is not None:
            self.event(None, (), f"not adopting process {pid}, which {self.run_folder.job_record} names: {why}; "
                                 f"it is left alone")
        return why is None

    def run(self) -> int:
        """Launch (or adopt) the job, watch it, and do what decide says when it ends; the exit status."""
        resume = option_value(self.trainer_args, "--resume") is not None
        adopted = self.adopt()
        finished = self.run_folder.finished_record
        decision = decide_start(supervisor_messages.read(finished), finished, self.length, adopted is not None,
                                self.start_over)
        if isinstance(decision, Exit):
            self.event(0, (), decision.say)
            return decision.status
        reason = decision.reason
        while True:
            if adopted is not None:
                job, np_, assigned = adopted
            else:
                hosts = self.wait_for_hosts()
                if self.interrupted is not None:
                    return 128 + self.interrupted
                if hosts is None:
                    self.event(0, (), f"gave up: fewer than --min-np {self.args.min_np} slots for "
                                      f"{self.args.wait_timeout:g} s")
                    return EXIT_GAVE_UP
                assigned = hosts.assign(self.args.max_np)
                np_ = sum(n for _, n in assigned)
                fresh = self.earlier_run is not None and os.path.isdir(self.earlier_run)
                resume = not fresh and (resume or newest_checkpoint(self.run_folder) is not None)
                self.event(np_, assigned, f"launch ({reason})" + (": --resume latest" if resume else ""))
                job = self.launch(assigned, resume)
            code = self.watch(job, np_, assigned)
            adopted = None
            decision = decide(JobEnd(self, job, code, np_ or self.args.max_np), self.restarts,
                              self.args.max_restarts, self.last_death_reading)
            if isinstance(decision, (Exit, Adopt)):
                self.event(np_, assigned, decision.say)
            if isinstance(decision, Exit):
                return decision.status
            if isinstance(decision, Adopt):
                adopted = self.adopt()
                if adopted is None:
                    reason = decision.reason
                continue
            reason = decision.reason
            if decision.restart:
                self.restarts += 1
                self.last_death_reading = decision.death_reading
                wait_for_lock(self.run_folder.root, timeout=120.0)

    def watch(self, job: "Job | HeldOutput", np_: "int | None", assigned) -> "int | None":
        """Until the job ends (or we are interrupted): ask it to grow when more slots appear. Returns
        its exit status (None when adopted)."""
        asked = np_ is None         # a job we know nothing of is not asked to grow
        next_look = time.time() + self.args.discovery_interval
        while job.running():
            if self.interrupted is not None:
                self.slurm_ending = slurm.job_ending() or ""     # asked now: stopping may take --stop-grace s
                return job.stop(self.interrupted, grace=self.args.stop_grace)
            if not asked and time.time() >= next_look:
                next_look = time.time() + self.args.discovery_interval
                available = min(self.hosts_now().total, self.args.max_np)
                if available > np_:
                    supervisor_messages.request_stop(self.run_folder, available)
                    self.event(np_, assigned, f"{available} slots available: asked the job to stop at its "
                                              f"next checkpoint to relaunch on them")
                    asked = True
            job.track()
            time.sleep(0.5)
        return job.stop(grace=0)            # ended: nothing of it may stay behind

    def interrupt(self, signum, frame) -> None:
        self.interrupted = signum
