"""A Slurm cluster started for the tests: munged, slurmctld and slurmd from Debian's packages.

Everything lives in a folder of the test's own (the munge key and socket, the configuration, the
controller's state, the nodes' spools, the logs), on ports of its own, so it neither needs nor touches a
cluster this machine may run. By default one node, this host, with as many CPUs as it has and two at
least, so a job of two tasks fits. Given `nodes` (name, address, network namespace), a slurmd runs in
each namespace (two_hosts.py makes them), the controller and the clients in the first: a cluster of
several machines whose links can be cut. Clients (sbatch, srun, scancel, squeue) reach it through
SLURM_CONF in env(). Needs root (slurmd starts jobs as their user).
"""
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "scancel", "squeue", "scontrol", "sinfo")


def unavailable_reason() -> "str | None":
    """Why a Slurm cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "slurmd needs root"
    for tool in DAEMONS + CLIENTS:
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return (f"{tool} is not installed (Debian: apt-get install slurmctld slurmd slurm-client munge; "
                    f"make setup installs them when it can)")
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class SlurmCluster:
    def __init__(self, workdir: Path, nodes: "list[tuple[str, str, str | None]] | None" = None):
        self.workdir = Path(workdir)
        self.nodes = nodes or [(socket.gethostname().split(".")[0], "127.0.0.1", None)]
        self.node = self.nodes[0][0]              # the first node: the controller's, and a job's batch host
        self.netns = self.nodes[0][2]
        self.conf = self.workdir / "slurm.conf"
        self.processes: "list[subprocess.Popen]" = []

    def inside(self, cmd: list, netns: "str | None" = "first") -> list:
        """CMD run in a node's network namespace (the first node's by default), as is where there is none.
        Not `ip netns exec`, which mounts a sysfs of the namespace's own and so hides /sys/fs/cgroup from
        slurmd: the namespace is entered, and its /etc/netns/NS/hosts mounted over /etc/hosts as ip does."""
        netns = self.netns if netns == "first" else netns
        if not netns:
            return list(cmd)
        return ["nsenter", f"--net=/run/netns/{netns}", "unshare", "--mount", "--propagation", "private",
                "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', f"/etc/netns/{netns}/hosts", *cmd]

    def env(self, base: "dict | None" = None) -> dict:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        for name in [n for n in env if n.startswith("SLURM_") and n != "SLURM_CONF"]:
            del env[name]          # a test run inside a Slurm job must not pass that job's variables on
        return env

    def up(self, timeout: float = 60.0) -> "SlurmCluster":
        munge, state, spool, logs = (self.workdir / d for d in ("munge", "state", "spool", "logs"))
        for folder in (munge, state, logs, *(spool / name for name, _, _ in self.nodes)):
            folder.mkdir(parents=True, exist_ok=True)
        munge.chmod(0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        self.socket = munge / "munge.socket"
        self._start([_daemon("munged"), "--foreground", "--force", f"--socket={self.socket}",
                     f"--key-file={key}", f"--log-file={logs / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                     f"--seed-file={munge / 'munged.seed'}"], logs / "munged.out")
        self._wait_for(lambda: self.socket.exists(), timeout, "munged's socket")
        cpus = max(2, os.cpu_count() or 2)
        self.conf.write_text("\n".join([
            "ClusterName=pfctest",
            f"SlurmctldHost={socket.gethostname().split('.')[0]}({self.nodes[0][1]})",   # must be this host's name
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={state}", f"SlurmdSpoolDir={spool}/%n",
            f"SlurmctldPidFile={self.workdir / 'slurmctld.pid'}", f"SlurmdPidFile={self.workdir / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={logs / 'slurmctld.log'}", f"SlurmdLogFile={logs / 'slurmd-%n.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "MpiDefault=none", "ReturnToService=2", "SchedulerType=sched/backfill",
            "SchedulerParameters=sched_interval=1,bf_interval=1",   # a job submitted as one ends starts at once
            "KillWait=30", "MinJobAge=300", "SlurmdTimeout=5",    # a node silent for 5 s is down
            *(f"NodeName={name} NodeAddr={address} CPUs={cpus} State=UNKNOWN" for name, address, _ in self.nodes),
            f"PartitionName=debug Nodes={','.join(name for name, _, _ in self.nodes)} Default=YES "
            f"MaxTime=INFINITE State=UP OverSubscribe=YES",
            ""]))
        env = self.env()
        self._start(self.inside([_daemon("slurmctld"), "-D", "-c", "-i", "-f", str(self.conf)]),
                    logs / "slurmctld.out", env)
        for name, _, netns in self.nodes:
            self._start(self.inside([_daemon("slurmd"), "-D", "-N", name, "-f", str(self.conf)], netns),
                        logs / f"slurmd-{name}.out", env)
        self._wait_for(self._nodes_idle, timeout, "every node to be idle in sinfo")
        return self

    def _start(self, cmd: list, out: Path, env: "dict | None" = None) -> None:
        with open(out, "w") as f:
            self.processes.append(subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True))

    def _nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout
        return out.split() == ["idle"] * len(self.nodes)

    def node_state(self, name: str) -> str:
        out = self.run("scontrol", "show", "node", "-o", name, check=False).stdout
        return dict(item.split("=", 1) for item in out.split() if "=" in item).get("State", "")

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        end = time.time() + timeout
        while time.time() < end:
            if ready():
                return
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead:
                break
            time.sleep(0.3)
        raise RuntimeError(f"Slurm did not start: waited for {what}; ended: {dead or 'none'}\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted((self.workdir / "logs").glob("*")):
            parts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}")
        return "\n".join(parts)

    def run(self, *cmd, check: bool = True, timeout: float = 60.0, env: "dict | None" = None,
            cwd=None) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster."""
        return subprocess.run(self.inside([str(c) for c in cmd]), capture_output=True, text=True, check=check,
                              timeout=timeout, env=self.env(env), cwd=cwd)

    def job_state(self, job_id: str) -> str:
        """The job's state as the controller has it ('' once it is forgotten)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        fields = dict(item.split("=", 1) for item in out.split() if "=" in item)
        return fields.get("JobState", "")

    def wait_job(self, job_id: str, timeout: float) -> str:
        """Wait until the job has ended; its final state. On timeout, cancel it and raise."""
        end = time.time() + timeout
        while time.time() < end:
            state = self.job_state(job_id)
            if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"):
                return state
            time.sleep(0.5)
        self.run("scancel", job_id, check=False)
        raise TimeoutError(f"Slurm job {job_id} did not end in {timeout:g} s (cancelled)")

    def cancel_all(self, timeout: float = 60.0) -> None:
        """Cancel every job and wait until the controller has none left running (bounded)."""
        self.run("scancel", "--user", "root", check=False)
        end = time.time() + timeout
        while time.time() < end and self.run("squeue", "-h", "-o", "%i", check=False).stdout.strip():
            time.sleep(0.5)

    def leftovers(self) -> "list[int]":
        """Processes started for this cluster's jobs (their environment names its configuration)."""
        mark = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and mark in open(f"/proc/{entry}/environ", "rb").read().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
        return [pid for pid in found if pid != os.getpid()]

    def down(self) -> None:
        """Cancel the jobs, stop the daemons, and kill whatever a job left (ranks that horovodrun started in
        sessions of their own escape Slurm's process tracking here)."""
        try:
            self.cancel_all()
        except (OSError, subprocess.SubprocessError):
            pass
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for pid in self.leftovers():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
