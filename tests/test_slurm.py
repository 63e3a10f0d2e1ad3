"""Training on Slurm as users submit it (slurm.sbatch, srun), against a real one-node cluster.

Through setup-utils/slurm.sbatch and the srun path, against a real one-node cluster (Debian's slurmctld,
slurmd and munge, started by the tests: slurm_cluster.py); the allocation's syntax
(mxnet_pfc/runtime/slurm.py) against Slurm's documented forms.

The cluster tests submit the batch script with sbatch as a user does, on the 2-rank reference run's data:
it trains with hosts and slots from the allocation (mpirun, srun, horovodrun, the elastic supervisor),
resumes from its checkpoints when submitted again, and scancel reaches every rank, each saying so.
"""
import json
import os
import signal

import pytest

from launch import (
    REPO,
    elastic_timeline,
    last_logged_step,
    rank_env,
    saved_steps,
    tiny_synthetic_run,
    trainer_pid,
    trainer_processes,
    wait_until,
)
from mxnet_pfc.runtime import slurm
from mxnet_pfc.runtime.rank_environment import rank_environment
from slurm_cluster import SlurmCluster, unavailable_reason
from two_hosts import HOST_A, HOST_B, INTERFACE, TwoHosts
from two_hosts import unavailable_reason as two_hosts_unavailable

pytestmark = pytest.mark.xdist_group("two_hosts")     # with test_two_hosts.py: one veth pair at a time (conftest.py)

SBATCH = REPO / "setup-utils" / "slurm.sbatch"


# ------------------------------------------------------------------ the allocation's syntax
def test_hostlists_and_counts_as_slurm_writes_them():
    assert slurm.expand_hostlist("vm") == ["vm"]
    assert slurm.expand_hostlist("gpu[01-03,7],login2") == ["gpu01", "gpu02", "gpu03", "gpu7", "login2"]
    assert slurm.expand_hostlist("r[1-2]n[08-09]") == ["r1n08", "r1n09", "r2n08", "r2n09"]
    assert slurm.expand_hostlist("node-[098-101]-ib") == ["node-098-ib", "node-099-ib", "node-100-ib", "node-101-ib"]
    assert slurm.expand_counts("8(x3),4") == [8, 8, 8, 4]
    for bad, named in (("gpu[01-03", "unclosed"), ("gpu[3-1]", "backwards"), ("gpu[a-b]", "'a-b'"),
                       ("a,,b", "empty name"), ("g[[1]]", "nested"), ("gpu[]", "not a node name"),
                       ("a, b", "not a node name"), ("n[0-99999999]", "more than 100,000 nodes")):
        with pytest.raises(slurm.SlurmError, match=named):
            slurm.expand_hostlist(bad)
    with pytest.raises(slurm.SlurmError, match="'2x' in the per-node counts"):
        slurm.expand_counts("2x")


def test_the_allocation_from_the_environment():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[1-3]", "SLURM_TASKS_PER_NODE": "8(x2),4"}
    alloc = slurm.allocation(env)
    assert alloc.hosts == (("gpu1", 8), ("gpu2", 8), ("gpu3", 4)) and alloc.ranks == 20
    assert slurm.format_hosts(list(alloc.hosts), "horovodrun") == "gpu1:8,gpu2:8,gpu3:4"
    assert slurm.format_hosts(list(alloc.hosts), "hostfile") == "gpu1 slots=8\ngpu2 slots=8\ngpu3 slots=4"
    with pytest.raises(slurm.SlurmError, match="gives 2 counts for the 3 nodes"):
        slurm.allocation({**env, "SLURM_TASKS_PER_NODE": "8(x2)"})
    with pytest.raises(slurm.SlurmError, match="not inside a Slurm job"):
        slurm.allocation({})


def test_lost_nodes_are_left_out_of_discovery(monkeypatch):
    states = {"a": "ALLOCATED", "b": "DOWN+NOT_RESPONDING", "c": "MIXED+DRAIN", "d": "IDLE+NOT_RESPONDING"}
    monkeypatch.setattr(slurm, "node_states", lambda names: {n: states.get(n, "IDLE") for n in names})
    monkeypatch.setattr(slurm, "job_nodes", lambda job: None)
    alloc = slurm.Allocation("1", (("a", 2), ("b", 2), ("c", 2), ("d", 2), ("e", 2)))
    # a draining node still runs the job (Slurm does not end it); a down or silent one does not
    assert slurm.usable_hosts(alloc) == [("a", 2), ("c", 2), ("e", 2)]
    # a node the job no longer holds (lost under --no-kill, then back) is not the job's to use
    monkeypatch.setattr(slurm, "job_nodes", lambda job: ["a", "b", "c", "d"])
    assert slurm.usable_hosts(alloc) == [("a", 2), ("c", 2)]


@pytest.mark.parametrize("fields, said", [
    # what scontrol shows at the SIGTERM: COMPLETING whatever the cause (seen with scancel here)
    ("JobState=RUNNING Reason=None TimeLimit=01:00:00 RunTime=00:10:00", None),
    ("JobState=COMPLETING Reason=None TimeLimit=01:00:00 RunTime=00:10:00", "was cancelled (scancel;"),
    ("JobState=COMPLETING Reason=TimeLimit TimeLimit=00:10:00 RunTime=00:09:58", "reached its time limit (00:10:00)"),
    ("JobState=COMPLETING Reason=None TimeLimit=1-00:00:00 RunTime=1-00:00:01", "reached its time limit (1-00:00:00)"),
    ("JobState=COMPLETING Reason=NodeDown TimeLimit=UNLIMITED RunTime=00:10:00", "a node of the Slurm job 42 failed"),
    ("JobState=COMPLETING Reason=Preempted TimeLimit=UNLIMITED RunTime=00:10:00", "was preempted"),
    # states that are not Slurm ending the job: the signal came from elsewhere
    ("JobState=COMPLETED Reason=None TimeLimit=UNLIMITED RunTime=00:10:00", None),
    ("JobState=CONFIGURING Reason=None TimeLimit=UNLIMITED RunTime=00:00:01", None),
])
def test_why_slurm_ends_a_job(monkeypatch, fields, said):
    monkeypatch.setattr(slurm, "_scontrol", lambda *args, timeout: f"JobId=42 {fields}\n")
    ending = slurm.job_ending({"SLURM_JOB_ID": "42"}, budget=0)
    assert ending == said if said is None else said in ending
    assert slurm.job_ending({}) is None         # not in a job: no scontrol asked


def test_the_end_is_asked_again_while_the_controller_does_not_show_it(monkeypatch):
    """At the SIGTERM the controller may not answer at once (a burst of RPCs from every rank), or not yet
    show the end: asked again within the budget (seen once in CI: one rank of two said "interrupted")."""
    answers = iter([None, "JobId=42 JobState=RUNNING Reason=None\n",
                    "JobId=42 JobState=COMPLETING Reason=None TimeLimit=UNLIMITED RunTime=00:01:00\n"])
    monkeypatch.setattr(slurm, "_scontrol", lambda *args, timeout: next(answers))
    monkeypatch.setattr(slurm, "ENDING_RETRY", 0.01)
    assert "was cancelled" in slurm.job_ending({"SLURM_JOB_ID": "42"}, budget=5)
    monkeypatch.setattr(slurm, "_scontrol", lambda *args, timeout: "JobId=42 JobState=RUNNING Reason=None\n")
    assert slurm.job_ending({"SLURM_JOB_ID": "42"}, budget=0.05) is None


def test_node_states_as_scontrol_prints_them(monkeypatch):
    lines = ("NodeName=pfca Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 State=MIXED ThreadsPerCore=1 Partitions=debug\n"
             "NodeName=pfcb Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=DOWN+NOT_RESPONDING Reason=Not responding "
             "[slurm@2026-11-26T02:31:30]\n"
             "NodeName=pfcc Arch=x86_64 State=ALLOCATED* Partitions=debug\n")
    monkeypatch.setattr(slurm, "_scontrol", lambda *args, timeout=0: lines)
    monkeypatch.setattr(slurm, "job_nodes", lambda job: None)
    assert slurm.node_states(["pfca", "pfcb", "pfcc"]) == {"pfca": "MIXED", "pfcb": "DOWN+NOT_RESPONDING",
                                                          "pfcc": "ALLOCATED*"}
    # an older scontrol marks a silent node with "*"
    alloc = slurm.Allocation("1", (("pfca", 1), ("pfcb", 1), ("pfcc", 1)))
    assert slurm.usable_hosts(alloc) == [("pfca", 1)]


def test_a_rank_of_an_srun_step_takes_its_share_of_the_cores():
    step = {"SLURM_STEP_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "2"}
    assert rank_environment(step, cpus=8, sites=[])["OMP_NUM_THREADS"] == "4"
    step["SLURM_NODEID"] = "0"
    assert rank_environment(step, cpus=8, sites=[])["OMP_NUM_THREADS"] == "2"
    # bound by srun --cpu-bind to cores of its own: its affinity mask is its share already
    assert rank_environment({**step, "SLURM_CPU_BIND_TYPE": "mask_cpu:"}, cpus=8, sites=[])[
        "OMP_NUM_THREADS"] == "8"


def test_the_batch_script_outside_a_job_and_its_help(tmp_path):
    import subprocess
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run(["bash", SBATCH], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert out.returncode == 2 and "not inside a Slurm job: submit this script with sbatch" in out.stderr
    helped = subprocess.run(["bash", SBATCH, "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0 and "LAUNCHER" in helped.stdout and "scancel" in helped.stdout
    # inside a job (as Slurm describes it), a tired user's mistakes are named before anything starts
    job = {**env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)",
           "MXNET_PFC_REPO": str(REPO)}
    typo = subprocess.run(["bash", SBATCH], capture_output=True, text=True, env={**job, "LAUNCHER": "mpi"},
                          cwd=tmp_path)
    assert typo.returncode == 2 and "LAUNCHER=mpi is none of mpirun, srun, horovodrun, elastic" in typo.stderr
    assert "job 7: 4 ranks on n1:2,n2:2" in typo.stderr
    elsewhere = subprocess.run(["bash", SBATCH], capture_output=True, text=True,
                               env={**job, "MXNET_PFC_REPO": str(tmp_path)}, cwd=tmp_path)
    assert elsewhere.returncode == 2 and f"cannot find the mxnet-pfc checkout ({tmp_path} has no config.sh)" in (
        elsewhere.stderr)


# ------------------------------------------------------------------ a real cluster
@pytest.fixture(scope="module")
def one_node(tmp_path_factory):
    reason = unavailable_reason()
    if reason:
        pytest.skip(f"no Slurm here: {reason}")
    started = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        started.up()
    except RuntimeError as error:
        started.down()
        pytest.skip(f"Slurm could not start here: {error}")
    except BaseException:
        started.down()
        raise
    yield started
    started.down()


@pytest.fixture
def cluster(one_node):
    """The one-node cluster, with no job of this test left running after it (a failed test's long job
    would train on through the next tests)."""
    yield one_node
    one_node.cancel_all()


def submit(cluster, tmp_path, trainer_args, *sbatch_args, env=None) -> "tuple[str, object]":
    """sbatch setup-utils/slurm.sbatch [SBATCH_ARGS] -- TRAINER_ARGS from tmp_path, as a user does:
    (job id, the job's output file)."""
    out = tmp_path / f"slurm-{len(list(tmp_path.glob('slurm-*.out')))}.out"
    proc = cluster.run("sbatch", "--parsable", "-o", out, *sbatch_args, SBATCH, "--", *trainer_args,
                       env={**rank_env(), **(env or {})}, cwd=tmp_path)
    return proc.stdout.strip().split(";")[0], out


def finished(cluster, job: str, out, timeout: float = 300.0) -> str:
    state = cluster.wait_job(job, timeout)
    text = out.read_text(errors="replace") if out.exists() else ""
    assert state == "COMPLETED", f"job {job} ended {state}:\n{text[-5000:]}"
    return text


def trained(output) -> "list[tuple[int, int]]":
    """(step, world size) of every step rank 0 logged."""
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    return [(r["step"], r["world_size"]) for r in records if "loss" in r]


def test_sbatch_trains_on_the_allocation_with_mpirun(cluster, reference, tmp_path):
    data, _ = reference
    output = tmp_path / "run"
    job, out = submit(cluster, tmp_path, tiny_synthetic_run(data, output, "--max_update", 4, "--frequent", 1))
    text = finished(cluster, job, out)
    assert f"job {job}: 2 ranks on {cluster.node}:2, launched by mpirun, checkout {REPO}" in text, text[-3000:]
    assert trained(output) == [(1, 2), (2, 2), (3, 2), (4, 2)]
    assert "summary" in [json.loads(line) for line in open(output / "metrics.jsonl")][-1]


def test_the_srun_path_trains_and_a_resubmitted_job_resumes(cluster, reference, tmp_path):
    """LAUNCHER=srun: Slurm starts each rank itself (srun --mpi=pmix, Horovod over MPI). Submitted again with
    --resume latest and a longer schedule, the job continues from its last checkpoint."""
    data, _ = reference
    output = tmp_path / "run"
    args = tiny_synthetic_run(data, output, "--frequent", 1, "--save_interval", 2)
    job, out = submit(cluster, tmp_path, [*args, "--max_update", 4], env={"LAUNCHER": "srun"})
    text = finished(cluster, job, out)
    assert "launched by srun" in text and trained(output) == [(1, 2), (2, 2), (3, 2), (4, 2)], text[-3000:]
    job, out = submit(cluster, tmp_path, [*args, "--max_update", 6, "--resume", "latest"], env={"LAUNCHER": "srun"})
    text = finished(cluster, job, out)
    assert trained(output)[4:] == [(5, 2), (6, 2)], text[-3000:]
    assert "resum" in (output / "logs" / "rank0.log").read_text()


def test_scancel_reaches_every_rank_and_each_says_so(cluster, reference, tmp_path):
    """LAUNCHER=horovodrun. scancel while the job trains: every rank stops, saying the Slurm job was
    cancelled (not "another rank failed", not a bare interruption); no process is left, every checkpoint
    on disk is complete, and the job submitted again with --resume latest continues from the last one."""
    data, _ = reference
    output = tmp_path / "run"
    args = tiny_synthetic_run(data, output, "--frequent", 1, "--save_interval", 2)
    job, out = submit(cluster, tmp_path, [*args, "--max_update", 5000], env={"LAUNCHER": "horovodrun"})
    wait_until(lambda: last_logged_step(output) >= 4 and saved_steps(output / "checkpoints"), 240,
               "the job training past its first checkpoint")
    cluster.run("scancel", job)
    state = cluster.wait_job(job, 90)
    text = out.read_text(errors="replace")
    assert state == "CANCELLED", (state, text[-3000:])
    for r in (0, 1):
        said = (output / "logs" / f"rank{r}.log").read_text()
        assert f"stopping: the Slurm job {job} was cancelled" in said, (r, said[-2000:], text[-3000:])
        assert "another rank" not in said.split("stopping:")[-1]
    assert trainer_processes(output) == []
    steps = saved_steps(output / "checkpoints")     # every folder not marked .tmp is a complete checkpoint
    published = [name for name in os.listdir(output / "checkpoints") if not name.endswith(".tmp")]
    assert steps and len(steps) == len(published), (steps, published)
    last = steps[-1]
    job, out = submit(cluster, tmp_path, [*args, "--max_update", last + 2, "--resume", "latest"],
                      env={"LAUNCHER": "horovodrun"})
    finished(cluster, job, out)
    assert [step for step, _ in trained(output)][-2:] == [last + 1, last + 2]


def test_the_elastic_supervisor_relaunches_inside_the_job_and_scancel_ends_it(cluster, reference, tmp_path):
    """LAUNCHER=elastic: the supervisor's hosts come from the allocation (python -m mxnet_pfc.runtime.slurm
    hosts); a rank killed inside the job is relaunched from the last checkpoint; scancel then ends the
    supervisor and both ranks, each saying the job was cancelled, and nothing is relaunched."""
    data, _ = reference
    output = tmp_path / "run"
    args = tiny_synthetic_run(data, output, "--frequent", 1, "--save_interval", 3, "--max_update", 5000)
    job, out = submit(cluster, tmp_path, args, "--no-kill",
                      env={"LAUNCHER": "elastic", "ELASTIC_ARGS": "--discovery-interval 1 --max-restarts 1"})
    wait_until(lambda: saved_steps(output / "checkpoints") and trainer_pid(output, 0) and trainer_pid(output, 1),
               240, "a checkpoint, with both ranks running", interval=0.2)
    first = {trainer_pid(output, 0), trainer_pid(output, 1)}
    os.kill(trainer_pid(output, 1), signal.SIGKILL)
    wait_until(lambda: any(e["event"].startswith("launch (restart 1/1") for e in elastic_timeline(output)), 120,
               "the relaunch")

    def relaunched() -> bool:
        ranks = {trainer_pid(output, 0), trainer_pid(output, 1)}
        resumed = "resuming from" in (output / "logs" / "rank0.log").read_text()
        return None not in ranks and not ranks & first and resumed
    wait_until(relaunched, 120, "both ranks of the relaunch resuming", interval=0.2)
    cluster.run("scancel", job)
    state = cluster.wait_job(job, 90)
    text = out.read_text(errors="replace")
    events = elastic_timeline(output)
    assert state == "CANCELLED", (state, text[-3000:])
    assert events[0]["event"] == "launch (start)" and events[0]["hosts"] == f"{cluster.node}:2", events
    assert [e["event"] for e in events if e["event"].startswith("launch")][1:] == [
        "launch (restart 1/1: the job lost a rank or host (exit 1)): --resume latest"], events
    assert events[-1]["event"].startswith(f"the Slurm job {job} was cancelled (scancel; a preemption that cancels "
                                          "looks the same): interrupted (SIGTERM): job stopped"), events
    for r in (0, 1):
        said = (output / "logs" / f"rank{r}.log").read_text().split("stopping:")[-1]
        assert said.startswith(f" the Slurm job {job} was cancelled"), (r, said)
    assert trainer_processes(output) == []


# ------------------------------------------------------------------ two nodes (network namespaces)
TWO_NODES = [("pfca", HOST_A, "a"), ("pfcb", HOST_B, "b")]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """Slurm on two hosts (two_hosts.py: network namespaces joined by a link that can be cut, sshd on the
    second): node pfca runs the controller and a job's batch script, pfcb is the other node. (cluster, hosts)
    One for the module (starting it takes ~10 s); `nodes` mends the link after each test."""
    reason = unavailable_reason() or two_hosts_unavailable()
    if reason:
        pytest.skip(f"no two-node Slurm here: {reason}")
    tmp_path = tmp_path_factory.mktemp("two-nodes")
    hosts = TwoHosts(tmp_path / "hosts").up()
    namespaces = {"a": hosts.ns_a, "b": hosts.ns_b}
    for ns in namespaces.values():          # the nodes' names resolve on both hosts, as on a cluster
        with open(f"/etc/netns/{ns}/hosts", "a") as f:
            f.write("".join(f"{address} {name}\n" for name, address, _ in TWO_NODES))
    cluster = SlurmCluster(tmp_path / "slurm", [(name, address, namespaces[ns]) for name, address, ns in TWO_NODES])
    try:
        cluster.up()
    except BaseException as error:
        cluster.down()
        hosts.down()
        if isinstance(error, RuntimeError):
            pytest.skip(f"two-node Slurm could not start here: {error}")
        raise
    yield cluster, hosts
    cluster.down()
    hosts.down()


@pytest.fixture
def nodes(two_nodes):
    """The two-node cluster, its link up again and no job of this test running after it."""
    yield two_nodes
    cluster, hosts = two_nodes
    hosts.mend()
    cluster.cancel_all()


def test_mpirun_reaches_the_second_node_through_slurm(nodes, reference, tmp_path):
    """sbatch -N 2: the default launcher starts rank 1 on the other node through Slurm (no ssh)."""
    cluster, _ = nodes
    data, _ = reference
    output = tmp_path / "run"
    job, out = submit(cluster, tmp_path, tiny_synthetic_run(data, output, "--max_update", 4, "--frequent", 1),
                      "-N", 2, "--ntasks-per-node", 1)
    text = finished(cluster, job, out)
    assert f"job {job}: 2 ranks on pfca:1,pfcb:1, launched by mpirun" in text, text[-3000:]
    assert trained(output) == [(1, 2), (2, 2), (3, 2), (4, 2)]
    assert f"StepId={job}.0" in (cluster.workdir / "logs" / "slurmd-pfcb.log").read_text()   # a step on pfcb


def test_a_node_lost_inside_the_job_is_relaunched_around(nodes, reference, tmp_path):
    """LAUNCHER=elastic, sbatch -N 2 --no-kill: the link to pfcb is cut while both ranks train; the job
    ends within the Gloo timeout, Slurm marks pfcb down, and the supervisor, discovering the allocation
    again, relaunches on pfca alone from the last checkpoint; the run finishes in the same Slurm job."""
    cluster, hosts = nodes
    data, _ = reference
    output = tmp_path / "run"
    env = {"LAUNCHER": "elastic", "ELASTIC_ARGS": "--discovery-interval 1 --max-restarts 3",
           "HOROVODRUN_ARGS": f"--network-interface {INTERFACE} --ssh-identity-file {hosts.key} "
                              f"--gloo-timeout-seconds 10"}
    job, out = submit(cluster, tmp_path, tiny_synthetic_run(data, output, "--max_update", 40, "--save_interval", 4,
                                                            "--frequent", 1),
                      "-N", 2, "--ntasks-per-node", 1, "--no-kill", env=env)
    wait_until(lambda: last_logged_step(output) >= 6, 240, "step 6 on two nodes", interval=0.1)
    hosts.cut()
    text = finished(cluster, job, out, timeout=400)
    events = elastic_timeline(output)
    launches = [e["hosts"] for e in events if e["event"].startswith("launch")]
    assert launches[0] == "pfca:1,pfcb:1" and launches[-1] == "pfca:1", (events, text[-3000:])
    restart = next(e for e in events if e["event"].startswith("launch (restart 1/3"))
    assert "--resume latest" in restart["event"] and events[-1]["event"] == "finished", events
    samples = [json.loads(line).get("samples") for line in open(output / "metrics.jsonl")]
    assert [n for n in samples if n][-1] == 40 * 16, samples       # the run's length, kept in samples
    assert {"DOWN", "NOT_RESPONDING"} & set(cluster.node_state("pfcb").split("+"))
