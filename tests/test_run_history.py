"""A run's files and history: checkpoints that cannot run code, ordered by what they hold, never mixed runs.

Each test runs the trainer as users do (config.sh under horovodrun) on files
changed the way a person or an attacker would change them, starting from the
2-rank reference run (conftest.reference: 30 steps, a checkpoint every 8, the
newest 2 kept).
"""
import json
import os
import pickle
import shutil

import mxnet as mx
import numpy as np
import pytest

from launch import REFERENCE_RUN, ckpt, config_sh, losses, rank_stop_line, run_command, saved_steps, tiny_synthetic_run
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.errors import CheckpointError
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.training import checkpoint


def copy_checkpoint(run, step: int, output):
    """The reference run's checkpoint of `step`, copied into output/checkpoints/ under its own name."""
    source = ckpt(run / "checkpoints", step)
    target = output / "checkpoints" / source.name
    shutil.copytree(source, target)
    return target


def as_format_1(folder, legacy):
    """Checkpoint `folder` rewritten as the previous version (format 1) wrote it: a step-N folder and MXNet's
    pickled optimizer.states (Updater.get_states: {parameter index: momentum NDArray})."""
    shutil.copytree(folder, legacy)
    names = [n for n in mx.sym.load(str(legacy / "model-symbol.json")).list_arguments() if n != "data"]
    arrays = mx.nd.load(str(legacy / checkpoints.OPTIMIZER_FILE))
    (legacy / "optimizer.states").write_bytes(pickle.dumps({names.index(k): v for k, v in arrays.items()}))
    os.remove(legacy / checkpoints.OPTIMIZER_FILE)
    state = json.loads((legacy / "state.json").read_text())
    state["format"] = 1
    for added in ("sequence", "num_images"):
        state.pop(added)
    epoch, within = divmod(state["step"], state["steps_per_epoch"])      # what it wrote and nobody read
    state.update(network=state["config"]["network"], seed=state["config"]["seed"], epoch=epoch, next_lr=0.1,
                 data=dict(epoch=epoch, step_in_epoch=within))
    (legacy / "state.json").write_text(json.dumps(state))
    return legacy


def as_format_2(folder, copy):
    """Checkpoint `folder` as the version before format 3 wrote it: the same files, and state.json with format 2
    and the fields format 3 no longer writes (nobody read them)."""
    shutil.copytree(folder, copy)
    state = json.loads((copy / "state.json").read_text())
    epoch, within = divmod(state["step"], state["steps_per_epoch"])
    state.update(format=2, network=state["config"]["network"], seed=state["config"]["seed"], epoch=epoch,
                 next_lr=0.1, data=dict(epoch=epoch, step_in_epoch=within))
    (copy / "state.json").write_text(json.dumps(state))
    return copy


class RunsAShellCommand:
    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_a_crafted_optimizer_pickle_runs_nothing_and_is_refused_on_every_rank(reference, tmp_path):
    """The previous version unpickled optimizer.states with pickle.loads: this file ran `touch` on every rank,
    and the run resumed and finished with exit 0."""
    data, run = reference
    output = tmp_path / "run"
    legacy = as_format_1(ckpt(run / "checkpoints", 24), output / "checkpoints" / "step-00000024")
    marker = tmp_path / "the-pickle-ran"
    (legacy / "optimizer.states").write_bytes(pickle.dumps({0: RunsAShellCommand(f"touch {marker}")}))
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest")),
                       timeout=300)
    assert not marker.exists(), "the checkpoint ran a command"
    assert proc.returncode != 0, proc.stdout[-3000:]
    refusal = f"{legacy / 'optimizer.states'}: refused: refusing to load posix.system"
    for rank in (0, 1):
        assert refusal in (output / "logs" / f"rank{rank}.log").read_text(), rank
    assert saved_steps(output / "checkpoints") == [24]          # nothing written after it


def resumes_as_the_uninterrupted_run(data, run, output):
    """--resume latest from the one checkpoint in OUTPUT: steps 25-30 lose what the reference run lost."""
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest")),
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    expected, got = losses(run), losses(output)
    assert sorted(got) == list(range(25, 31))
    np.testing.assert_allclose([got[s] for s in got], [expected[s] for s in got], rtol=1e-5)


def test_a_format_1_checkpoint_still_resumes_exactly(reference, tmp_path):
    """Checkpoints of the version before issue 22 (pickled optimizer state) continue as the uninterrupted run."""
    data, run = reference
    output = tmp_path / "run"
    as_format_1(ckpt(run / "checkpoints", 24), output / "checkpoints" / "step-00000024")
    resumes_as_the_uninterrupted_run(data, run, output)
    # the new checkpoints come after the old one, and hold arrays only
    saved = checkpoints.list_checkpoints(str(output / "checkpoints"))
    assert [(c.sequence, c.step) for c in saved] == [(0, 24), (1, 30)]
    assert not (ckpt(output / "checkpoints", 30) / "optimizer.states").exists()


def test_a_format_2_checkpoint_still_resumes_exactly(reference, tmp_path):
    """Checkpoints of the version every user has today (format 2) continue as the uninterrupted run."""
    data, run = reference
    output = tmp_path / "run"
    old = ckpt(run / "checkpoints", 24)
    as_format_2(old, output / "checkpoints" / old.name)
    resumes_as_the_uninterrupted_run(data, run, output)
    newest = checkpoints.latest(str(output / "checkpoints"))
    assert newest.step == 30 and json.loads(open(os.path.join(newest.path, "state.json")).read())["format"] == 3


def test_checkpoints_after_a_larger_batch_are_kept_and_picked_as_latest(reference, tmp_path):
    """Resumed with twice the batch, steps are renumbered downwards (step 30 of 16 images = step 15 of 32).
    Ordered by step label, every new checkpoint (16, 20, 24, 28 < 30) was pruned as it was written, and
    --resume latest went back to the checkpoint before the resume."""
    data, run = reference
    output = tmp_path / "run"
    copy_checkpoint(run, 30, output)
    args = tiny_synthetic_run(data, output, *REFERENCE_RUN, "--batch_size", 16, "--max_update", 28,
                              "--save_interval", 4, "--keep_checkpoints", 1, "--verbose", 100)
    proc = run_command(config_sh(*args, "--resume", "latest"), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert saved_steps(output / "checkpoints") == [28]
    newest = checkpoints.latest(str(output / "checkpoints"))
    assert "at step 15, epoch 1" in proc.stdout
    assert "global batch 16 -> 32: step 30 is step 15 here" in proc.stdout, proc.stdout[-3000:]
    assert (newest.step, newest.samples_seen, newest.world_size) == (28, 30 * 16 + 13 * 32, 2)
    assert f"checkpoint {newest.path} written" in proc.stdout
    assert "896 samples seen, step 28 on 2 rank(s)" in proc.stdout
    # and --resume latest continues from it, not from the pre-resume state
    again = run_command(config_sh(*args, "--max_update", 30, "--resume", "latest"), timeout=300)
    assert again.returncode == 0, again.stdout[-4000:]
    assert f"resuming from {newest.path} ({newest.samples_seen:,} samples seen" in again.stdout


def test_the_same_command_twice_never_mixes_two_runs(reference, tmp_path):
    """The previous version started afresh over the earlier run: its metrics were dropped, and its own new
    checkpoints were pruned as written (the old ones sorted above them)."""
    data, _ = reference
    output = tmp_path / "run"
    command = config_sh(*tiny_synthetic_run(data, output, "--max_update", 6, "--save_interval", 3,
                                            "--val_targets", ""))
    first = run_command(command, timeout=300)
    assert first.returncode == 0, first.stdout[-4000:]
    metrics = (output / "metrics.jsonl").read_bytes()
    saved = sorted(os.listdir(output / "checkpoints"))
    run_files = {os.path.basename(path) for path in RunFolder(str(output)).run_files()}
    assert set(os.listdir(output)) <= run_files      # --start_over knows all a run writes

    second = run_command(command, timeout=300)
    assert second.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(second.stdout, rank) or (output / "logs" / f"rank{rank}.log").read_text()
        assert f"{output} holds a run (its newest checkpoint: ckpt-000002-step-00000006" in line, second.stdout[-3000:]
        assert "--resume latest" in line and "--start_over true" in line, line
    assert (output / "metrics.jsonl").read_bytes() == metrics and sorted(os.listdir(output / "checkpoints")) == saved

    third = run_command(command + ["--start_over", "true"], timeout=300)
    assert third.returncode == 0, third.stdout[-4000:]
    earlier = list((output / "earlier-runs").iterdir())
    assert len(earlier) == 1 and sorted(os.listdir(earlier[0] / "checkpoints")) == saved
    assert (earlier[0] / "metrics.jsonl").read_bytes() == metrics
    assert f"moved to {earlier[0]}" in third.stdout
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    assert [r["step"] for r in records if "loss" in r] == [6]       # the new run's own record, once
    assert saved_steps(output / "checkpoints") == [3, 6]


@pytest.mark.parametrize("edit,message", [
    (lambda s: s.update(steps_per_epoch=0), "field 'steps_per_epoch' is 0 (missing or damaged; expected int >= 1)"),
    (lambda s: s.pop("shards"), "field 'shards' is None (missing or damaged; expected list)"),
    (lambda s: s.update(step="24"), "field 'step' is '24' (missing or damaged; expected int >= 0)"),
    (lambda s: s.update(shards=[[0, 20], [20, 10]]), "field 'shards' does not split 40 classes over 2 ranks"),
])
def test_an_edited_state_json_is_refused_naming_the_field(reference, tmp_path, edit, message):
    data, run = reference
    output = tmp_path / "run"
    saved = copy_checkpoint(run, 24, output)
    state = json.loads((saved / "state.json").read_text())
    edit(state)
    (saved / "state.json").write_text(json.dumps(state))
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest")),
                       timeout=300)
    assert proc.returncode != 0
    for rank in (0, 1):
        log = (output / "logs" / f"rank{rank}.log").read_text()
        assert f"{saved / 'state.json'}: {message}" in log, log[-2000:]
        assert "a defect of ours" not in log and "Traceback" not in log


def test_a_center_file_with_too_few_rows_is_refused_naming_it(reference, tmp_path):
    data, run = reference
    output = tmp_path / "run"
    saved = copy_checkpoint(run, 24, output)
    np.save(saved / "centers-rank00001.npy", np.load(saved / "centers-rank00001.npy")[:5])
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest")),
                       timeout=300)
    assert proc.returncode != 0
    message = (f"{saved / 'centers-rank00001.npy'}: float32 array of shape (5, 128); state.json's shards give "
               f"saved rank 1 float32 rows of shape (20, 128)")
    log = (output / "logs" / "rank1.log").read_text()
    assert message in log and "a defect of ours" not in log, log[-2000:]


def test_a_seed_changed_within_an_epoch_is_refused(reference, tmp_path):
    """The seed orders each epoch's images: another seed 4 steps into epoch 1 would show some twice, some never."""
    data, run = reference
    output = tmp_path / "run"
    copy_checkpoint(run, 24, output)
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest",
                                                     "--seed", 7)), timeout=300)
    assert proc.returncode != 0
    line = rank_stop_line(proc.stdout, 0) or (output / "logs" / "rank0.log").read_text()
    assert "--seed 7: checkpoint" in line and "was trained with --seed 0, 4 steps into an epoch" in line, line
    assert "Resume with --seed 0" in line


def test_a_pickled_center_file_runs_nothing_and_is_refused_naming_it(tmp_path):
    """np.load never unpickles: an object array saved as centers-rank00000.npy is refused, its code not run."""
    from mxnet_pfc.head.memory_bank import MemoryBank
    marker = tmp_path / "the-pickle-ran"
    np.save(tmp_path / "centers-rank00000.npy", np.array([RunsAShellCommand(f"touch {marker}")], dtype=object),
            allow_pickle=True)
    np.save(tmp_path / "momentum-rank00000.npy", np.zeros((4, 8), np.float32))
    bank = MemoryBank(4, 8, 0, 1, mx.cpu(), ops=None)
    with pytest.raises(CheckpointError, match=r"centers-rank00000.npy: .*Python objects"):
        bank.load(str(tmp_path), [[0, 4]])
    assert not marker.exists()


class Reduces:
    """Pickles as whatever __reduce__ returns: the hand-made pickles an attacker would write."""

    def __init__(self, reduced):
        self.reduced = reduced

    def __reduce__(self):
        return self.reduced


@pytest.mark.parametrize("state,why", [
    (Reduces((mx.nd.NDArray, (None,))), "an NDArray without its bytes"),      # REDUCE, no BUILD: a NULL handle
    (b"\x80\x02}K\x00cmxnet.ndarray.ndarray\nNDArray\n)\x81s.", "an NDArray without its bytes"),   # NEWOBJ
    (Reduces((bytearray, (2 ** 34,))), r"bytearray\(int\) is not bytes the file holds"),    # 16 GB asked for
    (Reduces((mx.nd.NDArray, (12345,))), "an NDArray built from a handle"),
    ("text", "state of 'w' is a str"),
])
def test_the_format_1_loader_builds_arrays_only(tmp_path, state, why):
    """Pickles that name only the allowed globals yet are no arrays: each refused with a reason, none crashes
    the process (a NULL NDArray segfaulted), allocates what the file does not hold, or raises a traceback."""
    file = tmp_path / "optimizer.states"
    file.write_bytes(state if isinstance(state, bytes) else pickle.dumps({0: state}))
    with pytest.raises(pickle.UnpicklingError, match=why):
        checkpoint._legacy_optimizer_arrays(str(file), ["w"])
