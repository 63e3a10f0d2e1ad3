"""Two hosts (network namespaces joined by a veth pair), one rank each, launched by horovodrun over ssh.

The link is cut mid-run: both ranks must stop within the Gloo timeout, saying
why; after mending it, --resume must finish the run with the loss curve of the
uninterrupted single-host reference run.
"""
import time

import numpy as np
import pytest

from launch import (HOROVODRUN, REFERENCE_RUN, finish_command, last_logged_step, losses, run_command, start_command,
                    tiny_synthetic_run, wait_until)
from mxnet_pfc import checkpoint
from two_hosts import HOST_A, HOST_B, INTERFACE, TwoHosts, unavailable_reason

GLOO_TIMEOUT_S = 10      # horovodrun --gloo-timeout-seconds: the bound on noticing a silent peer

reason = unavailable_reason()
pytestmark = pytest.mark.skipif(reason is not None, reason=f"two-host test: {reason}")


@pytest.fixture
def hosts(tmp_path):
    pair = TwoHosts(tmp_path / "hosts").up()
    yield pair
    pair.down()


def launch_on_two_hosts(hosts, *trainer_args):
    """horovodrun on host A with a host list, as across real machines."""
    return hosts.on_a([HOROVODRUN, "--gloo", "-np", 2, "-H", f"{HOST_A}:1,{HOST_B}:1",
                       "--network-interface", INTERFACE, "--ssh-identity-file", hosts.key,
                       "--gloo-timeout-seconds", GLOO_TIMEOUT_S, "bash", "config.sh", "--", *trainer_args])


def trainers_on(hosts, ns):
    return [pid for pid in hosts.pids(ns) if b"mxnet_pfc.train" in open(f"/proc/{pid}/cmdline", "rb").read()]


def test_cut_link_ends_the_job_in_bounded_time_and_resume_continues(hosts, reference, tmp_path):
    data, uninterrupted = reference
    output = tmp_path / "run"
    args = tiny_synthetic_run(data, output, *REFERENCE_RUN)
    proc = start_command(launch_on_two_hosts(hosts, *args))
    wait_until(lambda: last_logged_step(output) >= 18, 240, "step 18 on two hosts", interval=0.05, proc=proc)
    assert trainers_on(hosts, hosts.ns_b), "rank 1 is not running on host B"
    cut_at = time.time()
    hosts.cut()
    out = finish_command(proc, timeout=120)
    stopped_after = time.time() - cut_at
    assert proc.returncode != 0
    assert GLOO_TIMEOUT_S - 1 < stopped_after < GLOO_TIMEOUT_S + 20, f"stopped {stopped_after:.1f} s after the cut"
    assert "rank 0: LostRankError: step" in out and "lost contact with the other ranks" in out, out[-3000:]
    # Gloo's timeout fired; it words it by where it struck: waiting on a buffer, or in a pair's I/O.
    gloo_timeout = (f"Timed out waiting {GLOO_TIMEOUT_S * 1000}ms", "Application timeout caused pair closure")
    assert any(words in out for words in gloo_timeout), \
        [line[-300:] for line in out.splitlines() if "uncaught exception" in line]
    # Rank 1, cut off on host B, gives up on its own within the same bound.
    wait_until(lambda: not trainers_on(hosts, hosts.ns_b), 30, "rank 1 on host B to exit", interval=0.2)

    hosts.mend()
    latest = checkpoint.list_steps(output / "checkpoints")[-1]
    resumed = run_command(launch_on_two_hosts(hosts, *args, "--resume", "latest"), timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"at step {latest}," in resumed.stdout
    expected, got = losses(uninterrupted), losses(output)
    assert sorted(got) == list(range(1, 31))
    np.testing.assert_allclose([got[s] for s in range(1, 31)], [expected[s] for s in range(1, 31)], rtol=1e-5)
