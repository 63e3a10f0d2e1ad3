"""A .bin verification set is data (issue 33 items 1, 5 and 4): it loads as images and booleans, or is refused.

Whatever a file holds, the loader builds only uint8 images and booleans from it or refuses it naming the file;
a set that loads can be evaluated; two sets of one name are reported apart; an evaluation that fails during
training keeps the step's checkpoint. Attacks go through `python -m mxnet_pfc.verify` and the trainer under
horovodrun, as users run them; the loader is fuzzed in a process of its own (tests/bin_fuzz_worker.py)."""
import inspect
import json
import os
import pickle
import re
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

import bin_attacks as attacks
from launch import REPO, config_sh, own_set_run, rank_env, rank_stop_line, run_command, saved_steps
from mxnet_pfc.data.synthetic_ijb import write_ijb
from mxnet_pfc.eval import bin_file, verification
from mxnet_pfc.eval.bin_file import BinFormatError, load_bin
from mxnet_pfc.eval.verification import set_names
from test_ijb import colour_grid_model

# Address space of each command run here: MXNet takes about 1 GB of it. The old loader, reading
# /dev/zero or 40,000 memo references to one JPEG, met this bound instead of the machine's memory.
COMMAND_MEMORY = 3 << 30
FUZZ_MEMORY = 1 << 30           # the fuzzing process (no MXNet: ~280 MB at start)
FUZZ_EXAMPLES = 200


def limit_memory(limit=COMMAND_MEMORY):
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def verify(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    """python -m mxnet_pfc.verify ARGS as a user runs it, within COMMAND_MEMORY."""
    return subprocess.run([sys.executable, "-m", "mxnet_pfc.verify", *map(str, args)], cwd=REPO, env=rank_env(),
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit_memory)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return colour_grid_model(tmp_path_factory.mktemp("model") / "grid")


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """(JPEG bytes of 20 faces, issame of their 10 pairs): a generated set's content."""
    return attacks.real_pairs(tmp_path_factory.mktemp("real"))


def write(path, raw: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(raw)
    return path


# --- the field's writers: every format loads to the same images and labels ------------------------------

def writers(images, issame) -> dict:
    arrays = [np.frombuffer(b, np.uint8).reshape(-1, 1) for b in images]     # cv2.imencode's (N, 1) arrays
    protocol5 = pickle.dumps((arrays, issame), protocol=5)
    found = {
        **{f"python2-protocol{p}": attacks.python2_bin(images, issame, p) for p in (0, 1, 2)},
        "python2-numpy-arrays": attacks.python2_bin(images, issame, 2, arrays=True),
        **{f"bytes-protocol{p}": pickle.dumps((images, issame), protocol=p) for p in range(6)},
        **{f"arrays-protocol{p}": pickle.dumps((arrays, issame), protocol=p) for p in range(6)},
        "fortran-arrays": pickle.dumps(([np.asfortranarray(a) for a in arrays], issame), protocol=4),
        "numpy-booleans": pickle.dumps((images, [np.bool_(s) for s in issame]), protocol=2),
        "boolean-array": pickle.dumps((images, np.array(issame)), protocol=5),
        "numpy2-protocol5": protocol5.replace(b"\x8c\x12numpy.core.numeric", b"\x8c\x13numpy._core.numeric"),
    }
    assert found["numpy2-protocol5"] != protocol5
    return found


def test_every_writer_of_the_field_gives_the_same_set(tmp_path, real):
    """Python 2's str lists (protocols 0-2) and numpy arrays, Python 3's bytes and cv2.imencode arrays in
    protocols 0-5 (_codecs.encode, _reconstruct + BUILD, _frombuffer; numpy 2's names), numpy booleans and
    a boolean array: one set."""
    images, issame = real
    expected = load_bin(str(write(tmp_path / "reference.bin", pickle.dumps((images, issame), protocol=5))))
    assert expected[0].shape == (20, 3, 112, 112) and expected[1].tolist() == issame
    for name, raw in writers(images, issame).items():
        loaded = load_bin(str(write(tmp_path / f"{name}.bin", raw)))
        assert np.array_equal(loaded[0], expected[0]) and np.array_equal(loaded[1], expected[1]), name


# --- item 1: attacks, through the verify command ---------------------------------------------------------

def attack_file(kind: str, folder, real):
    images, issame = real
    if kind == "fifo":
        os.mkfifo(folder / "x.bin")
        return folder / "x.bin"
    if kind == "dev-zero":
        os.symlink("/dev/zero", folder / "zero.bin")
        return folder / "zero.bin"
    raw = {"segfault": lambda: attacks.segfault_bin(issame),
           "subarray": lambda: attacks.subarray_bin(images, issame),
           "memo-references": lambda: attacks.memo_bin(images[0], 20_000)}[kind]()
    return write(folder / f"{kind}.bin", raw)


ATTACKS = {
    # the old loader: a segmentation fault
    "segfault": "a state of numpy.dtype('u1') other than numpy's own (subarrays, fields and flags are refused)",
    # the old loader: loaded, exit 0 (the variant read 4 KB of heap)
    "subarray": "a state of numpy.dtype('u1') other than numpy's own (subarrays, fields and flags are refused)",
    # the old loader: 40,000 x 3 x 112 x 112 float32 (5.7 GB): a MemoryError traceback within COMMAND_MEMORY
    "memo-references": "its 40,000 images would decode to 5,742 MB (112x112 float32), more than 1000 times the "
                       "file's",
    # the old loader: blocked in open() until the timeout
    "fifo": "is not a regular file (a FIFO): a verification .bin is read only from a regular file",
    # the old loader: read until COMMAND_MEMORY ran out (a MemoryError traceback)
    "dev-zero": "is not a regular file (a character device): a verification .bin is read only from a regular file",
}


@pytest.mark.parametrize("kind", ATTACKS)
def test_verify_refuses_an_attack_naming_the_file(kind, model, real, tmp_path):
    path = attack_file(kind, tmp_path, real)
    proc = verify(model, path, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert f"mxnet_pfc.verify: {path}" in proc.stderr and ATTACKS[kind] in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "accuracy" not in proc.stdout


def loader_defaults() -> dict:
    """The default arguments of every function of the loader's modules (a BUILD on a loaded name set them)."""
    return {(module.__name__, name): function.__defaults__ for module in (verification, bin_file)
            for name, function in vars(module).items() if inspect.isfunction(function)}


def test_a_build_on_a_loaded_name_changes_nothing(real, tmp_path):
    """The old loader handed the BUILD to the stand-in function numpy.dtype stood for: its __defaults__
    stayed changed for the rest of the process."""
    before = loader_defaults()
    path = write(tmp_path / "build.bin", attacks.build_on_function_bin(*real))
    with pytest.raises(BinFormatError, match=rf"^{path}: not a pickle of \(images, issame\): "):
        load_bin(str(path))
    assert loader_defaults() == before


def test_the_bounds_of_a_bin(real, tmp_path, monkeypatch):
    """The size of the file, the decoded total against it, opcodes: each refusal names the file."""
    images, issame = real
    path = write(tmp_path / "set.bin", pickle.dumps((images, issame)))
    monkeypatch.setattr(bin_file, "MAX_BIN_BYTES", path.stat().st_size - 1)
    with pytest.raises(BinFormatError, match=rf"^{path} is [\d,]+ bytes, more than a verification .bin may be"):
        load_bin(str(path))
    monkeypatch.undo()
    # 1000 x the file's size is the decoded bound: at 2,000 x 2,000 pixels these 20 images exceed it
    with pytest.raises(BinFormatError, match=rf"^{path}: its 20 images would decode to 916 MB \(2000x2000 float32\)"):
        load_bin(str(path), image_size=2000)
    monkeypatch.setattr(bin_file, "MAX_OPCODES", 50)
    with pytest.raises(BinFormatError, match=rf"^{path}: not a pickle .*: more than 50 opcodes"):
        load_bin(str(path))


@pytest.mark.parametrize("raw, reason", [
    (b"", "it ends at byte 0 before its STOP"),
    (b"\x80\x05}.", "byte 2 holds opcode EMPTY_DICT, which a .bin does not use"),
    (b"\x80\x02cposix\nsystem\n.", "refusing to load posix.system: a verification .bin holds only"),
    (b"\x80\x05\x8c\x05numpy\x8c\x07ndarray\x93)R.", "a call of numpy.ndarray"),
    (b"\x80\x02]q\x00h\x01.", "memo entry 1 read before it is written"),
    (b"\x80\x02\x8e" + (1 << 62).to_bytes(8, "little"), "4,611,686,018,427,387,904 bytes announced, 0 left"),
    (b"\x80\x02a.", "opcode APPEND at byte 2 finds too few values on the stack"),
    (b"\x80\x02]]..", "it ends with 2 values on the stack"),
    (b"\x80\x02cnumpy\ndtype\nN\x85b.", "a BUILD (setting an object's state) on numpy.dtype: a .bin sets the state of "
                                     "numpy's dtypes and arrays only (opcode BUILD at byte 17)"),
])
def test_a_pickle_that_is_no_pair_set_is_named(raw, reason, tmp_path):
    path = write(tmp_path / "bad.bin", raw)
    with pytest.raises(BinFormatError, match=rf"^{path}: ") as caught:
        load_bin(str(path))
    assert reason in str(caught.value)


# --- item 5: a set that loads can be evaluated -------------------------------------------------------

SMALL_SETS = {  # name: (labels, what the refusal says)
    "empty": ([], "0 pair(s): 10-fold verification needs at least 10 pairs (one in each fold)"),
    "one-pair": ([True], "1 pair(s): 10-fold verification needs at least 10 pairs"),
    "nine-pairs": ([True, False] * 4 + [True], "9 pair(s): 10-fold verification needs at least 10 pairs"),
    "all-same": ([True] * 10, "all 10 pairs are same: TAR@FAR needs at least one same and one different pair"),
    "all-different": ([False] * 10, "all 10 pairs are different: TAR@FAR needs at least one same and one"),
}


def small_set(folder, name, real):
    labels, _ = SMALL_SETS[name]
    return write(folder / f"{name}.bin", pickle.dumps((real[0][:2 * len(labels)], labels)))


def test_a_set_that_cannot_be_evaluated_is_refused_at_load(real, tmp_path):
    for name, (_, reason) in SMALL_SETS.items():
        path = small_set(tmp_path, name, real)
        with pytest.raises(BinFormatError, match=re.escape(f"{path}: {reason}")):
            load_bin(str(path))
    path = write(tmp_path / "ten.bin", pickle.dumps((real[0], [True] + [False] * 9)))
    assert load_bin(str(path))[1].sum() == 1


@pytest.mark.parametrize("name", ["nine-pairs", "all-same"])     # the old verify: "nan +- nan"; a traceback
def test_verify_names_a_set_it_cannot_evaluate(name, model, real, tmp_path):
    path = small_set(tmp_path, name, real)
    proc = verify(model, path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert f"mxnet_pfc.verify: {path}: {SMALL_SETS[name][1]}" in proc.stderr, proc.stderr[-3000:]
    assert "nan" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


# --- item 4: two sets of one name ---------------------------------------------------------------------

def test_set_names_tell_sets_of_one_name_apart():
    assert set_names(["x/a/lfw.bin", "y/a/lfw.bin", "z/cfp_fp.bin"]) == ["x/a/lfw", "y/a/lfw", "cfp_fp"]
    assert set_names(["lfw.bin"]) == ["lfw"]
    with pytest.raises(verification.ConfigError, match="the verification set .*/a/lfw is named twice"):
        set_names(["a/lfw.bin", "./a/../a/lfw.bin"])


def test_verify_reports_two_sets_of_one_name_apart(model, tmp_path):
    for folder, seed in (("a", 1), ("b", 2)):
        images, issame = attacks.real_pairs(tmp_path, seed=seed)
        write(tmp_path / folder / "lfw.bin", pickle.dumps((images, issame)))
    proc = verify(model, tmp_path / "a" / "lfw.bin", tmp_path / "b" / "lfw.bin", "--json", tmp_path / "v.json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["a/lfw", "b/lfw"], proc.stdout
    report = json.load(open(tmp_path / "v.json"))
    assert sorted(report) == ["a/lfw", "b/lfw"] and report["a/lfw"] != report["b/lfw"]
    proc = verify(model, tmp_path / "a" / "lfw.bin", tmp_path / "a" / "lfw.bin")
    assert proc.returncode == 1 and "a/lfw is named twice" in proc.stderr, proc.stderr[-3000:]


# --- the loader fuzzed ---------------------------------------------------------------------------------

def test_mutated_bins_give_a_set_or_a_bin_format_error(real, tmp_path):
    """FUZZ_EXAMPLES mutations of real sets in the field's formats and of the attacks, in a process bounded
    to FUZZ_MEMORY of address space: a crash or any other error fails the test."""
    images, issame = real
    seeds = {**writers(images, issame), "segfault": attacks.segfault_bin(issame),
             "subarray": attacks.subarray_bin(images, issame),
             "build-on-function": attacks.build_on_function_bin(images, issame),
             "memo-references": attacks.memo_bin(images[0], 500)}
    for name, raw in seeds.items():
        write(tmp_path / "seeds" / f"{name}.bin", raw)
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "bin_fuzz_worker.py"), str(tmp_path / "seeds"),
                           str(FUZZ_MEMORY), str(FUZZ_EXAMPLES)], cwd=REPO, env=rank_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert f"loaded {len(seeds)} seeds and {FUZZ_EXAMPLES} mutations of them" in proc.stdout


# --- the trainer ---------------------------------------------------------------------------------------

def test_a_bad_bin_beside_the_training_set_stops_both_ranks_at_setup(set_b, real, tmp_path):
    """--val_targets auto takes every .bin beside the set: the segfault attack is named on both ranks,
    before step 1 (the old loader crashed rank 0)."""
    data = tmp_path / "data"
    shutil.copytree(set_b, data)
    evil = write(data / "evil.bin", attacks.segfault_bin(real[1]))
    proc = run_command(config_sh(*own_set_run(data, tmp_path / "run", "--val_targets", "auto",
                                              "--max_update", 2)), timeout=300)
    assert proc.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(proc.stdout, rank)
        assert f"{evil}: not a pickle of (images, issame): a state of numpy.dtype('u1')" in line, proc.stdout[-4000:]
    assert "Segmentation fault" not in proc.stdout and "step 1/" not in proc.stdout


def test_a_set_the_run_cannot_evaluate_stops_it_before_step_1(set_b, real, tmp_path):
    """The old trainer loaded a 1-pair set and died at the first evaluation (KeyError), before that step's
    checkpoint."""
    path = small_set(tmp_path, "one-pair", real)
    proc = run_command(config_sh(*own_set_run(set_b, tmp_path / "run", "--val_targets", path, "--max_update", 4,
                                              "--verbose", 2, "--save_interval", 2)), timeout=300)
    assert proc.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(proc.stdout, rank)
        assert f"{path}: 1 pair(s): 10-fold verification needs at least 10 pairs" in line, proc.stdout[-4000:]
    assert "step 1/" not in proc.stdout


def test_an_evaluation_that_fails_keeps_the_steps_checkpoint(set_b, tmp_path):
    """An IJB set's image is read at each evaluation: one damaged after setup's check (which lists the files)
    fails the evaluation of step 2; the checkpoint of step 2 is written before the run stops, naming it."""
    root = tmp_path / "IJBC"
    write_ijb(str(root), "IJBC", subjects=6, templates_per_subject=2, seed=0)
    damaged = sorted((root / "loose_crop").iterdir())[0]
    damaged.write_bytes(b"not an image")
    output = tmp_path / "run"
    proc = run_command(config_sh(*own_set_run(set_b, output, "--ijb_targets", root, "--max_update", 4,
                                              "--verbose", 2, "--save_interval", 2)), timeout=300)
    assert proc.returncode != 0
    for rank in (0, 1):
        assert f"{damaged} (listed at " in rank_stop_line(proc.stdout, rank), proc.stdout[-4000:]
    assert saved_steps(output / "checkpoints") == [2], proc.stdout[-4000:]
    assert "step 2: the evaluation failed; the checkpoint" in (output / "logs" / "rank0.log").read_text()
