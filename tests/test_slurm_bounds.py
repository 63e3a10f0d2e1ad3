"""What a Slurm allocation can be (issue 33 item 6): more nodes or tasks than any has are refused.

A host list or per-node counts that name more nodes than any allocation has are refused before anything is
expanded (`r[0-99998]n[0-99998]` and `8(x9999999999)` used to end in a MemoryError), and node task counts of 0
or 10^20 are refused by name (they were passed on as `-np 0`). Through the functions, the `hosts` command that
setup-utils/slurm.sbatch and the elastic supervisor's discovery run, the batch script itself, and the
supervisor's own reading of a discovery script's `host:slots` lines."""
import os
import resource
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from launch import ELASTIC, REPO, finish_command, rank_env, start_command
from mxnet_pfc.runtime import slurm, supervisor

SBATCH = REPO / "setup-utils" / "slurm.sbatch"
MEMORY = 1 << 30        # the commands below run within 1 GB of address space: a list of 10^10 names cannot hide


def test_host_lists_are_counted_before_they_are_expanded():
    assert len(slurm.expand_hostlist("n[00000-99999]")) == slurm.MAX_NODES        # the largest allocation
    for text in ("r[0-99998]n[0-99998]", "n[0-99999],login1", "a[1-2]b[1-2]c[0-99999]", "n[0-99999999999999]"):
        with pytest.raises(slurm.SlurmError, match="names more than 100,000 nodes, which no allocation has"):
            slurm.expand_hostlist(text)
    with pytest.raises(slurm.SlurmError, match="is not a number or a range of numbers"):
        slurm.expand_hostlist("n[1-" + "9" * 5000 + "]")       # int() refuses 5000 digits: not a crash here
    with pytest.raises(slurm.SlurmError, match="is not a number or a range of numbers"):
        slurm.expand_hostlist("n[\u00b2]")                       # a digit to str.isdigit, not to int()


def test_per_node_counts_are_real_task_counts_for_a_real_number_of_nodes():
    assert slurm.expand_counts("65533,1(x2)") == [65533, 1, 1]
    for text, said in (("0", "'0' in the per-node counts '0': 0 tasks on a node, where a node runs 1 to 65,533"),
                       ("8,0(x3)", "0 tasks on a node"),
                       ("1" + "0" * 20, "100,000,000,000,000,000,000 tasks on a node"),
                       ("8(x0)", "'8(x0)' in the per-node counts '8(x0)' repeats a count 0 times"),
                       ("8(x9999999999)", "are for more than the 100,000 nodes any allocation has"),
                       ("8(x60000),4(x40001)", "are for more than the 100,000 nodes any allocation has")):
        with pytest.raises(slurm.SlurmError, match=said.replace("(", r"\(").replace(")", r"\)")):
            slurm.expand_counts(text)


@settings(max_examples=300, deadline=5000)
@given(st.text(alphabet="n[]-,0123456789(x)\u00b2 ", max_size=60))
def test_any_host_list_or_counts_give_names_or_a_named_error(text):
    """Whatever SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE hold: names (at most MAX_NODES) or SlurmError."""
    for parse in (slurm.expand_hostlist, slurm.expand_counts):
        try:
            assert len(parse(text)) <= slurm.MAX_NODES
        except slurm.SlurmError:
            pass


def limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def job_env(**variables) -> dict:
    """This environment as a Slurm job's: no SLURM_ variable of the machine's, `variables` instead."""
    env = {k: v for k, v in rank_env().items() if not k.startswith("SLURM_")}
    return {**env, "SLURM_JOB_ID": "7", **variables}


@pytest.mark.parametrize("nodes, tasks, said", [
    ("r[0-99998]n[0-99998]", "8", "names more than 100,000 nodes"),
    ("n[1-2]", "8(x9999999999)", "are for more than the 100,000 nodes any allocation has"),
    ("n1", "0", "0 tasks on a node"),
    ("n1", "1" + "0" * 20, "100,000,000,000,000,000,000 tasks on a node"),
])
def test_the_hosts_command_refuses_what_no_allocation_can_be(nodes, tasks, said):
    """`python -m mxnet_pfc.runtime.slurm hosts`, as the batch script and the elastic discovery run it:
    exit 2 and the reason, within 1 GB of memory (a MemoryError traceback, or '0' ranks, before)."""
    proc = subprocess.run([sys.executable, "-m", "mxnet_pfc.runtime.slurm", "hosts", "--format", "np", "--all"],
                          env=job_env(SLURM_JOB_NODELIST=nodes, SLURM_TASKS_PER_NODE=tasks), cwd=REPO,
                          capture_output=True, text=True, timeout=120, preexec_fn=limit_memory)
    assert proc.returncode == 2 and said in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout == ""


def test_the_batch_script_stops_on_an_allocation_no_job_can_have(tmp_path):
    """setup-utils/slurm.sbatch inside a job whose nodes claim 0 tasks: it stops naming that, before any
    launcher (it used to announce '0 ranks' and launch `-np 0`; LAUNCHER=mpi, a typo, would stop it next)."""
    env = job_env(SLURM_JOB_NODELIST="n[1-2]", SLURM_TASKS_PER_NODE="0(x2)", MXNET_PFC_REPO=str(REPO),
                  PYTHON=sys.executable, LAUNCHER="mpi")
    out = subprocess.run(["bash", SBATCH], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
                         preexec_fn=limit_memory)
    assert out.returncode == 2 and "0 tasks on a node, where a node runs 1 to 65,533" in out.stderr, out.stderr
    assert "ranks on" not in out.stderr and "LAUNCHER=mpi" not in out.stderr, out.stderr


def test_a_discovery_scripts_nonsense_slot_count_is_refused(tmp_path):
    """The elastic supervisor reading `host:slots` lines: 10^20 slots is refused by name before any launch
    (it was passed on to horovodrun as -np); 0 slots still lists a host as not usable."""
    assert supervisor.parse_hosts("a:0\nb:2", 1).slots == (("b", 2),)
    with pytest.raises(ValueError, match="100,000,000,000,000,000,000 slots on a host, more than the 65,533"):
        supervisor.parse_hosts("a:" + "1" + "0" * 20, 1)
    launched = tmp_path / "launched"
    fake = tmp_path / "fake-horovodrun"
    fake.write_text(f"#!/usr/bin/env bash\necho \"$@\" > {launched}\nexit 1\n")
    fake.chmod(0o755)
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:1" + "0" * 20, "--horovodrun", fake,
                                    "--max-restarts", 0, "--", "--output", tmp_path / "run", "--max_update", 5])
    out = finish_command(proc, timeout=120)
    assert proc.returncode == 2 and "slots on a host, more than the 65,533 any host runs" in out, out[-3000:]
    assert not launched.exists(), launched.read_text()
    assert not os.path.exists(tmp_path / "run" / "elastic-timeline.tsv")
