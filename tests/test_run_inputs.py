"""What a run reads from files and options, checked (issue 33, item 8).

Messages that quote a file's content stay short whatever the file holds, state.json's shards must tile the
classes, and --start_over sees through symlinks into OUTPUT."""
import json
import os
import re
import shutil
import sys
from types import SimpleNamespace

import pytest

from launch import REFERENCE_RUN, ckpt, config_sh, run_command, tiny_synthetic_run
from mxnet_pfc.runtime import checkpoints, errors
from mxnet_pfc.runtime.errors import CheckpointError, ConfigError
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import resume

BOUND = 1000         # characters: a message quoting a megabyte value stays below this


def write_state(folder, **fields) -> None:
    """A state.json whose fields read_state checks, at a 2-rank, 40-class checkpoint's values unless given."""
    state = {"format": 3, "step": 24, "world_size": 2, "num_classes": 40, "embedding_size": 128,
             "global_batch": 16, "steps_per_epoch": 20, "max_update": 30, "shards": [[0, 20], [20, 20]],
             "config": {"network": "r18-lite"}, **fields}
    folder.mkdir(exist_ok=True)
    (folder / "state.json").write_text(json.dumps(state))


def test_quoted_values_are_cut_saying_how_long_they_were():
    quoted = errors.quoted
    assert quoted("model,3") == "'model,3'" and quoted([0, 20]) == "[0, 20]"
    assert quoted("a" * 10**6) == repr("a" * 200) + "... (1,000,000 characters)"
    assert quoted(list(range(10**6))) == "[0, 1, 2, 3, 4, 5, 6, 7, ...] (1,000,000 items)"
    nested = []
    for _ in range(100_000):            # deeper than repr() can go
        nested = [nested]
    assert quoted(nested) == "[[[[...]]]]"
    assert len(quoted({str(k) * 100: k for k in range(10**4)})) <= 203


@pytest.mark.parametrize("shards,classes", [
    ([[0, 5], [0, 5], [10, 50]], 60),      # the issue's: rows 5..9 were left unset
    ([[0, 20], [0, 20]], 40),              # an overlap whose counts add up
    ([[0, 5], [10, 45]], 50),              # a gap
    ([[20, 20], [0, 20]], 40),             # not in rank order
    ([[0, 40], [40, 0]], 40),              # an empty shard (shard_range never gives one)
])
def test_shards_that_do_not_tile_the_classes_are_refused_naming_them(tmp_path, shards, classes):
    write_state(tmp_path, shards=shards, world_size=len(shards), num_classes=classes)
    with pytest.raises(CheckpointError) as refused:
        checkpoints.State.read(str(tmp_path))
    assert str(refused.value) == (f"{tmp_path / 'state.json'}: field 'shards' does not split {classes} classes over "
                                  f"{len(shards)} ranks (rank r's [first class, count], contiguous from 0, none "
                                  f"empty): {shards}")


def test_shards_as_the_trainer_writes_them_are_read(tmp_path):
    write_state(tmp_path, shards=[[0, 14], [14, 13], [27, 13]], world_size=3)
    assert checkpoints.State.read(str(tmp_path)).shards == [[0, 14], [14, 13], [27, 13]]


def test_a_resume_onto_one_rank_refuses_overlapping_shards(reference, tmp_path):
    """[[0, 20], [0, 20]] for 40 classes: on one rank every class was covered by count, and rows 20..39 stayed
    uninitialised memory; the run went on."""
    data, run = reference
    output = tmp_path / "run"
    saved = output / "checkpoints" / ckpt(run / "checkpoints", 24).name
    shutil.copytree(ckpt(run / "checkpoints", 24), saved)
    state = json.loads((saved / "state.json").read_text())
    (saved / "state.json").write_text(json.dumps({**state, "shards": [[0, 20], [0, 20]]}))
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest"), ranks=1),
                       timeout=300)
    assert proc.returncode != 0
    log = (output / "logs" / "rank0.log").read_text()
    assert (f"{saved / 'state.json'}: field 'shards' does not split 40 classes over 2 ranks (rank r's [first class, "
            "count], contiguous from 0, none empty): [[0, 20], [0, 20]]") in log, log[-3000:]
    assert "step 25" not in log


def test_a_megabyte_field_in_state_json_gives_a_short_message(tmp_path):
    write_state(tmp_path, step=list(range(10**6)))
    with pytest.raises(CheckpointError) as refused:
        checkpoints.State.read(str(tmp_path))
    assert len(str(refused.value)) < BOUND and "(1,000,000 items)" in str(refused.value)
    assert "field 'step' is [0, 1, 2, 3, 4, 5, 6, 7, ...] (1,000,000 items) (missing or damaged" in str(refused.value)


def test_the_verify_command_quotes_a_damaged_checkpoint_briefly(reference, tmp_path):
    """Through the command: a checkpoint whose state.json holds a 7 MB list where a number belongs."""
    data, run = reference
    saved = tmp_path / "ckpt"
    shutil.copytree(ckpt(run / "checkpoints", 24), saved)
    state = json.loads((saved / "state.json").read_text())
    (saved / "state.json").write_text(json.dumps({**state, "embedding_size": list(range(10**6))}))
    proc = run_command([sys.executable, "-m", "mxnet_pfc.verify", saved, data / "val.bin"], timeout=120)
    assert proc.returncode == 1
    assert f"{saved / 'state.json'}: field 'embedding_size' is [0, 1, 2, 3, 4, 5, 6, 7, ...] (1,000,000 items)" in (
        proc.stdout), proc.stdout[-2000:]
    assert len(proc.stdout) < BOUND + 500, len(proc.stdout)


def test_a_resume_says_briefly_what_a_checkpoints_run_started_from():
    """The notes of a resume quote the checkpoint's configuration (its --pretrained, --teacher, --loss)."""
    huge = [f"zoo/model-{k}" for k in range(10**5)]
    cfg = config_lib.make_config({"pretrained": "zoo/other", "teacher": "zoo/teacher"})
    state = SimpleNamespace(config={"pretrained": huge, "teacher": huge})      # the field it reads of a State
    notes = resume.starting_point_notes(state, cfg)
    assert len(notes) == 2 and all(len(note) < BOUND and "(100,000 items)" in note for note in notes), notes


def test_a_huge_option_value_gives_a_short_message():
    for fields, start in (({"network": "n" * 10**6}, "unknown network 'nnnn"),
                          ({"rec": "r" * 10**6, "images": "i" * 10**6}, "images = 'iiii")):
        with pytest.raises(ConfigError) as refused:
            config_lib.make_config(fields)
        assert str(refused.value).startswith(start) and len(str(refused.value)) < BOUND, str(refused.value)[:300]


@pytest.mark.parametrize("name", ["pretrained", "teacher"])
def test_start_over_refuses_a_model_inside_output_reached_through_a_symlink(tmp_path, name):
    """--start_over moves OUTPUT's files aside before the run reads them: a --pretrained or --teacher that is a
    symlink into OUTPUT (to the folder, or to the model's files) is inside it, whatever its name."""
    output = tmp_path / "out"
    output.mkdir()
    for file in ("model-symbol.json", "model-0000.params"):
        (output / file).write_text("{}")
    (tmp_path / "linked-run").symlink_to(output)
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    for file in ("symbol.json", "0000.params"):
        (zoo / f"model-{file}").symlink_to(output / f"model-{file}")
    for given in (tmp_path / "linked-run", tmp_path / "linked-run" / "model", zoo / "model"):
        fields = {"output": str(output), "start_over": True, name: str(given), "distill_weight": 1.0}
        with pytest.raises(ConfigError, match=f"start_over = True: moves {re.escape(str(output))}'s files .* "
                                              f"--{name} names a path inside it"):
            config_lib.make_config(fields)
    (zoo / "model-0000.params").unlink()
    (zoo / "model-0000.params").write_text("{}")          # a copy: no longer the run's own file
    os.unlink(zoo / "model-symbol.json")
    (zoo / "model-symbol.json").write_text("{}")
    assert getattr(config_lib.make_config({"output": str(output), "start_over": True, name: str(zoo / "model"),
                                           "distill_weight": 1.0}), name) == str(zoo / "model")
