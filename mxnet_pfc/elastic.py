"""Training that outlives its machines: relaunch on the hosts that remain, grow back when they return.

    python -m mxnet_pfc.elastic --host-discovery-script ./hosts.sh --min-np 1 --max-np 16 \\
        --max-restarts 10 -- --dataset emore --network r100 --output runs/big

The discovery script prints the usable hosts, one `host:slots` line each (a
bare `host` gets --slots-per-host), as horovodrun's elastic mode expects. The
supervisor launches the trainer with horovodrun on them (at most --max-np
ranks) and watches:
- the job ends with a lost rank or host (killed, crashed, unreachable): it
  rediscovers and relaunches on the hosts available with `--resume latest`.
  The centers are re-sharded onto the new number of ranks and the position is
  kept in samples seen; the batch per rank stays, so the global batch and with
  it the peak learning rate (linear rule, --lr_base_batch) follow the world size;
- the script lists more slots than are running (a host came back or was
  added): it asks the trainer to stop at its next checkpoint (the file
  OUTPUT/elastic/stop-at-checkpoint) and relaunches on more ranks;
- the job fails on an error of its own (bad input, a non-finite loss, a full
  disk: a failure record in OUTPUT/logs), or ends normally: it stops, with
  the job's exit status.
It gives up after --max-restarts relaunches after failures, or when fewer
than --min-np slots are available for --wait-timeout seconds. Ctrl-C or
SIGTERM is passed to the job, and no process of the job is left behind.

Every change of the world is a line of OUTPUT/elastic-timeline.tsv (time,
step of the newest checkpoint, ranks, hosts, event) and of this command's
log, beside the job's own output; the trainer records its world size and
the samples trained in OUTPUT/metrics.jsonl.
See docs/DESIGN.md section 6.5.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("mxnet_pfc.elastic")

REPO = Path(__file__).resolve().parent.parent
EXIT_GAVE_UP = 3            # this command's status when it stops relaunching


# ------------------------------------------------------------------ the trainer's side
def stop_request_path(output: str) -> str:
    """The file whose presence asks a running trainer to stop after its next periodic checkpoint."""
    return os.path.join(output, "elastic", "stop-at-checkpoint")


def stopped_record_path(output: str) -> str:
    """Where the trainer says that it stopped at a checkpoint on request (JSON: step, world size)."""
    return os.path.join(output, "elastic", "stopped-at-checkpoint.json")


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
    """`host:slots` or `host` lines; blank lines and # comments are skipped. Raises ValueError."""
    slots = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        host, _, count = line.partition(":")
        try:
            n = int(count) if count else default_slots
        except ValueError:
            raise ValueError(f"line {number}: {line!r} is not host:slots") from None
        if not host or n < 0:
            raise ValueError(f"line {number}: {line!r} is not host:slots")
        slots[host] = n                       # a host listed twice: its last line counts
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
    from .run_lock import process_stat
    table = {}
    for entry in os.listdir("/proc"):
        stat = process_stat(int(entry)) if entry.isdigit() else None
        if stat is not None:
            table[int(entry)] = stat
    return table


class Job:
    """One horovodrun launch of the trainer, in a session of its own.

    horovodrun starts each local rank in a session of its own, and a rank whose
    launcher died is handed to init, so the job's processes cannot be found from
    horovodrun's pid at the end: `track` notes them (pid and start time) while
    the job runs, and `stop` kills whichever of them are still there.
    """

    def __init__(self, command: "list[str]"):
        # the job's output on this command's own (each rank also logs to OUTPUT/logs/rankR.log)
        self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True)
        self.known: "dict[int, str]" = {}
        self.track()

    def track(self) -> None:
        """Note every process now below horovodrun."""
        table = _processes()
        children = {}
        for pid, (ppid, _) in table.items():
            children.setdefault(ppid, []).append(pid)
        todo = [self.proc.pid]
        while todo:
            pid = todo.pop()
            if pid in table:
                self.known.setdefault(pid, table[pid][1])
            todo.extend(children.get(pid, []))

    def poll(self) -> "int | None":
        return self.proc.poll()

    def stop(self, signum: int = signal.SIGTERM, grace: float = 30.0) -> int:
        """Pass `signum` to horovodrun (it ends its ranks), then kill whatever is left after `grace` s."""
        if self.proc.poll() is None:
            self.track()
            try:
                self.proc.send_signal(signum)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        table = _processes()
        for pid, started in self.known.items():
            if pid in table and table[pid][1] == started:        # the same process, not a reused pid
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        return self.proc.wait()


def wait_for_lock(output: str, timeout: float) -> None:
    """Until the output folder's run lock is free or its holder gone (a rank 0 on a lost host holds it
    until it has not been refreshed for run_lock.STALE_SECONDS), at most `timeout` s."""
    from . import run_lock
    deadline = time.time() + timeout
    while time.time() < deadline and run_lock.holder_active(output):
        time.sleep(1.0)


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
    from horovod.runner.util.network import filter_local_addresses     # horovodrun's own test of "local"
    if not filter_local_addresses(hosts):
        for name in ("--network-interface", "--network-interfaces"):
            options = without_option(options, name)
    return options


def job_failure(output: str, ranks: int) -> "str | None":
    """A failure of the run's own (a failure record that is not a signal or a lost contact), or None:
    a lost rank."""
    from . import stops           # the trainer's record format; imported late (stops imports MXNet)
    return stops.first_failure(stops.read_records(os.path.join(output, "logs"), range(ranks)))


def latest_checkpoint_step(output: str) -> "int | None":
    from . import checkpoint
    steps = checkpoint.list_steps(os.path.join(output, "checkpoints"))
    return steps[-1] if steps else None


class Supervisor:
    def __init__(self, args: argparse.Namespace, trainer_args: "list[str]", output: str):
        self.args, self.trainer_args, self.output = args, trainer_args, output
        self.timeline = os.path.join(output, "elastic-timeline.tsv")
        self.restarts = 0
        self.interrupted: "int | None" = None
        os.makedirs(os.path.join(output, "elastic"), exist_ok=True)
        os.makedirs(os.path.join(output, "logs"), exist_ok=True)

    # -- records
    def event(self, ranks: int, hosts, what: str) -> None:
        """One line of the timeline and of the log."""
        step = latest_checkpoint_step(self.output)
        hosts_text = ",".join(f"{h}:{n}" for h, n in hosts) or "-"
        new = not os.path.exists(self.timeline)
        with open(self.timeline, "a") as f:
            if new:
                f.write("time\tstep\tranks\thosts\tevent\n")
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')}\t{'-' if step is None else step}\t{ranks}\t"
                    f"{hosts_text}\t{what}\n")
        log.info(f"[step {'-' if step is None else step}, {ranks} ranks on {hosts_text}] {what}")

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

    # -- launching
    def command(self, assigned, resume: bool) -> "list[str]":
        args = self.trainer_args
        if resume:
            args = without_option(args, "--resume") + ["--resume", "latest"]
        np_ = sum(n for _, n in assigned)
        spec = ",".join(f"{h}:{n}" for h, n in assigned)
        return [self.args.horovodrun, "--gloo", "-np", str(np_), "-H", spec,
                *launcher_options(self.args.horovodrun_args, [h for h, _ in assigned]),
                "bash", str(REPO / "config.sh"), "--", *args]

    def run(self) -> int:
        resume = option_value(self.trainer_args, "--resume") is not None
        reason = "start"
        while True:
            hosts = self.wait_for_hosts()
            if self.interrupted is not None:
                return 128 + self.interrupted
            if hosts is None:
                self.event(0, (), f"gave up: fewer than --min-np {self.args.min_np} slots for "
                                  f"{self.args.wait_timeout:g} s")
                return EXIT_GAVE_UP
            assigned = hosts.assign(self.args.max_np)
            np_ = sum(n for _, n in assigned)
            for path in (stop_request_path(self.output), stopped_record_path(self.output)):
                if os.path.exists(path):
                    os.remove(path)
            resume = resume or latest_checkpoint_step(self.output) is not None
            wait_for_lock(self.output, timeout=120.0)
            self.event(np_, assigned, f"launch ({reason})" + (": --resume latest" if resume else ""))
            code, stopped = self.watch(Job(self.command(assigned, resume)), np_, assigned)
            if self.interrupted is not None:
                self.event(np_, assigned, f"interrupted ({signal.Signals(self.interrupted).name}): job stopped")
                return 128 + self.interrupted
            if code == 0 and stopped is not None:
                reason = f"grow: stopped at the checkpoint of step {stopped['step']} to take more ranks"
                continue
            if code == 0:
                self.event(np_, assigned, "finished")
                return 0
            failure = job_failure(self.output, np_)
            if failure is not None or code == 2:
                self.event(np_, assigned, f"failed on an error of its own (exit {code}): "
                                          f"{failure or 'a configuration error'}; not relaunched")
                return code
            if self.restarts >= self.args.max_restarts:
                self.event(np_, assigned, f"gave up: the job ended (exit {code}) and --max-restarts "
                                          f"{self.args.max_restarts} relaunches are spent")
                return EXIT_GAVE_UP
            self.restarts += 1
            reason = f"restart {self.restarts}/{self.args.max_restarts}: the job lost a rank or host (exit {code})"

    def watch(self, job: Job, np_: int, assigned) -> "tuple[int, dict | None]":
        """Until the job ends (or we are interrupted): ask it to grow when more slots appear."""
        asked = False
        next_look = time.time() + self.args.discovery_interval
        while job.poll() is None:
            if self.interrupted is not None:
                return job.stop(self.interrupted, grace=self.args.stop_grace), None
            if not asked and time.time() >= next_look:
                next_look = time.time() + self.args.discovery_interval
                available = min(self.hosts_now().total, self.args.max_np)
                if available > np_:
                    with open(stop_request_path(self.output), "w") as f:
                        f.write(f"{available}\n")
                    self.event(np_, assigned, f"{available} slots available: asked the job to stop at its "
                                              f"next checkpoint to relaunch on them")
                    asked = True
            job.track()
            time.sleep(0.5)
        code = job.stop(grace=0)            # ended: nothing of it may stay behind
        try:
            with open(stopped_record_path(self.output)) as f:
                return code, json.load(f)
        except (OSError, ValueError):
            return code, None

    def interrupt(self, signum, frame) -> None:
        self.interrupted = signum


def parse_args(argv=None) -> "tuple[argparse.Namespace, list[str]]":
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m mxnet_pfc.elastic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s --host-discovery-script SCRIPT [options] -- [trainer options]")
    p.add_argument("--host-discovery-script", required=True,
                   help="command that prints the usable hosts, one 'host:slots' line each (horovodrun's format)")
    p.add_argument("--slots-per-host", type=int, default=1,
                   help="slots of a host listed without ':slots' (default 1)")
    p.add_argument("--min-np", type=int, default=1, help="fewest ranks to train on (default 1)")
    p.add_argument("--max-np", type=int, default=None,
                   help="most ranks to train on (default: every slot listed at the first launch)")
    p.add_argument("--max-restarts", type=int, default=10,
                   help="relaunches after failures before giving up (growing does not count; default 10)")
    p.add_argument("--wait-timeout", type=float, default=600.0,
                   help="seconds to wait for --min-np slots before giving up (default 600)")
    p.add_argument("--discovery-interval", type=float, default=10.0,
                   help="seconds between runs of the discovery script while the job trains (default 10)")
    p.add_argument("--stop-grace", type=float, default=30.0,
                   help="seconds the job has to end after Ctrl-C or SIGTERM before it is killed (default 30)")
    p.add_argument("--horovodrun", default=str(Path(sys.executable).with_name("horovodrun")),
                   help="the horovodrun to launch with (default: the one beside this Python)")
    p.add_argument("--horovodrun-args", default="",
                   help="more horovodrun options, one string, e.g. '--network-interface eth0' (default none)")
    args = p.parse_args(argv[:split])
    for name in ("slots_per_host", "min_np", "max_restarts"):
        if getattr(args, name) < (0 if name == "max_restarts" else 1):
            p.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'max_restarts' else 1}")
    if args.max_np is not None and args.max_np < args.min_np:
        p.error(f"--max-np ({args.max_np}) is below --min-np ({args.min_np})")
    return args, argv[split + 1:]


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s elastic: %(message)s", stream=sys.stderr)
    args, trainer_args = parse_args(argv)
    from . import config as config_lib      # the trainer's own checks, before any host is used
    try:
        cfg = config_lib.parse_args(trainer_args)
    except config_lib.ConfigError as error:
        print(f"mxnet_pfc.elastic: configuration error: {error}", file=sys.stderr)
        return 2
    if not cfg.save_interval:
        log.warning("--save_interval is 0: no periodic checkpoints, so a failure restarts from the beginning "
                    "and the job cannot grow")
    if args.max_np is None:
        try:
            args.max_np = max(discover(args.host_discovery_script, args.slots_per_host).total, args.min_np)
        except RuntimeError as error:
            print(f"mxnet_pfc.elastic: {error}", file=sys.stderr)
            return 2
    from . import run_lock
    try:       # one supervisor per output folder: two would relaunch over each other
        lock = run_lock.acquire(os.path.join(cfg.output, "elastic"))
    except run_lock.OutputBusyError as error:
        print(f"mxnet_pfc.elastic: another supervisor runs on this output: {error}", file=sys.stderr)
        return 2
    if lock.took_over:
        log.info(f"took over from a supervisor that is gone: {lock.took_over}")
    try:
        supervisor = Supervisor(args, trainer_args, cfg.output)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, supervisor.interrupt)
        return supervisor.run()
    finally:
        lock.release()


if __name__ == "__main__":
    sys.exit(main())
