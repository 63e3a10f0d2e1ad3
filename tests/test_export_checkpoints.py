"""An export without --prefix never replaces a run's model with another checkpoint's (issue 33, item 4).

`python -m mxnet_pfc.export OUTPUT/checkpoints/<an earlier checkpoint>` wrote OUTPUT/model-* and removed
the run's verification file, exit 0: `verify OUTPUT` then measured the earlier parameters. Now an earlier
checkpoint (or one outside any run) is exported beside its folder, under its name. The session's reference
run (conftest.reference: checkpoints at steps 24 and 30, the model exported at 30) is copied first.
"""
import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from launch import ckpt, run_command


def digests(folder: Path) -> "dict[str, str]":
    """{relative path: sha256} of every file under `folder`."""
    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


def test_an_earlier_checkpoint_is_exported_beside_it_and_the_runs_model_stays(reference, tmp_path):
    data, shared = reference
    run = tmp_path / "run"
    shutil.copytree(shared, run)
    model_files = {name: (run / name).read_bytes()
                   for name in ("model-symbol.json", "model-0000.params", "model-verification.json")}
    earlier = ckpt(run / "checkpoints", 24)
    proc = run_command([sys.executable, "-m", "mxnet_pfc.export", earlier], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"-> {earlier}-symbol.json + {earlier}-0000.params" in proc.stdout, proc.stdout[-3000:]
    assert Path(f"{earlier}-symbol.json").is_file() and Path(f"{earlier}-0000.params").is_file()
    assert not Path(f"{earlier}-verification.json").exists()       # the run's figures measured step 30's
    assert {name: (run / name).read_bytes() for name in model_files} == model_files

    figures = tmp_path / "figures.json"
    verify = run_command([sys.executable, "-m", "mxnet_pfc.verify", run, data / "val.bin", "--json", figures],
                         timeout=120)
    assert verify.returncode == 0, verify.stdout[-3000:]
    trained = json.loads(model_files["model-verification.json"])["val"]
    assert json.load(open(figures))["val"]["accuracy"] == pytest.approx(trained["accuracy"])


def test_a_checkpoint_outside_a_run_is_exported_beside_it_untouched(reference, tmp_path):
    """Its folder holds model-* files of its own (rank 0's backbone): the default OUTPUT/model of a folder
    would have been those, replaced by the averaged inference model."""
    _, shared = reference
    copy = tmp_path / "kept-step-24"
    shutil.copytree(ckpt(shared / "checkpoints", 24), copy)
    before = digests(copy)
    proc = run_command([sys.executable, "-m", "mxnet_pfc.export", copy], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert digests(copy) == before
    assert (tmp_path / "kept-step-24-symbol.json").is_file() and (tmp_path / "kept-step-24-0000.params").is_file()
    refused = run_command([sys.executable, "-m", "mxnet_pfc.export", copy, "--prefix", copy / "model"], timeout=120)
    assert refused.returncode == 1 and "is inside a checkpoint's folder" in refused.stdout, refused.stdout[-3000:]
    assert digests(copy) == before
