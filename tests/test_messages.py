"""Every error says what happened (issue 22 item 7).

MXNet's reason and the file it concerns, the option or field of bad input, one line from horovodrun at the end
of a failed run, and dated log lines."""
import os
import re
import shutil
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest

from launch import REFERENCE_RUN, REPO, config_sh, rank_env, rank_stop_line, run_command, tiny_synthetic_run
from test_ijb import colour_grid_model, ijb_set  # noqa: F401 (ijb_set: a fixture)
from test_ijb import run as run_ijb


def command(module: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """python -m mxnet_pfc.MODULE ARGS as a user runs it."""
    return subprocess.run([sys.executable, "-m", f"mxnet_pfc.{module}", *map(str, args)], cwd=REPO, env=rank_env(),
                          capture_output=True, text=True, timeout=timeout)


def horovodrun_ending(out: str) -> str:
    return out.strip().splitlines()[-1]


# --- MXNet's errors: the line that says what failed, and the file ----------------------------------------

def damage(path, how: str) -> None:
    data = open(path, "rb").read()
    damaged = {"garbage": np.random.default_rng(0).bytes(len(data)), "truncated": data[:len(data) // 2],
               "empty": b""}[how]
    open(path, "wb").write(damaged)


# (command, damaged file of the model, how, what MXNet (or, for the graph, symbol_file) says of it)
MODEL_CASES = [("verify", "-0000.params", "garbage", "it does not start as an MXNet array file does (0x112, found"),
               ("export", "-0000.params", "truncated", " are left"),   # array_file: cut
               ("embed", "-symbol.json", "truncated", "not an MXNet symbol file: not JSON (Expecting"),
               ("verify", "-symbol.json", "empty", "not an MXNet symbol file: not JSON (Expecting value")]


@pytest.mark.parametrize("cmd, suffix, how, reason", MODEL_CASES)
def test_a_damaged_model_is_named_with_what_mxnet_found(cmd, suffix, how, reason, tmp_path):
    prefix = colour_grid_model(tmp_path / "model")
    damage(prefix + suffix, how)
    args = {"verify": [prefix, tmp_path / "lfw.bin"], "export": [prefix, "--prefix", tmp_path / "out"],
            "embed": [prefix, "--pair", tmp_path / "a.jpg", tmp_path / "b.jpg", "--threshold", 0.3]}[cmd]
    proc = command(cmd, *args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert f"mxnet_pfc.{cmd}: {prefix}{suffix}: cannot load: " in proc.stderr, proc.stderr[-3000:]
    assert reason in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def test_a_damaged_checkpoint_is_named_by_verify_and_by_a_resume(reference, tmp_path):
    """The backbone of a checkpoint truncated: a resume under horovodrun and verify name the file and the reason;
    horovodrun ends with one line."""
    data, run = reference
    output = tmp_path / "run"
    shutil.copytree(run, output)
    folders = sorted((output / "checkpoints").glob("*/state.json"))
    assert folders
    for folder in folders:        # whichever a resume takes
        for name in ("model-0000.params", "model-average-0000.params"):
            damage(folder.parent / name, "truncated")
    one = folders[0].parent
    proc = command("verify", one, data / "val.bin")
    assert proc.returncode == 1
    assert f"{one}/model-average-0000.params: cannot load: " in proc.stderr, proc.stderr[-3000:]
    assert " are left" in proc.stderr, proc.stderr[-3000:]       # array_file's word for a file cut short
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--max_update", 40,
                                                     "--resume", "latest")), timeout=240)
    assert proc.returncode == 1, proc.stdout[-4000:]
    line = rank_stop_line(proc.stdout, 0)
    assert "model-0000.params: cannot load: " in line and " are left" in line, proc.stdout[-4000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-4000:]
    assert horovodrun_ending(proc.stdout).startswith("horovodrun: rank "), proc.stdout[-4000:]


# --- bad input: the option or field named, no traceback ----------------------------------------------------

@pytest.fixture(scope="module")
def bad_config_run():
    """`--decay_epochs 8,a` on 2 ranks under horovodrun (config.sh)."""
    return run_command(config_sh("--decay_epochs", "8,a"), timeout=180)


def test_a_bad_decay_epochs_is_named(bad_config_run):
    out = bad_config_run.stdout
    assert bad_config_run.returncode == 1, out[-4000:]
    # each rank refuses it; the first to exit makes horovodrun stop the other, perhaps before it printed
    assert re.search(r"\[[01]\]<stderr>:mxnet_pfc.train: configuration error: decay_epochs = 8,a: expected epochs "
                     r"as numbers", out), out[-4000:]
    assert "<stderr>:Traceback" not in out and "a defect of ours" not in out, out[-4000:]


def test_a_failed_run_ends_with_one_line_from_horovodrun(bad_config_run):
    out = bad_config_run.stdout
    assert re.fullmatch(r"horovodrun: rank [01] failed first \(exit code \d+\), so the job stopped; see the ranks' "
                        r"messages above", horovodrun_ending(out)), out[-4000:]
    assert "Traceback" not in out and "RuntimeError" not in out, out[-4000:]


@pytest.mark.parametrize("cmd, option, value", [("embed", "--batch-size", "0"), ("embed", "-k", "0"),
                                                ("embed", "-k", "-1"), ("verify", "--batch-size", "0")])
def test_counts_below_one_are_refused_naming_the_option(cmd, option, value, tmp_path):
    prefix = colour_grid_model(tmp_path / "model")
    rng = np.random.default_rng(0)
    for name in ("gallery/ann/1.jpg", "gallery/bob/1.jpg", "probe.jpg"):
        os.makedirs(os.path.dirname(tmp_path / name), exist_ok=True)
        cv2.imwrite(str(tmp_path / name), rng.integers(0, 255, (112, 112, 3), dtype=np.uint8))
    args = {"embed": [prefix, "--gallery", tmp_path / "gallery", "--probe", tmp_path / "probe.jpg"],
            "verify": [prefix, tmp_path / "lfw.bin"]}[cmd]
    proc = command(cmd, *args, option, value)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert f"argument {option}" in proc.stderr and \
        f"expected a whole number of at least 1, got '{value}'" in proc.stderr, proc.stderr[-3000:]


@pytest.fixture
def ijb_copy(ijb_set, tmp_path):  # noqa: F811
    root, _ = ijb_set
    shutil.copytree(root, tmp_path / "IJBC")
    return tmp_path / "IJBC"


def ijb_failure(root, tmp_path, capsys) -> str:
    code, _ = run_ijb(root, colour_grid_model(tmp_path / "grid"), tmp_path / "out")
    assert code == 1
    return capsys.readouterr().err


@pytest.mark.parametrize("label", [0, 1])
def test_ijb_pairs_of_one_label_are_refused(label, ijb_copy, tmp_path, capsys):
    path = ijb_copy / "meta" / "ijbc_template_pair_label.txt"
    lines = [line.rsplit(" ", 1)[0] + f" {label}" for line in path.read_text().splitlines() if line.strip()]
    path.write_text("\n".join(lines) + "\n")
    assert f"{path}: every pair is labelled {label}: TAR at FAR needs both" in ijb_failure(ijb_copy, tmp_path, capsys)


def test_ijb_probes_all_in_the_gallery_are_refused(ijb_copy, tmp_path, capsys):
    meta = ijb_copy / "meta"
    gallery = [line.split(",") for line in (meta / "ijbc_1N_gallery_G1.csv").read_text().splitlines()]
    probe = meta / "ijbc_1N_probe_mixed.csv"
    probe_rows = [line.split(",") for line in probe.read_text().splitlines()]
    column = probe_rows[0].index("SUBJECT_ID")
    for row in probe_rows[1:]:       # every probe: the subject of the gallery's first template
        row[column] = gallery[1][gallery[0].index("SUBJECT_ID")]
    probe.write_text("\n".join(",".join(row) for row in probe_rows) + "\n")
    assert f"{probe}: every probe's subject is in gallery G1" in ijb_failure(ijb_copy, tmp_path, capsys)


@pytest.mark.parametrize("name", ["ijbc_face_tid_mid.txt", "ijbc_template_pair_label.txt", "ijbc_1N_gallery_G2.csv"])
def test_a_binary_ijb_meta_file_is_named(name, ijb_copy, tmp_path, capsys):
    path = ijb_copy / "meta" / name
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + np.random.default_rng(0).bytes(2000))
    assert f"{path}: not a text file (byte 0 is not UTF-8 text)" in ijb_failure(ijb_copy, tmp_path, capsys)


# --- log lines carry a date --------------------------------------------------------------------------------

def test_log_lines_carry_a_date(reference):
    _, run = reference
    records = [line for line in (run / "logs" / "rank1.log").read_text().splitlines()
               if re.search(r" rank1 (INFO|WARNING|ERROR) ", line)]
    assert records
    for line in records:
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d rank1 ", line), line


def test_the_trainer_stops_on_an_mxnet_error_with_the_line_that_says_what_failed(tmp_path, capsys):
    from mxnet_pfc.runtime import stops
    (tmp_path / "x.params").write_bytes(b"not arrays")
    try:
        mx.nd.load(str(tmp_path / "x.params"))
    except mx.base.MXNetError as error:
        assert stops.stop_on_error(error) == 1
    err = capsys.readouterr().err
    assert re.fullmatch(r"rank 0: MXNetError: Check failed: fi->Read\(\S+\): Invalid NDArray file format",
                        err.strip()), err
