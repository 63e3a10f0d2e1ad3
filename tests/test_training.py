"""End-to-end training on 2 CPU ranks through the launch path users use.

`horovodrun --gloo -np 2 -H localhost:2 bash config.sh ...` on a small
synthetic set that the trainer generates itself: the loss falls and the
held-out verification accuracy rises well above the initial model's, at
sample rates 1.0 and 0.1. Also: a setup failure on one rank stops every rank,
and run.sh (mpirun) trains.
"""
import json
import os

import pytest

from launch import LEARNED_RUN, config_sh, run_command, small_synthetic_run

pytestmark = pytest.mark.xdist_group("learned")      # with the others using conftest.learned (conftest.py)


def launch(cmd, timeout, env=None):
    proc = run_command(cmd, timeout, env)
    return proc.returncode, proc.stdout


# (sample rate, images per rank per micro-batch, micro-batches per step): the same global batch of 32
@pytest.mark.parametrize("rate, batch, grad_accum", [LEARNED_RUN, (0.1, 8, 2)])
def test_two_ranks_learn_on_the_synthetic_set(request, tmp_path, rate, batch, grad_accum):
    if (rate, batch, grad_accum) == LEARNED_RUN:       # shared with the fine-tuning tests (conftest.learned)
        tmp_path, out = request.getfixturevalue("learned")
        code = 0
    else:
        code, out = launch(config_sh(*small_synthetic_run(tmp_path, "--sample_rate", rate, "--batch_size", batch,
                                                          "--grad_accum", grad_accum)), timeout=360)
    assert code == 0, out[-4000:]
    if grad_accum > 1:      # the logs say both: optimizer steps and micro-batches
        assert "global batch 32 = 8 x 2 ranks x 2 micro-batches" in out
        assert "step 120/120 (2 micro-batches each)" in out
    records = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    losses = [r["loss"] for r in records if "loss" in r]
    accuracy = [r["val/val/accuracy"] for r in records if "val/val/accuracy" in r]
    summary = records[-1]["summary"]
    assert len(losses) == 6 and min(losses[-2:]) < 0.8 * max(losses[:2]), losses
    # chance is 0.5; the untrained network scores ~0.65-0.7 on these pairs
    assert len(accuracy) == 2 and accuracy[1] >= 0.82 and accuracy[1] - accuracy[0] >= 0.1, accuracy
    print(f"rate {rate}: accuracy {accuracy[0]:.3f} -> {accuracy[1]:.3f}, loss {losses[0]:.2f} -> {losses[-1]:.2f}")
    assert summary["steps"] == 120
    # where a step's time goes (one timed step per log window): every part named, shares adding up to 1
    for record in (r for r in records if "loss" in r):
        shares = {key: value for key, value in record.items() if key.startswith("phase/")}
        assert set(shares) == {"phase/data", "phase/forward", "phase/head", "phase/backward", "phase/update"}
        assert abs(sum(shares.values()) - 1) < 1e-6 and min(shares.values()) >= 0, shares
    assert "| forward " in out and " head " in out and " update " in out
    # what a user gets: config, per-rank logs, events, an MXNet checkpoint of the backbone
    run = tmp_path / "run"
    assert json.load(open(run / "config.json"))["sample_rate"] == rate
    assert (run / "logs" / "rank0.log").exists() and (run / "logs" / "rank1.log").exists()
    assert os.listdir(run / "tensorboard")
    assert (run / "model-symbol.json").exists() and (run / "model-0000.params").exists()
    assert "sampled" in open(run / "logs" / "rank1.log").read()


def test_setup_failure_on_one_rank_stops_every_rank(tmp_path):
    # only rank 0 loads the verification sets: without agreement, rank 1 would wait forever
    code, out = launch(config_sh("--dataset", "speed-1m", "--num_classes", 1000, "--network", "r18-lite",
                                 "--batch_size", 4, "--max_update", 2, "--val_targets", tmp_path / "missing.bin",
                                 "--output", tmp_path / "run"), timeout=120)
    assert code != 0
    assert "missing.bin" in out
    assert "setup failed on rank(s) 0" in open(tmp_path / "run" / "logs" / "rank1.log").read()


def test_run_sh_trains_with_mpirun(tmp_path):
    cmd = ["bash", "run.sh", "--dataset", "speed-1m", "--num_classes", "5000", "--network", "r18-lite",
           "--batch_size", "4", "--max_update", "3", "--frequent", "1", "--output", str(tmp_path / "run")]
    code, out = launch(cmd, timeout=180, env={"NP": "2"})
    assert code == 0, out[-4000:]
    assert "step 3/3" in out and "2 rank(s)" in out


def test_waiting_ranks_stop_when_generation_failed(tmp_path):
    from mxnet_pfc.data import synthetic_set
    from mxnet_pfc.data.records import DataError

    wanted = dict(identities=500, images_per_identity=32, val_pairs=1000)
    (tmp_path / synthetic_set.OWNER).write_text("")        # local rank 0 claimed the folder, then failed
    (tmp_path / "FAILED").write_text("OSError: disk full\n")
    with pytest.raises(DataError, match="failed on local rank 0: OSError: disk full"):
        synthetic_set.ensure(str(tmp_path), **wanted, local_rank=1, wait_seconds=30)    # a rank that waits
    (tmp_path / "FAILED").unlink()
    with pytest.raises(DataError, match="did not appear within 1 s"):
        synthetic_set.ensure(str(tmp_path), **wanted, local_rank=1, wait_seconds=1)
