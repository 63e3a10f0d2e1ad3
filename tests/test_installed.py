"""The package without the checkout: a wheel, installed into an environment of its own, run from outside it.

The environment is a fresh venv holding the installed mxnet-pfc and its commands; mxnet, Horovod and the
other requirements come from the project's venv through a .pth line naming its site-packages (a plain
path: that folder's own .pth files, among them the editable install of this checkout, are not run), and
horovodrun is the project venv's script run by the new interpreter, as pip would have written it. So
every mxnet_pfc module imported here, in the supervisor or in a rank, is the installed copy (checked).
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

from launch import REPO, finish_command, tiny_synthetic_run

PROJECT_SITE = sysconfig.get_paths()["purelib"]
SCRIPTS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The bin folder of a venv with mxnet-pfc installed from a wheel of this checkout."""
    root = tmp_path_factory.mktemp("installed")
    src = root / "src"                       # a copy, so that the build leaves nothing in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in ("mxnet_pfc", "symbols"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    subprocess.run(pip + ["wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", str(root / "dist")],
                   check=True, capture_output=True, timeout=300)
    [wheel] = (root / "dist").glob("mxnet_pfc-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(pip + ["--python", str(python), "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    [site] = venv.glob("lib/python*/site-packages")
    (site / "project-venv.pth").write_text(PROJECT_SITE + "\n")
    horovodrun = (Path(sys.executable).parent / "horovodrun").read_text().split("\n", 1)[1]
    (venv / "bin" / "horovodrun").write_text(f"#!{python}\n{horovodrun}")
    (venv / "bin" / "horovodrun").chmod(0o755)
    return venv / "bin"


def outside_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.setdefault("OMP_NUM_THREADS", "1")      # several ranks share 2 cores
    return env


def test_the_installed_copy_is_what_imports(installed, tmp_path):
    code = ("import mxnet_pfc.runtime.launch_rank, mxnet_pfc.training.trainer, symbols, horovod.mxnet; "
            "print(mxnet_pfc.runtime.launch_rank.__file__, mxnet_pfc.training.trainer.__file__, symbols.__file__)")
    proc = subprocess.run([installed / "python", "-c", code], cwd=tmp_path, env=outside_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    site = str(installed.parent / "lib")
    assert all(path.startswith(site) for path in proc.stdout.split()), proc.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_installed_command_answers_help(installed, tmp_path, script):
    proc = subprocess.run([installed / script, "--help"], cwd=tmp_path, env=outside_env(), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.timeout(600)
def test_installed_elastic_supervisor_trains_to_the_end(installed, tmp_path):
    """mxnet-pfc-elastic starts its trainer (2 ranks, localhost) on a tiny synthetic set, which finishes."""
    output = tmp_path / "run"
    command = [installed / "mxnet-pfc-elastic", "--host-discovery-script", "echo localhost:2", "--min-np", 2,
               "--max-np", 2, "--max-restarts", 0, "--",
               *tiny_synthetic_run(tmp_path / "data", output, "--max_update", 3, "--val_targets", "")]
    proc = subprocess.Popen([str(part) for part in command], cwd=tmp_path, env=outside_env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    out = finish_command(proc, timeout=540)
    assert proc.returncode == 0, out[-5000:]
    assert (output / "logs" / "finished.json").is_file(), out[-5000:]
