"""Checkpoints: exact resume on 2 ranks, re-sharding 2 -> 3 ranks, refusals, and the pure helpers.

One uninterrupted 2-rank run (30 steps, a checkpoint every 8, the newest 2
kept) is the reference. Its step-24 checkpoint, copied to a fresh output
folder, is resumed: the losses of steps 25-30, the final verification and the
final centers must be those of the uninterrupted run.
"""
import json
import os
import re
import shutil
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from launch import REFERENCE_RUN as RUN
from launch import REPO, ckpt, config_sh, final_summary, losses, run_command, run_ranks, saved_steps, tiny_synthetic_run
from mxnet_pfc.head import memory_bank
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.runtime import checkpoints, files
from mxnet_pfc.runtime.errors import CheckpointError


def test_checkpoints_are_written_and_pruned(reference):
    _, run = reference
    root = run / "checkpoints"
    assert saved_steps(root) == [24, 30]          # 8 and 16 pruned: keep 2
    assert not [name for name in os.listdir(root) if name.endswith(".tmp")]
    state = checkpoints.State.read(ckpt(root, 24))
    assert (state.step, state.world_size, state.num_classes) == (24, 2, 40)
    assert state.shards == [[0, 20], [20, 20]] and state.steps_per_epoch == 20
    assert state.best["val"]["step"] in (10, 20)           # verification at 10 and 20 so far
    assert ckpt(root, 24).name == "ckpt-000003-step-00000024" and state.sequence == 3
    names = set(os.listdir(ckpt(root, 24)))
    for expected in ("model-symbol.json", "model-0000.params", "model-average-symbol.json",
                     "model-average-0000.params", "optimizer-states.params", "state.json", "centers-rank00000.npy",
                     "momentum-rank00001.npy", "aux-rank00001.params"):
        assert expected in names
    # the exported model and its verification figures
    assert (run / "model-symbol.json").exists() and (run / "model-verification.json").exists()
    assert "cosine_threshold" in json.load(open(run / "model-verification.json"))["val"]


def test_state_json_holds_exactly_the_fields_design_lists(reference):
    """docs/DESIGN.md 5.1's table of state.json's fields is what a checkpoint holds: no field written that the
    table does not name (with its reader), none named that is gone."""
    _, run = reference
    written = set(json.loads((ckpt(run / "checkpoints", 24) / "state.json").read_text()))
    design = (REPO / "docs" / "DESIGN.md").read_text()
    table = design[design.index("| field | written by | read by, for |"):]
    rows = table[:table.index("\n\n")].splitlines()[2:]
    listed = {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}
    assert written == listed


def test_resume_continues_exactly_as_the_uninterrupted_run(reference, tmp_path):
    data, run = reference
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt(run / "checkpoints", 24), resumed / "checkpoints" / ckpt(run / "checkpoints", 24).name)
    proc = run_command(config_sh(*tiny_synthetic_run(data, resumed, *RUN, "--resume", "latest")), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "resuming from" in proc.stdout and "at step 24, epoch 1" in proc.stdout
    expected, got = losses(run), losses(resumed)
    assert sorted(got) == list(range(25, 31))
    # Same data order, same sampled negatives (the RNG is re-seeded at checkpoints), same
    # optimizer states: on CPU the floats come out identical; allow for reduction order.
    np.testing.assert_allclose([got[s] for s in got], [expected[s] for s in got], rtol=1e-5)
    a, b = final_summary(run)["verification"]["val"], final_summary(resumed)["verification"]["val"]
    assert a["accuracy"] == pytest.approx(b["accuracy"], abs=1e-9) and a["xnorm"] == pytest.approx(b["xnorm"], rel=1e-5)
    for name in ("centers-rank00001.npy", "momentum-rank00000.npy"):
        np.testing.assert_allclose(np.load(ckpt(resumed / "checkpoints", 30) / name),
                                   np.load(ckpt(run / "checkpoints", 30) / name), rtol=1e-5, atol=1e-7)


def test_two_rank_checkpoint_resharded_onto_three_ranks_keeps_every_center(reference, tmp_path):
    _, run = reference
    saved = ckpt(run / "checkpoints", 24)
    proc = run_ranks(3, [REPO / "tests" / "reshard_worker.py", saved, tmp_path], timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for kind in ("centers", "momentum"):
        before = np.concatenate([np.load(saved / f"{kind}-rank{r:05d}.npy") for r in range(2)])
        after = np.concatenate([np.load(tmp_path / f"{kind}-{r}.npy") for r in range(3)])
        assert after.shape == (40, 128) and np.array_equal(after, before), kind


def test_trainer_resumes_onto_three_ranks(reference, tmp_path):
    data, run = reference
    resumed = tmp_path / "three"
    shutil.copytree(ckpt(run / "checkpoints", 24), resumed / "checkpoints" / ckpt(run / "checkpoints", 24).name)
    # 3 x 8 = 24 images a step: 13 steps per epoch; 4 steps into epoch 1 at 16 = 2.67 steps of 24:
    # resumed at step 13 + 2 = 15
    proc = run_command(config_sh(*tiny_synthetic_run(data, resumed, *RUN, "--resume", "24"), ranks=3), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "step 24 on 2 rank(s)) at step 15, epoch 1" in proc.stdout
    assert "ranks 2 -> 3: centers and momentum re-sharded" in proc.stdout
    # the run's length is kept in samples too: 30 steps of 16 = 480 samples = 20 steps of 24
    assert "kept in samples" in proc.stdout and sorted(losses(resumed)) == list(range(16, 21))
    final = checkpoints.State.read(ckpt(resumed / "checkpoints", 20))
    assert final.world_size == 3 and final.shards == [[0, 14], [14, 13], [27, 13]]


def test_mismatched_checkpoint_is_refused_on_every_rank(reference, tmp_path):
    data, run = reference
    saved = ckpt(run / "checkpoints", 30)
    args = tiny_synthetic_run(data, tmp_path / "bad", "--max_update", 4, "--resume", saved,
                              "--num_classes", 48, "--synthetic_identities", 0, "--embedding_size", 64)
    proc = run_command(config_sh(*args), timeout=180)
    assert proc.returncode != 0
    message = "it has 40 classes, the configuration 48 (num_classes); its embedding size is 128, the configuration's 64"
    for rank in (0, 1):
        assert message in open(tmp_path / "bad" / "logs" / f"rank{rank}.log").read()


def test_resume_without_checkpoint_names_the_problem(tmp_path):
    proc = run_command([sys.executable, "-m", "mxnet_pfc.train", "--dataset", "speed-1m", "--network", "r18-lite",
                        "--num_classes", 100, "--output", tmp_path, "--resume", "latest"], timeout=120)
    assert proc.returncode == 1 and "--resume latest: no complete checkpoint in" in proc.stdout



def test_a_failed_export_still_leaves_the_final_checkpoint(tmp_path):
    """The final centers exist only in the final checkpoint: an export that fails must not lose them."""
    (tmp_path / "model-0000.params").mkdir(parents=True)        # the export cannot put its file there
    proc = run_command([sys.executable, "-m", "mxnet_pfc.train", "--dataset", "speed-1m", "--network", "r18-lite",
                        "--num_classes", 100, "--batch_size", 4, "--max_update", 2, "--output", tmp_path],
                       timeout=120)
    assert proc.returncode == 1 and "IsADirectoryError" in proc.stdout, proc.stdout[-3000:]
    assert saved_steps(tmp_path / "checkpoints") == [2]
    assert "the final checkpoint" in proc.stdout and "the model for inference is not" in proc.stdout


# ------------------------------------------------------------------ pure helpers, one process

@pytest.mark.parametrize("classes", [7, 40, 1001])
@pytest.mark.parametrize("old_world,new_world", [(1, 3), (2, 3), (3, 2), (4, 1), (5, 7)])
def test_shard_overlaps_cover_every_class_once(classes, old_world, new_world):
    shards = [list(shard_range(classes, r, old_world)) for r in range(old_world)]
    old = np.arange(classes)
    covered = []
    for rank in range(new_world):
        start, count = shard_range(classes, rank, new_world)
        rows = np.full(count, -1)
        for old_rank, old_row, new_row, n in memory_bank.shard_overlaps(shards, start, count):
            rows[new_row:new_row + n] = old[shards[old_rank][0] + old_row:shards[old_rank][0] + old_row + n]
        assert np.array_equal(rows, np.arange(start, start + count))
        covered.extend(rows)
    assert sorted(covered) == list(range(classes))


def test_shard_overlaps_refuse_a_gap():
    with pytest.raises(CheckpointError, match="cover 5 of the 10 classes"):
        memory_bank.shard_overlaps([[0, 5]], 0, 10)


def test_resume_position():
    state = SimpleNamespace(step=24, steps_per_epoch=20, global_batch=16)     # the fields it reads of a State
    assert checkpoints.resume_position(state, 20, 16) == (24, 1)
    # 3 ranks: 13 steps per epoch of 24 images; 4 steps of 16 = 64 images = 2 steps of 24 (floor)
    assert checkpoints.resume_position(state, 13, 24) == (15, 1)
    # 1 rank: 40 steps per epoch of 8; 4 x 16 = 8 steps of 8
    assert checkpoints.resume_position(state, 40, 8) == (48, 1)


def test_locate_ignores_partial_and_unfinished_folders(tmp_path):
    os.makedirs(tmp_path / "ckpt-000001-step-00000010")
    (tmp_path / "ckpt-000001-step-00000010" / "state.json").write_text("{}")
    os.makedirs(tmp_path / "ckpt-000002-step-00000020.tmp")     # a save that crashed
    os.makedirs(tmp_path / "ckpt-000003-step-00000030")         # no state.json: never published
    assert saved_steps(tmp_path) == [10]
    assert checkpoints.locate(str(tmp_path), "latest").endswith("ckpt-000001-step-00000010")
    with pytest.raises(CheckpointError, match=r"no complete checkpoint at step 30 .*\(complete: "
                                                         r"ckpt-000001-step-00000010 \(step 10, state.json unreadable"):
        checkpoints.locate(str(tmp_path), "30")
    with pytest.raises(CheckpointError, match="format None"):
        checkpoints.State.read(str(tmp_path / "ckpt-000001-step-00000010"))


def test_check_params_names_the_difference():
    import mxnet as mx
    saved = {"fc1_weight": mx.nd.zeros((128, 256)), "old_bias": mx.nd.zeros((3,))}
    expected = {"fc1_weight": (512, 256), "conv_weight": (8, 3, 3, 3)}
    with pytest.raises(CheckpointError) as error:
        checkpoints.check_params(saved, expected, "ckpt", "r50")
    text = str(error.value)
    assert "missing conv_weight" in text and "unexpected old_bias" in text
    assert "fc1_weight: (128, 256) in the checkpoint, (512, 256) in r50" in text


def test_atomic_path_leaves_nothing_behind_on_failure(tmp_path):
    target = tmp_path / "state.json"
    with pytest.raises(RuntimeError):
        with files.atomic_path(str(target)) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("crash while writing")
    assert os.listdir(tmp_path) == []


def test_a_chain_of_resumes_keeps_the_first_runs_length():
    """--max_update 48 on 1 rank (batch 8), resumed on 2 ranks (24 steps of 16), resumed again on 2:
    still 24 steps. (The second resume read --max_update again and trained to step 48: twice as long.)"""
    from mxnet_pfc.training import config as config_lib
    from mxnet_pfc.training.run_length import planned_max_update
    cfg = config_lib.parse_args(["--max_update", "48", "--output", "/tmp/unused"])
    first = SimpleNamespace(max_update=48, global_batch=8, config={"max_update": 48})     # what it reads of a State
    assert planned_max_update(cfg, 20, 16, first)[0] == 24
    second = SimpleNamespace(max_update=24, global_batch=16, config={"max_update": 48})
    assert planned_max_update(cfg, 20, 16, second)[0] == 24
    assert planned_max_update(cfg, 20, 8, second)[0] == 48
