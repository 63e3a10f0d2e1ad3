"""Several sets, one backbone, one head per set, through config.sh on 2 ranks: trained, checkpointed, resumed.

Two RecordIO sets and an image folder (--rec A --images C --rec B) train under one backbone: each set its
own Partial FC head over its own classes, its rows of every batch, its loss weighted into the sum (the
logged loss is the weighted sum of the sets' losses, each logged too). A checkpoint holds every head
(format 4: set S's bank in set-S/); resumed on the same ranks the run continues bit for bit, and on 1 or 3
ranks every head's centers and momentum are restored bit for bit (re-sharded) and the run trains on. Every
set's head starts from a run of as many sets, or each from its own (--init_centers, one per set); the clean
command judges a set with its own head (--set). A resume
with other sets, and options that do not fit several sets, are refused naming the field. (The head's
numbers against float64: test_set_heads.)
"""
import json
import shutil

import numpy as np
import pytest

from launch import REPO, TOY, ckpt, config_sh, run_command, run_ranks
from mxnet_pfc.data import synthetic_set
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.errors import ConfigError
from mxnet_pfc.training import config as config_lib
from test_own_data import write_folder_set

WEIGHTS = (1.0, 0.5, 2.0)


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    """(A, B, C): synthetic RecordIO sets of 40 and 24 identities x 8 images, a folder of 12 x 6 images."""
    root = tmp_path_factory.mktemp("sets")
    synthetic_set.generate(str(root / "A"), 40, 8, val_identities=10, val_pairs=100, seed=0)
    synthetic_set.generate(str(root / "B"), 24, 8, val_identities=10, val_pairs=100, seed=1)
    return root / "A", root / "B", write_folder_set(root / "C", identities=12, per_identity=6, seed=2)


def options(sets, output, *extra) -> list:
    a, b, c = sets
    return [*TOY, "--rec", a / "train.rec", "--images", c, "--rec", b / "train.rec", "--val_targets",
            a / "val.bin", "--batch_size", 8, "--lr_base_batch", 16, "--warmup_epochs", 0.1, "--max_update", 12,
            "--save_interval", 6, "--frequent", 1, "--set_weights", ",".join(map(str, WEIGHTS)),
            "--output", output, *extra]


def records(output) -> dict:
    """{step: record} of rank 0's metrics.jsonl progress records."""
    return {r["step"]: r for r in map(json.loads, open(output / "metrics.jsonl")) if "loss" in r}


@pytest.fixture(scope="module")
def whole(sets, tmp_path_factory):
    output = tmp_path_factory.mktemp("whole") / "run"
    proc = run_command(config_sh(*options(sets, output)), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return output, proc.stdout


def test_three_sets_train_each_with_its_own_head_and_every_head_is_checkpointed(whole):
    output, stdout = whole
    for number, classes in enumerate((40, 12, 24)):
        assert f"set {number}: PartialFC(rank 0/2, classes [0, {classes // 2}) of {classes}" in stdout
    assert "loss weight 0.5" in stdout and "sets' losses" in stdout
    steps = records(output)
    assert sorted(steps) == list(range(1, 13))
    for record in steps.values():       # the loss trained is the weighted sum of the sets' own
        parts = [record[f"loss/set{number}"] for number in range(3)]
        assert record["loss"] == pytest.approx(sum(w * v for w, v in zip(WEIGHTS, parts)), rel=1e-5)
    state = checkpoints.State.read(str(ckpt(output / "checkpoints", 12)))
    assert state.format == checkpoints.SETS_FORMAT and [n for n, _ in state.heads()] == [40, 12, 24]
    assert state.heads()[2][1] == [[0, 12], [12, 12]]
    for number in (1, 2):
        folder = checkpoints.head_folder(str(ckpt(output / "checkpoints", 12)), number)
        assert np.load(f"{folder}/centers-rank00001.npy").shape == (state.heads()[number][0] // 2, 128)
    assert (output / "model-symbol.json").exists() and "verification of the exported model: val" in stdout


def test_a_resume_on_the_same_ranks_continues_bit_for_bit(sets, whole, tmp_path):
    output, _ = whole
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt(output / "checkpoints", 6), resumed / "checkpoints" / ckpt(output / "checkpoints", 6).name)
    proc = run_command(config_sh(*options(sets, resumed, "--resume", "latest")), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    expected, got = records(output), records(resumed)
    assert sorted(got) == list(range(7, 13))
    keys = ["loss", "loss/set0", "loss/set1", "loss/set2"]
    assert {s: [got[s][k] for k in keys] for s in got} == {s: [expected[s][k] for k in keys] for s in got}


def saved_rows(folder, number: int, kind: str) -> np.ndarray:
    state = checkpoints.State.read(str(folder))
    where = checkpoints.head_folder(str(folder), number)
    return np.concatenate([np.load(f"{where}/{kind}-rank{r:05d}.npy") for r in range(state.world_size)])


@pytest.mark.parametrize("world", [1, 3])
def test_a_resume_on_another_world_size_restores_every_head_bit_for_bit(sets, whole, tmp_path, world):
    output, _ = whole
    saved = ckpt(output / "checkpoints", 6)
    resumed = tmp_path / "resumed"
    shutil.copytree(saved, resumed / "checkpoints" / saved.name)
    rows = tmp_path / "rows"
    rows.mkdir()
    proc = run_ranks(world, [REPO / "tests" / "set_resume_worker.py", rows,
                             *options(sets, resumed, "--resume", "latest")], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for number in range(3):
        for kind in ("centers", "momentum"):
            restored = np.concatenate([np.load(rows / f"set{number}-{kind}-{r}.npy") for r in range(world)])
            assert np.array_equal(restored, saved_rows(saved, number, kind)), (number, kind)
    if world == 3:          # and the run trains on from there, on 3 ranks
        proc = run_command(config_sh(*options(sets, resumed, "--resume", "latest"), ranks=3), timeout=300)
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert "(96 samples seen, step 6 on 2 rank(s)) at step 4" in proc.stdout
        assert checkpoints.State.read(str(checkpoints.latest(str(resumed / "checkpoints")).path)).heads()[1][1] == \
            [[0, 4], [4, 4], [8, 4]]


def test_a_resume_with_other_sets_is_refused_on_every_rank(sets, whole, tmp_path):
    output, _ = whole
    a, b, _ = sets
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt(output / "checkpoints", 6), resumed / "checkpoints" / ckpt(output / "checkpoints", 6).name)
    proc = run_command(config_sh(*TOY, "--rec", a / "train.rec", "--rec", b / "train.rec", "--batch_size", 8,
                                 "--max_update", 12, "--output", resumed, "--resume", "latest"), timeout=300)
    assert proc.returncode != 0
    for rank in (0, 1):
        log = (resumed / "logs" / f"rank{rank}.log").read_text()
        assert "it trained 3 set(s), this run 2" in log, rank


def test_repeated_sets_fill_extra_sets_in_order_and_what_does_not_fit_several_sets_is_refused(sets, tmp_path):
    a, b, c = sets
    cfg = config_lib.parse_args(["--rec", str(a / "train.rec"), "--images", str(c), "--rec", str(b / "train.rec")])
    assert (cfg.rec, cfg.images) == (str(a / "train.rec"), "")
    assert cfg.extra_sets == (f"images:{c}", f"rec:{b / 'train.rec'}")
    assert cfg.output.endswith("A+C+B_r50_arcface") and cfg.recipe == config_lib.RECIPE_FOR_OWN_DATA
    first_images = config_lib.parse_args(["--images", str(c), "--rec", str(a / "train.rec")])
    assert (first_images.images, first_images.rec, first_images.extra_sets) == (str(c), "", (f"rec:{a}/train.rec",))
    two = ["--rec", str(a / "train.rec"), "--rec", str(b / "train.rec")]
    refused = {
        "set_weights": [*two, "--set_weights", "1"],
        "set_shares": [*two, "--set_shares", "1,0"],
        "init_centers": [*two, "--init_centers", "random,imprint,random"],
        "extra_sets": ["--rec", str(a / "train.rec"), "--rec", str(a / "train.rec")],
        "--rec ''": ["--rec", "", "--rec", str(b / "train.rec")],
    }
    for field, argv in refused.items():
        with pytest.raises(ConfigError, match=field):
            config_lib.parse_args(argv)
    with pytest.raises(ConfigError, match="set_weights"):     # weights without several sets
        config_lib.parse_args(["--rec", str(a / "train.rec"), "--set_weights", "1"])
    resolved = config_lib.resolve_config(config_lib.parse_args(two), world=2)
    assert (resolved.num_classes, resolved.extra_classes) == (40, (24,))
    with pytest.raises(ConfigError, match=r"extra_classes \(set 1\) = 20 was given, but the set states 24"):
        config_lib.resolve_config(config_lib.parse_args([*two, "--extra_classes", "20"]), world=2)


def started_rows(rows, world: int, number: int, kind: str = "centers") -> np.ndarray:
    return np.concatenate([np.load(rows / f"set{number}-{kind}-{r}.npy") for r in range(world)])


def test_starting_centers_for_every_set_from_a_run_of_as_many_sets_or_one_each(sets, whole, tmp_path):
    """--init_centers FOLDER of a run of 3 sets starts each set's head from its own (re-sharded onto 3 ranks, bit
    for bit); one per set, comma-separated: random, a run of InsightFace's Partial FC, imprint; a folder of
    another number of sets is refused naming both counts."""
    import insightface_files as theirs
    from mxnet_pfc.training import starting_point

    output, _ = whole
    saved = ckpt(output / "checkpoints", 12)
    rows = tmp_path / "all"
    rows.mkdir()
    proc = run_ranks(3, [REPO / "tests" / "set_resume_worker.py", rows,
                         *options(sets, tmp_path / "from-all", "--init_centers", saved)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for number in range(3):
        for kind in ("centers", "momentum"):
            assert np.array_equal(started_rows(rows, 3, number, kind), saved_rows(saved, number, kind)), number

    theirs_run = theirs.write_partial_fc_run(tmp_path / "pfc", 12, 3, 128, seed=5)
    rows = tmp_path / "each"
    rows.mkdir()
    each = f"random,{tmp_path / 'pfc'},imprint"
    proc = run_ranks(2, [REPO / "tests" / "set_resume_worker.py", rows,
                         *options(sets, tmp_path / "from-each", "--init_centers", each)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert np.array_equal(started_rows(rows, 2, 1), theirs_run["centers"])          # set 1 (the folder C)
    assert np.allclose(np.linalg.norm(started_rows(rows, 2, 2), axis=1), 1, atol=1e-5)     # imprinted: unit rows
    assert np.linalg.norm(started_rows(rows, 2, 0), axis=1).max() < 0.5          # random: N(0, 0.01) rows
    with pytest.raises(checkpoints.CheckpointError, match="holds the heads of 3 set.s., and this run starts 1"):
        starting_point.read_centers(str(saved), 40, 128, 1, 0, 40)
    with pytest.raises(ConfigError, match=r"init_centers = .*one per set \(3\)"):
        config_lib.parse_args([str(a) for a in options(sets, tmp_path / "x", "--init_centers", "random,imprint")])


def test_a_set_of_the_run_is_cleaned_with_its_own_head(sets, whole, tmp_path):
    """python -m mxnet_pfc.clean RUN --rec B --set 2: set B's head judges B's images (every one, once); a set
    number the run does not have is refused naming the sets it has."""
    output, _ = whole
    _, b, _ = sets
    proc = run_ranks(2, ["-m", "mxnet_pfc.clean", output, "--rec", b / "train.rec", "--set", 2,
                         "--out", tmp_path / "clean"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = json.loads((tmp_path / "clean" / "report.json").read_text())
    assert (report["images"], report["classes"]) == (24 * 8, 24)
    proc = run_ranks(2, ["-m", "mxnet_pfc.clean", output, "--rec", b / "train.rec", "--set", 3,
                         "--out", tmp_path / "none"], timeout=240)
    assert proc.returncode != 0 and "--set 3: the run" in proc.stdout and "trained 3 set(s), 0 .. 2" in proc.stdout
