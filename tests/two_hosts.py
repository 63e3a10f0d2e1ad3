"""Two hosts on one machine: network namespaces joined by a veth pair, sshd on the second.

Host A (10.231.0.1) runs the launcher and rank 0; host B (10.231.0.2) is reached
the way a second machine is: horovodrun (or mpirun) logs in with ssh and starts
rank 1 there, and every byte between the ranks crosses the veth link, which
cut() takes down. Both hosts share the file system, as on a cluster with a
shared output folder. Needs root (ip netns, sshd).
"""
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

HOST_A, HOST_B = "10.231.0.1", "10.231.0.2"
INTERFACE = "pfc0"          # the same name on both hosts, so horovodrun --network-interface fits both


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check)


def unavailable_reason() -> "str | None":
    """Why two namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"pfc-probe-{os.getpid()}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"network namespaces are not allowed here: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


class TwoHosts:
    def __init__(self, workdir: Path):
        self.workdir = Path(workdir)
        tag = os.getpid()
        self.ns_a, self.ns_b = f"pfc-a-{tag}", f"pfc-b-{tag}"
        self.key = self.workdir / "id_ed25519"

    def up(self) -> "TwoHosts":
        self.workdir.mkdir(parents=True, exist_ok=True)
        for ns, address in ((self.ns_a, HOST_A), (self.ns_b, HOST_B)):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # As on a cluster, each host's name resolves to its own address: Horovod 0.28's
            # process-set rendezvous ignores --network-interface and binds to that address.
            # (ip netns exec mounts /etc/netns/NS/hosts over /etc/hosts; the hosts share one name.)
            etc = Path("/etc/netns") / ns
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
        _run("ip", "link", "add", "pfcv-a", "type", "veth", "peer", "name", "pfcv-b")
        for ns, end, address in ((self.ns_a, "pfcv-a", HOST_A), (self.ns_b, "pfcv-b", HOST_B)):
            _run("ip", "link", "set", end, "netns", ns)
            _run("ip", "-n", ns, "link", "set", end, "name", INTERFACE)
            _run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", INTERFACE)
            _run("ip", "-n", ns, "link", "set", INTERFACE, "up")
        self._start_sshd()
        return self

    def _start_sshd(self) -> None:
        """sshd on host B with a key made for this run (root login by key only)."""
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.workdir / "host_key"))
        shutil.copy(f"{self.key}.pub", self.workdir / "authorized_keys")
        config = self.workdir / "sshd_config"
        config.write_text(
            f"ListenAddress {HOST_B}\nPort 22\nHostKey {self.workdir / 'host_key'}\n"
            f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            f"PasswordAuthentication no\nStrictModes no\nUsePAM no\nPidFile {self.workdir / 'sshd.pid'}\n")
        Path("/run/sshd").mkdir(exist_ok=True)          # sshd's privilege-separation folder
        # horovodrun's ssh records host keys in ~/.ssh/known_hosts; B's key is new each run
        _run("ssh-keygen", "-q", "-R", HOST_B, check=False)
        _run("ip", "netns", "exec", self.ns_b, shutil.which("sshd") or "/usr/sbin/sshd", "-f", str(config),
             "-E", str(self.workdir / "sshd.log"))
        deadline = time.time() + 10
        while _run("ip", "netns", "exec", self.ns_a, *self.ssh_command(), HOST_B, "true", check=False).returncode:
            if time.time() > deadline:
                raise RuntimeError(f"ssh to {HOST_B} failed: {(self.workdir / 'sshd.log').read_text()[-2000:]}")
            time.sleep(0.2)

    def ssh_command(self) -> list:
        return ["ssh", "-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]

    def on_a(self, cmd: list) -> list:
        """CMD run on host A (where the launcher runs)."""
        return ["ip", "netns", "exec", self.ns_a, *cmd]

    def cut(self) -> None:
        """Pull the cable: the link goes down on both hosts; nothing is closed or reset."""
        for ns in (self.ns_a, self.ns_b):
            _run("ip", "-n", ns, "link", "set", INTERFACE, "down")

    def mend(self) -> None:
        for ns in (self.ns_a, self.ns_b):
            _run("ip", "-n", ns, "link", "set", INTERFACE, "up")

    def pids(self, ns: str) -> "list[int]":
        found = _run("ip", "netns", "pids", ns, check=False).stdout.split()
        return [int(pid) for pid in found]

    def down(self) -> None:
        """Kill everything left in the namespaces (sshd, stray ranks) and remove them."""
        for ns in (self.ns_a, self.ns_b):
            for pid in self.pids(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            _run("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
