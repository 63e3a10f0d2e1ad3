"""The Slurm allocation a job runs in: its hosts and slots, the nodes still usable, and why it ends.

    python -m mxnet_pfc.runtime.slurm hosts [--format lines|horovodrun|hostfile|np]

Inside a job (sbatch, salloc, srun), Slurm describes the allocation in the environment:
SLURM_JOB_NODELIST in its hostlist syntax (`gpu[01-04,07],login2`) and SLURM_TASKS_PER_NODE
as counts with repeats (`8(x4),4`). One rank runs per task, so a node's slots are its tasks
(ask for as many tasks per node as GPUs per node: one rank per GPU). `hosts` prints them
for horovodrun (-H), for mpirun (a hosts file), as a count of ranks, or one `host:slots`
line each, which is the elastic supervisor's discovery format: it leaves out the nodes Slurm
reports down or not responding, so a job submitted with `--no-kill` is relaunched around a
lost node. This module owns these facts; setup-utils/slurm.sbatch, rank_environment.py, stops.py and the
docs (docs/slurm.md) use it.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

from mxnet_pfc.runtime.errors import PfcError, quoted

# A node in one of these states is lost to the job (the job itself may live on with --no-kill). Not DRAIN or
# FAIL: an administrator's request that leaves running jobs running.
LOST_STATES = ("DOWN", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN")
# A task bound to CPUs of its own by Slurm's --cpu-bind: its affinity is already its share.
BOUND_TYPES = ("mask_cpu", "map_cpu", "map_ldom", "mask_ldom", "cores", "threads", "sockets", "ldoms",
               "rank")
SCONTROL_TIMEOUT = 10.0
MAX_NODES = 100_000         # more nodes than any allocation has: a host list beyond it is a damaged value
MAX_TASKS_PER_NODE = 65_533     # Slurm's own ceiling of MaxTasksPerNode (slurm.conf): tasks, so ranks, of a node
# Asked while a rank stops on SIGTERM: horovodrun kills its ranks 5 s after passing the signal on.
ENDING_TIMEOUT, ENDING_RETRY = 3.0, 0.25
# The states of a job Slurm is ending (a job being ended shows COMPLETING until its processes are gone).
ENDING_STATES = ("COMPLETING", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "DEADLINE")


class SlurmError(PfcError, ValueError):
    """The allocation cannot be read (outside a job, or a variable not in Slurm's syntax or beyond what an
    allocation can be)."""


def _split_top(text: str) -> "list[str]":
    """`text` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise SlurmError(f"nested brackets in the host list {quoted(text)}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise SlurmError(f"a ']' without '[' in the host list {quoted(text)}")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise SlurmError(f"an unclosed '[' in the host list {quoted(text)}")
    parts.append(text[start:])
    return parts


def _ranges(body: str, whole: str) -> "list[tuple[int, int, int]]":
    """`01-03,7` -> [(1, 3, 2), (7, 7, 0)]: each range's ends and zero padding, not expanded."""
    ranges = []
    for item in body.split(","):
        match = re.fullmatch(r"([0-9]{1,30})(?:-([0-9]{1,30}))?", item)     # a node number has a few digits
        if match is None:
            raise SlurmError(f"{quoted(item)} in the host list {quoted(whole)} is not a number or a range of numbers")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise SlurmError(f"the range {quoted(item)} in the host list {quoted(whole)} runs backwards")
        ranges.append((int(low), int(high), len(low) if low.startswith("0") else 0))
    return ranges


def _name_parts(part: str, whole: str) -> "list[tuple[str, list[tuple[int, int, int]]]]":
    """A name of the host list as (literal, ranges after it: [] for none) pieces: `r[1-2]n` -> [('r', [(1, 2,
    0)]), ('n', [])]."""
    if re.search(r"\s", part) or "[]" in part:
        raise SlurmError(f"{quoted(part)} in the host list {quoted(whole)} is not a node name")
    return [(literal, _ranges(body, whole) if body else [])
            for literal, body in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part)]


def expand_hostlist(text: str) -> "list[str]":
    """Slurm's hostlist syntax as names: `gpu[01-02],cpu7` -> ['gpu01', 'gpu02', 'cpu7']; several
    bracket groups in one name give every combination (`r[1-2]n[1-2]` -> r1n1, r1n2, r2n1, r2n2). The
    names are counted before any is made: more than MAX_NODES is refused (`r[0-99998]n[0-99998]` names
    10 billion)."""
    text = text.strip()
    if not text:
        raise SlurmError("the host list is empty")
    parsed, count = [], 0
    for part in _split_top(text):
        if not part:
            raise SlurmError(f"an empty name in the host list {quoted(text)}")
        pieces = _name_parts(part, text)
        names = 1
        for _, ranges in pieces:
            names *= sum(high - low + 1 for low, high, _ in ranges) if ranges else 1
            if count + names > MAX_NODES:
                raise SlurmError(f"the host list {quoted(text)} names more than {MAX_NODES:,} nodes, which no "
                                 f"allocation has: a damaged value")
        count += names
        parsed.append(pieces)
    hosts = []
    for pieces in parsed:
        names = [""]
        for literal, ranges in pieces:
            values = [str(n).zfill(width) for low, high, width in ranges for n in range(low, high + 1)] or [""]
            names = [name + literal + value for name in names for value in values]
        hosts.extend(names)
    return hosts


def expand_counts(text: str) -> "list[int]":
    """Slurm's per-node counts with repeats: `8(x2),4` -> [8, 8, 4]. A count is 1 to MAX_TASKS_PER_NODE
    tasks, for at most MAX_NODES nodes in all (counted before any is made: `8(x9999999999)`)."""
    counts = []
    for item in text.strip().split(","):
        match = re.fullmatch(r"([0-9]{1,30})(?:\(x([0-9]{1,30})\))?", item.strip())
        if match is None:
            raise SlurmError(f"{quoted(item)} in the per-node counts {quoted(text)} is not N or N(xM)")
        count, repeat = int(match.group(1)), int(match.group(2) or 1)
        if not 1 <= count <= MAX_TASKS_PER_NODE:
            raise SlurmError(f"{quoted(item)} in the per-node counts {quoted(text)}: {count:,} tasks on a node, "
                             f"where a node runs 1 to {MAX_TASKS_PER_NODE:,} (Slurm's largest MaxTasksPerNode)")
        if repeat < 1:
            raise SlurmError(f"{quoted(item)} in the per-node counts {quoted(text)} repeats a count 0 times")
        if len(counts) + repeat > MAX_NODES:
            raise SlurmError(f"the per-node counts {quoted(text)} are for more than the {MAX_NODES:,} nodes any "
                             f"allocation has: a damaged value")
        counts.extend([count] * repeat)
    return counts


@dataclass(frozen=True)
class Allocation:
    """A job's nodes in Slurm's order and the tasks (ranks) each runs."""
    job_id: str
    hosts: "tuple[tuple[str, int], ...]"

    @property
    def ranks(self) -> int:
        return sum(slots for _, slots in self.hosts)


def job_id(environ: "dict | None" = None) -> "str | None":
    """The id of the Slurm job this process runs in (SLURM_JOB_ID, or the older SLURM_JOBID), or None."""
    env = os.environ if environ is None else environ
    return env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or None


def allocation(environ: "dict | None" = None) -> Allocation:
    """The allocation described by the environment of a Slurm job; SlurmError outside one."""
    env = os.environ if environ is None else environ
    job = job_id(env)
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not job or not nodelist:
        raise SlurmError("not inside a Slurm job: SLURM_JOB_ID and SLURM_JOB_NODELIST are not set "
                         "(run this in a batch script, under salloc, or in an srun step)")
    hosts = expand_hostlist(nodelist)
    tasks = env.get("SLURM_TASKS_PER_NODE")
    counts = expand_counts(tasks) if tasks else [1] * len(hosts)
    if len(counts) != len(hosts):
        raise SlurmError(f"SLURM_TASKS_PER_NODE={quoted(tasks)} gives {len(counts)} counts for the {len(hosts)} "
                         f"nodes of SLURM_JOB_NODELIST={quoted(nodelist)}")
    return Allocation(job, tuple(zip(hosts, counts)))


def tasks_on_this_node(environ: dict) -> "int | None":
    """The tasks of this srun step on this node (SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID), or None
    outside a step."""
    per_node, node = environ.get("SLURM_STEP_TASKS_PER_NODE"), environ.get("SLURM_NODEID")
    if not per_node or node is None or not node.isdigit():
        return None
    try:
        counts = expand_counts(per_node)
    except SlurmError:
        return None
    return counts[int(node)] if int(node) < len(counts) else None


def cpus_bound_per_task(environ: dict) -> bool:
    """Whether Slurm bound each task to CPUs of its own (srun --cpu-bind), so that a task's affinity
    mask is its share already and is not to be divided among the tasks of the node."""
    kind = environ.get("SLURM_CPU_BIND_TYPE", "")
    return any(bound in kind for bound in BOUND_TYPES)


def _scontrol(*args: str, timeout: float = SCONTROL_TIMEOUT) -> "str | None":
    """scontrol's output, or None when it cannot answer in `timeout` s (not installed, no controller)."""
    try:
        proc = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None


def _fields(line: str) -> "dict[str, str]":
    """`Key=value Key2=value2` of scontrol's one-line output (-o)."""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def _job_fields(job: str, timeout: float = SCONTROL_TIMEOUT) -> "dict[str, str]":
    """The controller's record of the job (`scontrol show job -o`) as fields; empty when it cannot answer."""
    out = _scontrol("show", "job", "-o", job, timeout=timeout)
    return _fields(out.splitlines()[0]) if out else {}


def node_states(names: "list[str]") -> "dict[str, str]":
    """{node: state} as scontrol reports them (`ALLOCATED`, `IDLE+DRAIN`, `DOWN+NOT_RESPONDING`); empty when
    scontrol cannot answer."""
    out = _scontrol("show", "node", "-o", ",".join(names))
    states = {}
    for line in (out or "").splitlines():
        fields = _fields(line)
        if "NodeName" in fields:
            states[fields["NodeName"]] = fields.get("State", "")
    return states


def job_nodes(job: str) -> "list[str] | None":
    """The nodes the job holds now as the controller has them (a node lost by a job submitted with
    --no-kill leaves it), or None when scontrol cannot answer."""
    nodes = _job_fields(job).get("NodeList", "")
    try:
        return expand_hostlist(nodes) if nodes and nodes != "(null)" else None
    except SlurmError:
        return None


def usable_hosts(alloc: Allocation) -> "list[tuple[str, int]]":
    """The allocation's (node, slots) that the job still holds, without the nodes Slurm reports lost
    (LOST_STATES); every node when scontrol cannot answer. Nodes are named as Slurm names them, which is
    how mpirun matches a hosts file against the allocation, and how the nodes of a cluster reach each other."""
    held = job_nodes(alloc.job_id)
    states = node_states([host for host, _ in alloc.hosts])
    usable = []
    for host, slots in alloc.hosts:
        flags = set()
        for flag in states.get(host, "").split("+"):
            flags |= {flag.rstrip("*"), "NOT_RESPONDING"} if flag.endswith("*") else {flag}   # older scontrol: "*"
        if (held is None or host in held) and not flags.intersection(LOST_STATES):
            usable.append((host, slots))
    return usable


def job_ending(environ: "dict | None" = None, budget: float = ENDING_TIMEOUT) -> "str | None":
    """Why Slurm is ending the job of this process, when it is (it sends every task SIGTERM on scancel, at the
    time limit, on preemption, when a node fails), or None: not in a job, or the job still runs (the signal
    came from elsewhere, e.g. a preemption's grace time, which looks the same). At that moment the job shows
    COMPLETING whatever the cause, so the cause is read from its Reason and run time. Asked again for up to
    `budget` s while the controller does not answer or does not yet show the end."""
    job = job_id(environ)
    if not job:
        return None
    deadline = time.monotonic() + budget
    while True:       # the controller may be slow to answer, or not yet show the end, while it signals
        fields = _job_fields(job, timeout=max(0.5, deadline - time.monotonic()))
        state, reason = fields.get("JobState", ""), fields.get("Reason", "")
        if state in ENDING_STATES:
            break
        if time.monotonic() + ENDING_RETRY > deadline:
            return None
        time.sleep(ENDING_RETRY)
    limit, run_time = _seconds(fields.get("TimeLimit", "")), _seconds(fields.get("RunTime", ""))
    if state == "TIMEOUT" or reason == "TimeLimit" or (limit is not None and run_time is not None
                                                        and run_time >= limit):
        return f"the Slurm job {job} reached its time limit ({fields.get('TimeLimit', '?')})"
    if state == "PREEMPTED" or reason.startswith("Preempt"):
        return f"the Slurm job {job} was preempted"
    if state == "NODE_FAIL" or reason in ("NodeDown", "NodeFail"):
        return f"a node of the Slurm job {job} failed"
    if state == "DEADLINE":
        return f"the Slurm job {job} reached its deadline"
    return f"the Slurm job {job} was cancelled (scancel; a preemption that cancels looks the same)"


def _seconds(text: str) -> "int | None":
    """Slurm's [D-]HH:MM:SS (or MM:SS) as seconds; None for UNLIMITED or anything else."""
    match = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text)
    if match is None:
        return None
    days, hours, minutes, seconds = (int(group or 0) for group in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def format_hosts(hosts: "list[tuple[str, int]]", form: str) -> str:
    """The hosts as `lines` (host:slots per line), `horovodrun` (-H's value), `hostfile` (mpirun's), or `np`."""
    if form == "horovodrun":
        return ",".join(f"{host}:{slots}" for host, slots in hosts)
    if form == "hostfile":
        return "".join(f"{host} slots={slots}\n" for host, slots in hosts).rstrip("\n")
    if form == "np":
        return str(sum(slots for _, slots in hosts))
    return "\n".join(f"{host}:{slots}" for host, slots in hosts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m mxnet_pfc.runtime.slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, help="hosts: the allocation's usable hosts and slots")
    hosts = sub.add_parser("hosts", help="the allocation's usable hosts and their slots (tasks per node)")
    hosts.add_argument("--format", choices=("lines", "horovodrun", "hostfile", "np"), default="lines",
                       help="lines: 'host:slots' per line (the elastic supervisor's discovery format; the "
                            "default); horovodrun: its -H value; hostfile: mpirun's 'host slots=N' lines; "
                            "np: the number of ranks")
    hosts.add_argument("--all", action="store_true",
                       help="every node of the allocation, without asking Slurm which are down")
    args = p.parse_args(argv)
    try:
        alloc = allocation()
    except SlurmError as error:
        print(f"mxnet_pfc.runtime.slurm: {error}", file=sys.stderr)
        return 2
    usable = list(alloc.hosts) if args.all else usable_hosts(alloc)
    if not usable:      # the supervisor waits for hosts on an empty list; a launch cannot start
        print(f"mxnet_pfc.runtime.slurm: every node of job {alloc.job_id} is down or not responding",
              file=sys.stderr)
        return 0 if args.format == "lines" else 1
    print(format_hosts(usable, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
