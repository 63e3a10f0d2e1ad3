"""A run's checkpoint files read without MXNet: state.json typed with the old formats' defaults, and the order.

runtime/checkpoints.py and runtime/failure_records.py are what the supervisor reads from outside the job:
they must load in a process that has no MXNet, and state.json must read back as it was written, each
field of an older format that did not write it carrying its documented meaning (docs/DESIGN.md 5.1).
"""
import json
import os
import subprocess
import sys

import pytest

from launch import REPO
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.errors import CheckpointError

RUN = checkpoints.RunState(steps_per_epoch=10, global_batch=16, max_update=50, samples_seen=480, num_images=160,
                           best={"lfw": {"accuracy": 0.9, "step": 20}}, config={"network": "r18", "seed": 3},
                           margin_state={"t": 0.1}, freeze_until_samples=64)


def write_checkpoint(root, name: str, state: dict) -> str:
    folder = os.path.join(root, name)
    os.makedirs(folder)
    with open(os.path.join(folder, checkpoints.STATE_FILE), "w") as f:
        json.dump(state, f)
    return folder


def test_a_state_reads_back_as_it_was_written(tmp_path):
    state = checkpoints.State.of(RUN, sequence=4, step=30, world_size=2, num_classes=40, embedding_size=8,
                                 subcenters=3, shards=[[0, 20], [20, 20]], saved_at="2026-11-26 18:00:00")
    state.write(str(tmp_path))
    assert checkpoints.State.read(str(tmp_path)) == state
    assert state.format == checkpoints.FORMAT_VERSION and state.network == "r18"


def test_a_format_1_state_gets_the_defaults_of_the_fields_it_did_not_write(tmp_path):
    """Format 1 wrote no sequence, samples_seen, subcenters, num_images, best, margin_state or freeze mark, and
    fields nobody reads (network, seed, epoch, next_lr), which are left out."""
    folder = write_checkpoint(tmp_path, "step-00000030", {
        "format": 1, "step": 30, "world_size": 2, "num_classes": 40, "embedding_size": 8,
        "shards": [[0, 20], [20, 20]], "steps_per_epoch": 10, "global_batch": 16, "max_update": 50,
        "config": {"network": "r18"}, "network": "r18", "seed": 1, "epoch": 3, "next_lr": 0.1})
    state = checkpoints.State.read(folder)
    assert (state.samples_seen, state.sequence, state.subcenters) == (30 * 16, 0, 1)
    assert (state.num_images, state.best, state.margin_state, state.freeze_until_samples) == (None, {}, None, None)
    [saved] = checkpoints.list_checkpoints(str(tmp_path))
    assert (saved.sequence, saved.step, saved.samples_seen, saved.world_size) == (0, 30, 480, 2)


def test_a_damaged_state_is_listed_as_unreadable_and_refused_by_name(tmp_path):
    good = checkpoints.State.of(RUN, sequence=1, step=10, world_size=1, num_classes=4, embedding_size=8,
                                shards=[[0, 4]])
    os.makedirs(tmp_path / "ckpt-000001-step-00000010")
    good.write(str(tmp_path / "ckpt-000001-step-00000010"))
    damaged = write_checkpoint(tmp_path, "ckpt-000002-step-00000020", {**json.loads(json.dumps(
        good.__dict__)), "step": 20, "sequence": 2, "shards": [[0, 3]]})       # 3 of the 4 classes
    newest = checkpoints.latest(str(tmp_path))
    assert newest.path == damaged and newest.describe() == "ckpt-000002-step-00000020 (step 20, state.json unreadable)"
    with pytest.raises(CheckpointError, match="field 'shards' does not split 4 classes over 1 ranks"):
        checkpoints.State.read(damaged)


def test_what_the_supervisor_reads_loads_without_mxnet():
    """In a fresh interpreter: the supervisor, the checkpoints' and the failure records' modules, and no MXNet."""
    code = ("import sys; import mxnet_pfc.runtime.supervisor, mxnet_pfc.runtime.checkpoints, "
            "mxnet_pfc.runtime.failure_records; print(sorted(m for m in sys.modules if m.split('.')[0] == 'mxnet'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_heads_of_several_sets_read_back_and_damaged_ones_are_refused_by_name(tmp_path):
    """Format 4 (a run of several sets): extra_heads reads back with State.heads() in set order; a head whose
    shards do not split its classes, a damaged class count, or extra heads in a format-3 file are refused,
    naming the field, before a resume could fill a bank from them."""
    heads = [{"num_classes": 6, "shards": [[0, 3], [3, 3]], "margin_state": {}},
             {"num_classes": 5, "shards": [[0, 3], [3, 2]], "margin_state": {"t": 0.2}}]
    state = checkpoints.State.of(RUN, sequence=1, step=10, world_size=2, num_classes=40, embedding_size=8,
                                 shards=[[0, 20], [20, 20]], extra_heads=heads)
    os.makedirs(tmp_path / "ok")
    state.write(str(tmp_path / "ok"))
    read = checkpoints.State.read(str(tmp_path / "ok"))
    assert read == state and read.format == checkpoints.SETS_FORMAT
    assert read.heads() == [(40, [[0, 20], [20, 20]]), (6, [[0, 3], [3, 3]]), (5, [[0, 3], [3, 2]])]
    assert checkpoints.head_folder("C", 0) == "C" and checkpoints.head_folder("C", 2) == os.path.join("C", "set-2")
    raw = json.loads((tmp_path / "ok" / checkpoints.STATE_FILE).read_text())
    damaged = {
        "extra_heads\\[1\\].shards' does not split 5 classes": {**raw, "extra_heads": [heads[0], {
            **heads[1], "shards": [[0, 3], [3, 1]]}]},
        "extra_heads\\[0\\] \\(set 1\\) has num_classes -6": {**raw, "extra_heads": [{**heads[0], "num_classes": -6}]},
        "field 'extra_heads' is .* in format 4 only": {**raw, "format": 3},
        "field 'extra_heads' is 7 ": {**raw, "extra_heads": 7},
    }
    for number, (message, fields) in enumerate(damaged.items()):
        folder = write_checkpoint(tmp_path, f"bad{number}", fields)
        with pytest.raises(CheckpointError, match=message):
            checkpoints.State.read(folder)
