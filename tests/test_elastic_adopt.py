"""A supervisor killed (SIGKILL) and started again with the same command adopts the job it left running.

Issue 22 item 4: it neither reports the job's normal end as a failure, nor launches a second job into the
folder (refused by the output lock, and counted as lost ranks), nor starts over from step 0.

The job is frozen (SIGSTOP) from the moment the first supervisor is killed until the second says it
adopted it: what the job has done by then is decided by that event, not by the machine's speed."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from launch import (
    ELASTIC,
    REFERENCE_RUN,
    REPO,
    finish_command,
    frozen,
    losses,
    rank_env,
    run_command,
    saved_steps,
    start_command,
    tiny_synthetic_run,
    trainer_pid,
    trainer_processes,
    wait_until,
)
from launch import elastic_timeline as timeline
from mxnet_pfc.runtime.run_folder import RunFolder

# The job waits in its collectives while frozen: a Gloo timeout longer than any freeze here.
JOB_ENV = {"HOROVOD_GLOO_TIMEOUT_SECONDS": "600"}


@pytest.mark.parametrize("then", ["finishes", "loses rank 1"])
def test_a_restarted_supervisor_adopts_its_job(reference, tmp_path, then):
    """The 2-rank reference run under a supervisor, SIGKILLed after the first checkpoint; the same
    command again adopts the job (one job: no launch of its own), and when the job ends acts as for
    its own: finished -> exit 0; a lost rank -> relaunched with --resume latest. Either way the run's
    losses are the uninterrupted run's, every step trained once."""
    data, uninterrupted = reference
    output, hosts = tmp_path / "run", tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    trainer_options = tiny_synthetic_run(data, output, *REFERENCE_RUN)
    command = ELASTIC + ["--host-discovery-script", f"cat {hosts}", "--discovery-interval", 1,
                         "--max-restarts", 0 if then == "finishes" else 1, "--"] + trainer_options
    # The first supervisor's output (and its job's, which outlives it) to a file: a pipe would be held
    # open by the job after the supervisor is killed.
    first_log = open(tmp_path / "first-supervisor.log", "w")
    first = subprocess.Popen([str(part) for part in command], cwd=REPO, env={**rank_env(), **JOB_ENV},
                             stdout=first_log, stderr=subprocess.STDOUT, start_new_session=True)
    first_log.close()
    ranks = wait_until(lambda: saved_steps(output / "checkpoints") and trainer_pid(output, 0)
                       and trainer_pid(output, 1) and [trainer_pid(output, 0), trainer_pid(output, 1)], 240,
                       "the job's first checkpoint")
    with frozen(ranks):
        os.kill(first.pid, signal.SIGKILL)          # the supervisor only: the job is in a session of its own
        first.wait(timeout=30)
        # A run started by hand into the folder meanwhile is refused by the output lock, and says so.
        by_hand = run_command([sys.executable, "-m", "mxnet_pfc.train", *trainer_options, "--resume", "latest"],
                              timeout=120)
        assert by_hand.returncode == 1 and "is in use by another run" in by_hand.stdout, by_hand.stdout[-3000:]
        assert not os.path.exists(RunFolder(str(output)).busy_record)     # no supervisor launched it to tell
        second = start_command(command, JOB_ENV)
        adopted = wait_until(lambda: next((e for e in timeline(output) if e["event"].startswith("adopted")), None),
                             120, "the new supervisor adopting the job", proc=second)
        assert sorted(trainer_processes(output)) == sorted(ranks), "a second job was launched"
        if then == "loses rank 1":
            os.kill(ranks[1], signal.SIGKILL)
    out = finish_command(second, timeout=400)
    assert second.returncode == 0, out[-4000:]
    events = timeline(output)
    assert "horovodrun pid" in adopted["event"] and adopted["ranks"] == "2", adopted
    after = [e["event"] for e in events[events.index(adopted) + 1:]]
    if then == "finishes":
        assert after == ["finished"], events
    else:
        assert len(after) == 2 and after[0].startswith("launch (restart 1/1: the job lost a rank or host "
                                                       "(exit status unknown: adopted)): --resume latest"), events
        assert after[1] == "finished", events
    assert [e["event"] for e in events if e["event"].startswith("launch")][0] == "launch (start)"
    # Every step once, from the orphan's progress on (not from step 0), as the uninterrupted run.
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    assert [r["samples"] for r in records if "loss" in r] == [16 * s for s in range(1, 31)], records
    expected, got = losses(uninterrupted), losses(output)
    np.testing.assert_allclose([got[s] for s in range(1, 31)], [expected[s] for s in range(1, 31)], rtol=1e-5)
    if then == "finishes":          # the job ran undisturbed: the same model, bit for bit
        assert (output / "model-0000.params").read_bytes() == (uninterrupted / "model-0000.params").read_bytes()
        # The same command once more: the run's own record says it finished; nothing is launched.
        again = run_command(command, timeout=120, env=JOB_ENV)
        assert again.returncode == 0, again.stdout[-3000:]
        assert timeline(output)[-1]["event"].startswith("finished (the run's record"), timeline(output)[-1]
        assert len(timeline(output)) == len(events) + 1
    assert trainer_processes(output) == []
