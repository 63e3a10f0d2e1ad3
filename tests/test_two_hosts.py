"""Two hosts (network namespaces joined by a veth pair), one rank each, horovodrun over ssh under the supervisor.

The link is cut mid-run: both ranks stop within the Gloo timeout, saying why,
and the supervisor relaunches on host A alone with --resume latest; the link
is mended, and the job grows back onto B at its next checkpoint and finishes.
(That --resume continues a run exactly is tested on one host, in
test_checkpoint and test_faults.)
"""
import json
import time

import pytest

from launch import (
    ELASTIC,
    elastic_timeline,
    finish_command,
    held_samples,
    last_logged_step,
    start_command,
    tiny_synthetic_run,
    trainer_processes,
    wait_until,
)
from two_hosts import HOST_A, HOST_B, INTERFACE, TwoHosts, unavailable_reason

GLOO_TIMEOUT_S = 10      # horovodrun --gloo-timeout-seconds: the bound on noticing a silent peer

reason = unavailable_reason()
pytestmark = [pytest.mark.skipif(reason is not None, reason=f"two-host test: {reason}"),
              pytest.mark.xdist_group("two_hosts")]      # with test_slurm.py: one veth pair at a time (conftest.py)


@pytest.fixture
def hosts(tmp_path):
    pair = TwoHosts(tmp_path / "hosts").up()
    yield pair
    pair.down()


def trainers_on(hosts, ns) -> "list[int]":
    """The trainer processes in host `ns`'s network namespace."""
    found = []
    for pid in hosts.pids(ns):
        try:
            if b"mxnet_pfc.train" in open(f"/proc/{pid}/cmdline", "rb").read():
                found.append(pid)
        except OSError:         # ended meanwhile
            continue
    return found


def trained_records(output) -> "list[dict]":
    """Rank 0's metrics records of trained steps (samples, world_size, time, ...); [] before the first."""
    try:
        lines = open(output / "metrics.jsonl").read().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:          # the last line, half-written
            break
    return [r for r in records if "loss" in r]


def test_elastic_supervisor_outlives_a_cut_link_and_grows_back(hosts, reference, tmp_path):
    """2 ranks on A and B -> the link is cut -> the job ends within the Gloo timeout and the supervisor
    relaunches on A alone from the last checkpoint -> the link is mended, the discovery script reaches B
    again -> the job stops at its next checkpoint and grows back onto both hosts -> it finishes. Every
    sample of the run is trained once after the last checkpoint before the cut, and the model verifies
    within fold noise of the uninterrupted run's."""
    data, uninterrupted = reference
    output = tmp_path / "run"
    # The user's discovery script: A, and B when ssh reaches it (on the supervisor's host, A).
    discovery = tmp_path / "hosts.sh"
    discovery.write_text(f"#!/bin/sh\necho {HOST_A}:1\n"
                         f"timeout 5 {' '.join(map(str, hosts.ssh_command()))} -o ConnectTimeout=2 {HOST_B} true "
                         f"&& echo {HOST_B}:1\nexit 0\n")
    discovery.chmod(0o755)
    horovodrun_args = (f"--network-interface {INTERFACE} --ssh-identity-file {hosts.key} "
                       f"--gloo-timeout-seconds {GLOO_TIMEOUT_S}")
    per_rank = 8
    proc = start_command(hosts.on_a(ELASTIC + [
        "--host-discovery-script", discovery, "--max-restarts", 2, "--discovery-interval", 1,
        "--horovodrun-args", horovodrun_args, "--"] + tiny_synthetic_run(
            data, output, "--max_update", 40, "--save_interval", 4, "--keep_checkpoints", 3, "--frequent", 1,
            "--verbose", 1000, "--sample_rate", 0.5, "--dropout", 0.2)))
    wait_until(lambda: last_logged_step(output) >= 10, 240, "step 10 on two hosts", interval=0.05, proc=proc)
    assert trainers_on(hosts, hosts.ns_b), "rank 1 is not running on host B"
    cut_at = time.time()
    hosts.cut()

    def trained_after(since, world):
        return [r for r in trained_records(output) if r["time"] > since and r["world_size"] == world]

    first_alone = wait_until(lambda: len(trained_after(cut_at, 1)) >= 2 and trained_after(cut_at, 1), 120,
                             "training on host A alone", proc=proc)[0]
    # Rank 1, cut off on host B, gave up on its own within the same bound.
    wait_until(lambda: not trainers_on(hosts, hosts.ns_b), 30, "rank 1 on host B to exit", interval=0.2)
    mended_at = time.time()
    hosts.mend()
    first_grown = wait_until(lambda: trained_after(mended_at, 2), 180, "training on both hosts again", proc=proc)[0]
    out = finish_command(proc, timeout=300)
    assert proc.returncode == 0, out[-4000:]
    print(f"cut -> training on A alone: {first_alone['time'] - cut_at:.1f} s; "
          f"mended -> training on A and B: {first_grown['time'] - mended_at:.1f} s")

    events = elastic_timeline(output)
    both, alone = f"{HOST_A}:1,{HOST_B}:1", f"{HOST_A}:1"
    launches = [(e["event"].split(" (")[0].split(":")[0], e["hosts"])
                for e in events if e["event"].startswith("launch")]
    assert launches == [("launch", both), ("launch", alone), ("launch", both)], events
    restart = next(e for e in events if e["event"].startswith("launch (restart 1/2"))
    assert "--resume latest" in restart["event"] and restart["ranks"] == "1", events
    assert events[-1]["event"] == "finished", events
    # The job ended on the Gloo timeout (the timeline's clock has whole seconds), saying why.
    relaunched_at = time.mktime(time.strptime(restart["time"], "%Y-%m-%d %H:%M:%S"))
    assert GLOO_TIMEOUT_S - 2 < relaunched_at - cut_at < GLOO_TIMEOUT_S + 20, relaunched_at - cut_at
    assert "rank 0: LostRankError: step" in out and "lost contact with the other ranks" in out, out[-3000:]
    assert "ended without a message" not in out, out[-3000:]          # rank 1 stopped too, and said so
    # Gloo's timeout fired; it words it by where it struck: waiting on a buffer, or in a pair's I/O.
    gloo_timeout = (f"Timed out waiting {GLOO_TIMEOUT_S * 1000}ms", "Application timeout caused pair closure")
    assert any(words in out for words in gloo_timeout), \
        [line[-300:] for line in out.splitlines() if "uncaught exception" in line]
    assert first_alone["time"] - cut_at < GLOO_TIMEOUT_S + 60, first_alone["time"] - cut_at
    # Host A resumed at the newest checkpoint before the cut (its step counted in 2-rank batches).
    assert first_alone["samples"] == held_samples(restart) + per_rank, (first_alone, restart)
    # Every global batch once and in order, to the run's 40 x 16 samples: none lost, none twice.
    trained = [(r["samples"], r["world_size"]) for r in trained_records(output)]
    assert [b - a for (a, _), (b, w) in zip(trained, trained[1:])] == [per_rank * w for _, w in trained[1:]], trained
    assert trained[0] == (16, 2) and trained[-1] == (40 * 16, 2), trained
    phases = [w for k, (_, w) in enumerate(trained) if k == 0 or trained[k - 1][1] != w]
    assert phases == [2, 1, 2], trained
    # The model verifies as the uninterrupted run's within the spread over folds.
    got = json.load(open(output / "model-verification.json"))["val"]
    expected = json.load(open(uninterrupted / "model-verification.json"))["val"]
    assert abs(got["accuracy"] - expected["accuracy"]) <= 2 * max(got["std"], expected["std"]), (got, expected)
    assert trainer_processes(output) == [] and not trainers_on(hosts, hosts.ns_b)
