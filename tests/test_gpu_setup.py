"""The GPU decisions of set-up and trainer start, and the package install, without a GPU.

A stand-in `nvidia-smi` on PATH prints what a real one prints for the GPUs of
each case (or fails as a real one does without a driver). It drives
setup-utils/install.sh --dry-run (which installs nothing), the start-time checks
of mxnet_pfc/runtime/device.py, and a rank's LD_LIBRARY_PATH (runtime/rank_environment.py, run by
config.sh) on a fake site-packages/nvidia tree. None of this ran on a GPU. Also the
Horovod patch that set-up applies (setup-utils/patch_horovod.py).
"""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import mxnet as mx
import pytest

from launch import REPO
from mxnet_pfc.runtime import comm, device
from mxnet_pfc.runtime.rank_environment import rank_environment
from mxnet_pfc.training.config import ConfigError

H100 = ("NVIDIA H100 80GB HBM3", "9.0")
A100 = ("NVIDIA A100-SXM4-80GB", "8.0")
NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")


def fake_nvidia_smi(folder: Path, gpus=(), fail=False, old_driver=False) -> Path:
    """An executable `nvidia-smi` in `folder` answering -L and --query-gpu=name,compute_cap like a real one."""
    folder.mkdir(parents=True, exist_ok=True)
    listing = "".join(f"GPU {i}: {name} (UUID: GPU-{i:08d}-1111-2222-3333-444455556666)\\n"
                      for i, (name, _) in enumerate(gpus))
    query = "".join(f"{name}, {cap}\\n" for name, cap in gpus)
    if fail:
        body = f'echo "{NO_DRIVER}"; exit 9'
    else:
        query_answer = ("echo 'Field \"compute_cap\" is not a valid field to query.' >&2; exit 2" if old_driver
                        else f'printf "{query}"')
        body = f'''case "$*" in
  *-L*) printf "{listing}" ;;
  *--query-gpu=name,compute_cap*) {query_answer} ;;
  *) echo "unexpected: $*" >&2; exit 1 ;;
esac'''
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/bash\n{body}\n")
    script.chmod(0o755)
    return script


def system_path() -> str:
    """PATH for the stand-ins' tests: the system's folders (which have no nvidia-smi on the test machines)."""
    return "/usr/local/bin:/usr/bin:/bin"


def fake_nvcc(folder: Path, release: str) -> Path:
    script = folder / "nvcc"
    script.write_text(f'#!/bin/bash\necho "nvcc: NVIDIA (R) Cuda compiler driver"\n'
                      f'echo "Cuda compilation tools, release {release}, V{release}.89"\n')
    script.chmod(0o755)
    return script


def dry_run(tmp_path, bin_dir=None, **env) -> str:
    venv = tmp_path / "venv"
    path = f"{bin_dir}:{system_path()}" if bin_dir else system_path()
    run_env = {k: v for k, v in os.environ.items() if k not in ("MXNET_PACKAGE", "CUDA_HOME", "HOROVOD_NVCC")}
    proc = subprocess.run(["bash", str(REPO / "setup-utils" / "install.sh"), "--dry-run"],
                          env={**run_env, "PATH": path, "VENV": str(venv), **env},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dry run: nothing installed" in proc.stdout and not venv.exists()
    return proc.stdout


def gpu_pins() -> list:
    return [line.split()[0] for line in (REPO / "requirements-gpu.txt").read_text().splitlines()
            if line.startswith("nvidia-")]


def test_no_real_nvidia_smi_on_the_test_path():
    assert not any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in system_path().split(":"))


# ---- (a) set-up decisions ----

def test_setup_h100_gets_the_cpu_wheel_and_says_why(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [H100])
    out = dry_run(tmp_path, bin_dir)
    assert "GPU: NVIDIA H100 80GB HBM3, compute capability 9.0" in out
    assert "no MXNet kernels for NVIDIA H100 80GB HBM3 (compute capability 9.0)" in out
    assert "compute capability 5.0-8.6 only" in out and "built from source" in out and "sm_90" in out
    assert "the trainer will run on the CPU" in out
    assert "plan: mxnet package: mxnet==1.9.1\n" in out
    assert "plan: CUDA libraries: none" in out and "plan: horovod: CPU only" in out


def test_setup_h100_with_a_chosen_wheel_keeps_it_and_warns(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [H100])
    out = dry_run(tmp_path, bin_dir, MXNET_PACKAGE="mxnet-cu117==1.9.1")
    assert "no MXNet kernels for NVIDIA H100 80GB HBM3" in out and "run on the CPU" not in out
    assert "plan: mxnet package: mxnet-cu117==1.9.1" in out
    assert all(pin in out for pin in gpu_pins())


def test_setup_a100_gets_the_cuda_wheel_and_its_libraries(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [A100, A100])
    out = dry_run(tmp_path, bin_dir)
    assert out.count("GPU: NVIDIA A100-SXM4-80GB, compute capability 8.0") == 2
    assert "no MXNet kernels" not in out
    assert "plan: mxnet package: mxnet-cu112==1.9.1" in out
    pins = gpu_pins()
    assert {p.split("==")[0] for p in pins} >= {
        "nvidia-cuda-runtime-cu11", "nvidia-cublas-cu11", "nvidia-cudnn-cu11", "nvidia-nccl-cu11",
        "nvidia-curand-cu11", "nvidia-cufft-cu11", "nvidia-cusolver-cu11", "nvidia-cuda-nvrtc-cu11"}
    assert all(pin in out for pin in pins)
    assert any(p.startswith("nvidia-cudnn-cu11==8.") for p in pins)        # MXNet 1.9 needs cuDNN 8
    assert any(p.startswith("nvidia-nccl-cu11==2.") for p in pins)
    # no CUDA toolkit: Horovod without CUDA, and the plan says what that means
    out = dry_run(tmp_path, bin_dir, HOROVOD_NVCC="none")
    assert "plan: horovod: built without CUDA: HOROVOD_NVCC=none" in out and "cannot take GPU arrays" in out

    # a CUDA 11 toolkit: Horovod with CUDA and NCCL
    nvcc = fake_nvcc(bin_dir, "11.8")
    out = dry_run(tmp_path, bin_dir)
    assert f"plan: horovod: built with CUDA and NCCL (nvcc: {nvcc}, CUDA 11.8; NCCL from nvidia-nccl-cu11)" in out

    # another major version than the wheels' CUDA 11: not used unless named
    fake_nvcc(bin_dir, "12.4")
    out = dry_run(tmp_path, bin_dir)
    assert f"plan: horovod: built without CUDA: {nvcc} is CUDA 12.4, the MXNet wheels use CUDA 11" in out
    out = dry_run(tmp_path, bin_dir, HOROVOD_NVCC=str(nvcc))
    assert f"plan: horovod: built with CUDA and NCCL (nvcc: {nvcc}, CUDA 12.4" in out


def test_setup_mixed_gpus_refuse_the_cuda_wheel(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [A100, H100])
    out = dry_run(tmp_path, bin_dir)
    assert "no MXNet kernels for NVIDIA H100 80GB HBM3 (compute capability 9.0)" in out
    assert "plan: mxnet package: mxnet==1.9.1\n" in out


@pytest.mark.parametrize("case", ["failing", "missing"])
def test_setup_without_a_working_nvidia_smi_is_a_cpu_install(tmp_path, case):
    bin_dir = tmp_path / "bin"
    if case == "failing":
        fake_nvidia_smi(bin_dir, [A100], fail=True)
    out = dry_run(tmp_path, bin_dir if case == "failing" else None)
    assert "GPU:" not in out and "no MXNet kernels" not in out
    assert "plan: mxnet package: mxnet==1.9.1\n" in out and "plan: CUDA libraries: none" in out


def test_setup_old_driver_without_compute_cap_installs_the_cuda_wheel_unchecked(tmp_path):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [A100], old_driver=True)
    out = dry_run(tmp_path, bin_dir)
    assert "could not report their compute capability" in out
    assert "plan: mxnet package: mxnet-cu112==1.9.1" in out


# ---- (b) the trainer's start-time checks (mxnet_pfc/runtime/device.py) ----

def test_gpu_models_reads_nvidia_smi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}:{system_path()}")
    fake_nvidia_smi(bin_dir, [A100, H100])
    assert device.gpu_models() == [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA H100 80GB HBM3", (9, 0))]
    fake_nvidia_smi(bin_dir, [("NVIDIA A100-SXM4-80GB", "[N/A]")])
    assert device.gpu_models() == [("NVIDIA A100-SXM4-80GB", None)]
    fake_nvidia_smi(bin_dir, [A100], fail=True)
    assert device.gpu_models() is None
    fake_nvidia_smi(bin_dir, [A100], old_driver=True)
    assert device.gpu_models() is None
    monkeypatch.setenv("PATH", system_path())
    assert device.gpu_models() is None


def test_start_check_names_the_gpu_its_capability_and_what_to_do(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}:{system_path()}")
    fake_nvidia_smi(bin_dir, [H100])
    assert device.mxnet_cuda_wheel() == ""                # the test venv has the CPU wheel: nothing to refuse
    device.check_compute_capability()
    monkeypatch.setattr(device, "mxnet_cuda_wheel", lambda: "mxnet-cu112==1.9.1")
    with pytest.raises(ConfigError) as error:
        device.check_compute_capability()
    message = str(error.value)
    for part in ("mxnet-cu112==1.9.1", "NVIDIA H100 80GB HBM3", "compute capability 9.0", "8.6", "no PTX",
                 "built from source", "sm_90", "--context cpu"):
        assert part in message, (part, message)
    device.check_compute_capability(wheel="")             # an MXNet built from source: not refused

    fake_nvidia_smi(bin_dir, [A100])
    device.check_compute_capability()                     # supported: nothing to say
    fake_nvidia_smi(bin_dir, [H100], fail=True)
    device.check_compute_capability()                     # cannot tell: not an error
    monkeypatch.setenv("PATH", system_path())
    device.check_compute_capability()


def test_choose_context_on_a_machine_whose_mxnet_sees_gpus(monkeypatch):
    # MXNet's GPU count stands in; mx.gpu(i) itself touches no device
    monkeypatch.setattr(mx.context, "num_gpus", lambda: 2)
    monkeypatch.setattr(device, "mxnet_cuda_wheel", lambda: "mxnet-cu112==1.9.1")
    a100 = [("NVIDIA A100-SXM4-80GB", (8, 0))]
    assert device.choose_context("auto", 3, gpus=a100) == mx.gpu(1)
    assert device.choose_context("gpu", 0, gpus=a100) == mx.gpu(0)
    assert device.choose_context("cpu", 0, gpus=a100) == mx.cpu()
    with pytest.raises(ConfigError, match=r"NVIDIA H100 80GB HBM3 \(compute capability 9.0\).*8\.6"):
        device.choose_context("auto", 0, gpus=[("NVIDIA H100 80GB HBM3", (9, 0))])
    assert device.choose_context("auto", 1, gpus=None) in (mx.gpu(1), mx.gpu(0))    # no nvidia-smi: unchecked


def test_choose_context_when_mxnet_sees_no_gpu(monkeypatch, caplog):
    monkeypatch.setattr(mx.context, "num_gpus", lambda: 0)
    assert device.choose_context("auto", 0, gpus=[]) == mx.cpu()
    assert device.choose_context("cpu", 0) == mx.cpu()
    with pytest.raises(ConfigError, match="context = gpu, but MXNet sees no GPU$"):
        device.choose_context("gpu", 0, gpus=[])
    assert issubclass(ConfigError, device.ConfigError)
    # the CPU wheel on an H100 machine (what set-up installs there): the reason, at start
    h100 = [("NVIDIA H100 80GB HBM3", (9, 0))]
    with pytest.raises(ConfigError) as error:
        device.choose_context("gpu", 0, gpus=h100)
    assert "nvidia-smi lists NVIDIA H100 80GB HBM3" in str(error.value) and "8.6" in str(error.value)
    with caplog.at_level("WARNING", logger="mxnet_pfc.runtime.device"):
        assert device.choose_context("auto", 0, gpus=h100) == mx.cpu()
    assert "running on the CPU: MXNet sees no GPU (nvidia-smi lists NVIDIA H100 80GB HBM3" in caplog.text
    assert "no kernels for compute capability above 8.6" in caplog.text       # and why, at start


def test_horovod_check_before_the_first_gpu_step(caplog):
    with pytest.raises(ConfigError, match="Horovod was built without CUDA"):
        device.check_horovod_gpu(mx.gpu(0), distributed=True, horovod_build=(False, 0))
    with caplog.at_level("WARNING", logger="mxnet_pfc.runtime.device"):
        device.check_horovod_gpu(mx.gpu(0), distributed=True, horovod_build=(True, 0))
    assert "without NCCL" in caplog.text and "host memory" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="mxnet_pfc.runtime.device"):
        device.check_horovod_gpu(mx.gpu(0), distributed=True, horovod_build=(True, 22105))
        device.check_horovod_gpu(mx.cpu(), distributed=True, horovod_build=(False, 0))
        device.check_horovod_gpu(mx.gpu(0), distributed=False, horovod_build=(False, 0))
    assert caplog.text == ""
    cuda, nccl = comm.horovod_gpu_build()               # the installed Horovod's build flags
    assert isinstance(cuda, bool) and isinstance(nccl, int)


# ---- (c) the CUDA libraries on LD_LIBRARY_PATH ----

def fake_site_packages(root: Path) -> Path:
    site = root / "site-packages"
    for name in ("cuda_runtime", "cudnn", "nccl"):
        (site / "nvidia" / name / "lib").mkdir(parents=True)
    (site / "nvidia" / "__init__.py").write_text("")
    (site / "nvidia" / "no_libs").mkdir()
    return site


def test_cuda_libs_helper_lists_the_lib_folders(tmp_path):
    site = fake_site_packages(tmp_path)
    helper = str(REPO / "setup-utils" / "cuda-libs.sh")
    out = subprocess.run(["bash", helper, "--site-packages", str(site), str(site)], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out.split(":") == [str(site / "nvidia" / n / "lib") for n in ("cuda_runtime", "cudnn", "nccl")]
    out = subprocess.run(["bash", helper, "--site-packages", str(tmp_path / "empty")], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == ""
    # the test venv (CPU install): nothing
    assert subprocess.run(["bash", helper, sys.executable], capture_output=True, text=True,
                          check=True).stdout.strip() == ""


def test_rank_environment_threads_settings_and_cuda_libraries(tmp_path):
    site = fake_site_packages(tmp_path)
    libs = ":".join(str(site / "nvidia" / n / "lib") for n in ("cuda_runtime", "cudnn", "nccl"))
    env = rank_environment({"HOROVOD_LOCAL_SIZE": "2", "LD_LIBRARY_PATH": "/opt/x", "MXNET_ENGINE_TYPE": "",
                           "HOROVOD_CYCLE_TIME": "5"}, cpus=8, sites=[str(site), str(site)])
    assert env["LD_LIBRARY_PATH"] == f"{libs}:/opt/x"
    assert (env["OMP_NUM_THREADS"], env["MXNET_OMP_MAX_THREADS"]) == ("4", "4")     # 8 cores, 2 ranks on the host
    assert env["MXNET_ENGINE_TYPE"] == "ThreadedEnginePerDevice"                   # empty: none given
    assert env["HOROVOD_CYCLE_TIME"] == "5"                                         # the user's is kept
    assert "PYTHONPATH" not in env
    env = rank_environment({"OMPI_COMM_WORLD_LOCAL_SIZE": "16", "OMP_NUM_THREADS": "3"}, cpus=8,
                           sites=[str(tmp_path / "empty")])
    assert (env["OMP_NUM_THREADS"], env["MXNET_OMP_MAX_THREADS"]) == ("3", "3")
    assert "LD_LIBRARY_PATH" not in env
    assert rank_environment({"OMPI_COMM_WORLD_LOCAL_SIZE": "16"}, cpus=8, sites=[])["OMP_NUM_THREADS"] == "1"


def test_config_sh_starts_the_trainer_with_the_rank_environment(tmp_path):
    """config.sh with an interpreter whose site-packages hold the CUDA libraries' folders, the launcher, and a
    stand-in trainer that prints what it was started with."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    [site] = venv.glob("lib/python*/site-packages")
    for name in ("cuda_runtime", "cudnn"):
        (site / "nvidia" / name / "lib").mkdir(parents=True)
    (site / "mxnet_pfc" / "runtime").mkdir(parents=True)
    (site / "mxnet_pfc" / "__init__.py").write_text("")
    (site / "mxnet_pfc" / "runtime" / "__init__.py").write_text("")
    # the launcher and what it imports (stdlib beneath)
    for module in ("launch_rank.py", "rank_environment.py", "slurm.py", "errors.py"):
        (site / "mxnet_pfc" / "runtime" / module).write_bytes((REPO / "mxnet_pfc" / "runtime" / module).read_bytes())
    (site / "mxnet_pfc" / "train.py").write_text(
        "import os, sys\nprint('ARGS=' + ' '.join(sys.argv[1:]))\n"
        "for name in ('LD_LIBRARY_PATH', 'OMP_NUM_THREADS', 'PYTHONPATH'):\n"
        "    print(f'{name}={os.environ.get(name, \"unset\")}')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    out = subprocess.run(["bash", str(REPO / "config.sh"), "--", "--max_update", "1"], cwd=tmp_path,
                         env={**env, "PYTHON": str(venv / "bin" / "python"), "LD_LIBRARY_PATH": "/opt/x",
                              "HOROVOD_LOCAL_SIZE": str(os.cpu_count() * 2)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    libs = ":".join(str(site / "nvidia" / n / "lib") for n in ("cuda_runtime", "cudnn"))
    assert out.stdout.splitlines() == ["ARGS=--max_update 1", f"LD_LIBRARY_PATH={libs}:/opt/x", "OMP_NUM_THREADS=1",
                                       "PYTHONPATH=unset"]


# ---- the package ----

def test_wheel_ships_the_packages_the_kernel_source_and_the_commands(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (src / name).write_bytes((REPO / name).read_bytes())
    for package in ("mxnet_pfc", "symbols"):
        subprocess.run(["cp", "-r", str(REPO / package), str(src)], check=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           str(src), "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [wheel] = (tmp_path / "dist").glob("mxnet_pfc-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("mxnet_pfc/head/kernels/pfc_kernels.cc", "mxnet_pfc/head/kernels/__init__.py",
                 "mxnet_pfc/runtime/device.py",
                 "mxnet_pfc/data/records.py", "mxnet_pfc/eval/verification.py", "symbols/__init__.py",
                 "symbols/iresnet.py"):
        assert name in names, name
    assert not any(n.startswith(("tests/", "benchmarks/", "setup-utils/")) for n in names)
    entry_points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for command in ("mxnet-pfc-train = mxnet_pfc.train:main", "mxnet-pfc-export", "mxnet-pfc-embed",
                    "mxnet-pfc-verify", "mxnet-pfc-plan", "mxnet-pfc-pack = mxnet_pfc.data.pack:main",
                    "mxnet-pfc-check = mxnet_pfc.data.check:main", "mxnet-pfc-synthetic",
                    "mxnet-pfc-ijb = mxnet_pfc.ijb:main",
                    "mxnet-pfc-onnx-check = mxnet_pfc.onnx_check:main"):
        assert command in entry_points, command


def test_installed_package_imports_without_pythonpath(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", "import mxnet_pfc, mxnet_pfc.head.kernels.build, symbols; "
                           "print(mxnet_pfc.head.kernels.build.SOURCE.is_file(), symbols.names())"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("True ") and "r18-lite" in proc.stdout
    plan = Path(sys.executable).parent / "mxnet-pfc-plan"
    proc = subprocess.run([str(plan), "--help"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "usage:" in proc.stdout, proc.stderr[-3000:]


# ---- the Horovod patch (setup-utils/patch_horovod.py) ----

PATCH = REPO / "setup-utils" / "patch_horovod.py"
MARKER = "mxnet-pfc patch r3"


def installed_horovod() -> Path:
    import importlib.util
    return Path(importlib.util.find_spec("horovod").origin).parent


def horovod_copy(root: Path, version: str = "0.28.1") -> Path:
    """A horovod package with this venv's original (unpatched) gloo_run.py and `version`, importable from root."""
    hvd = root / "horovod"
    (hvd / "runner").mkdir(parents=True)
    (hvd / "__init__.py").write_text(f"__version__ = '{version}'\n")
    original = installed_horovod() / "runner" / "gloo_run.py.mxnet-pfc-orig"
    (hvd / "runner" / "gloo_run.py").write_bytes(original.read_bytes())
    return hvd / "runner" / "gloo_run.py"


def run_patch(root: "Path | None") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if root is not None:
        env["PYTHONPATH"] = str(root)
    return subprocess.run([sys.executable, str(PATCH)], env=env, capture_output=True, text=True, timeout=60)


def test_patch_applies_once_and_keeps_the_original(tmp_path):
    target = horovod_copy(tmp_path)
    original = target.read_text()
    first = run_patch(tmp_path)
    assert first.returncode == 0 and f"[setup] patched {target}" in first.stdout, first.stderr
    patched = target.read_text()
    assert MARKER in patched and "class _ShutdownOnSignal" in patched and "rank {} failed first" in patched
    assert Path(f"{target}.mxnet-pfc-orig").read_text() == original
    compile(patched, str(target), "exec")
    again = run_patch(tmp_path)                          # idempotent: nothing printed, nothing written
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert target.read_text() == patched


def test_patch_replaces_an_earlier_revision_from_the_original(tmp_path):
    target = horovod_copy(tmp_path)
    assert run_patch(tmp_path).returncode == 0
    patched = target.read_text()
    target.write_text(patched.replace(MARKER, "mxnet-pfc patch r2"))
    proc = run_patch(tmp_path)
    assert proc.returncode == 0 and "[setup] patched" in proc.stdout, proc.stderr
    assert target.read_text() == patched


def test_patch_refuses_another_horovod_and_changes_nothing(tmp_path):
    target = horovod_copy(tmp_path, version="0.28.0")
    original = target.read_text()
    proc = run_patch(tmp_path)
    assert proc.returncode == 1
    assert "Horovod 0.28.0 is installed, not 0.28.1; nothing was changed" in proc.stderr
    assert target.read_text() == original and not Path(f"{target}.mxnet-pfc-orig").exists()


def test_the_venv_horovod_is_patched_and_patching_again_is_a_no_op():
    assert MARKER in (installed_horovod() / "runner" / "gloo_run.py").read_text()
    proc = run_patch(None)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
