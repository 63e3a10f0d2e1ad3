"""The preflight `python -m mxnet_pfc.doctor` (issue 34 item 3) on faked GPU machines.

Also the one home of the MXNet CUDA wheels' architectures (mxnet_pfc/runtime/mxnet_wheel_gpus.txt) that set-up
and the trainer share.

A stand-in nvidia-smi on PATH answers as a real one for an A100 (8.0), an H100 (9.0) or nothing; a fake
library holds CUDA fat binaries for the architectures. This machine's MXNet is the CPU wheel, so the runs
with a CUDA wheel fake MXNet's GPU count and the installed wheel's name in-process; the others run the
command as users do. None of this ran on a GPU.
"""
import os
import struct
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import pytest

from launch import REPO
from mxnet_pfc import doctor
from mxnet_pfc.runtime import device
from test_gpu_setup import A100, H100, dry_run, fake_nvidia_smi, system_path

A100_MEMORY = (*A100, "81920 MiB")
H100_MEMORY = (*H100, "81559 MiB")


def fake_nvidia_smi_with_memory(folder: Path, gpus) -> None:
    """nvidia-smi answering the doctor's --query-gpu=name,compute_cap,memory.total (and -L)."""
    folder.mkdir(parents=True, exist_ok=True)
    listing = "".join(f"GPU {i}: {name} (UUID: GPU-{i:08d})\\n" for i, (name, _, _) in enumerate(gpus))
    query = "".join(f"{name}, {cap}, {memory}\\n" for name, cap, memory in gpus)
    script = folder / "nvidia-smi"
    script.write_text(f'#!/bin/bash\ncase "$*" in\n  *-L*) printf "{listing}" ;;\n'
                      f'  *--query-gpu=name,compute_cap,memory.total*) printf "{query}" ;;\n'
                      f'  *) echo "unexpected: $*" >&2; exit 1 ;;\nesac\n')
    script.chmod(0o755)


def fake_cuda_library(path: Path, cubins=(), ptx=()) -> Path:
    """A 64-bit ELF file whose .nv_fatbin section holds two fat binary containers (padding between them) with
    machine code for `cubins` (sm numbers) and PTX for `ptx`, in the layout CUDA's toolchain writes."""
    def entry(kind, arch):
        payload = bytes(16)
        header = struct.pack("<HHIQIIHHI", kind, 0x101, 64, len(payload), 0, 0, 0, 0, arch).ljust(64, b"\0")
        return header + payload

    def container(entries):
        body = b"".join(entries)
        return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body

    entries = [entry(2, arch) for arch in cubins] + [entry(1, arch) for arch in ptx]
    half = len(entries) // 2
    fatbin = container(entries[:half]) + bytes(8) + container(entries[half:])
    names = b"\0.nv_fatbin\0.shstrtab\0"
    data_at, names_at = 64, 64 + len(fatbin)
    shoff = names_at + len(names)
    header = bytearray(64)
    header[:7] = b"\x7fELF\x02\x01\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)
    sections = [bytes(64),
                struct.pack("<IIQQQQ", 1, 1, 0, 0, data_at, len(fatbin)).ljust(64, b"\0"),
                struct.pack("<IIQQQQ", 12, 3, 0, 0, names_at, len(names)).ljust(64, b"\0")]
    path.write_bytes(bytes(header) + fatbin + names + b"".join(sections))
    return path


# ---- one home of the wheels' architectures

@pytest.mark.parametrize("cap", ["3.7", "5.0", "5.2", "6.1", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0"])
def test_setup_and_the_trainer_read_one_table_and_agree(tmp_path, cap):
    """install.sh (bash) and device.wheel_runs_on decide alike for every GPU generation: 8.9 (L4, L40, RTX 40xx)
    runs the sm_86 code (CUDA runs sm_8y code on any 8.z, z >= y); 9.0 (H100) and 3.7 have none."""
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, [("NVIDIA Test GPU", cap)])
    out = dry_run(tmp_path, bin_dir)
    setup_refuses = "no MXNet kernels for NVIDIA Test GPU" in out
    major, minor = map(int, cap.split("."))
    assert setup_refuses == (not device.wheel_runs_on((major, minor))), out
    assert device.wheel_runs_on((major, minor)) == (cap in ("5.0", "5.2", "6.1", "7.5", "8.0", "8.6", "8.9"))


def test_the_table_is_a_file_both_read():
    table = device.WHEEL_GPUS_FILE
    assert table.parent == REPO / "mxnet_pfc" / "runtime"
    assert "architectures=sm_50 sm_60 sm_70 sm_80 sm_86\n" in table.read_text()
    assert str(table.relative_to(REPO)) in (REPO / "setup-utils" / "install.sh").read_text()
    assert (device.MAX_COMPUTE_CAPABILITY, device.WHEEL_ARCHITECTURES) == ((8, 6), "sm_50, 60, 70, 80, 86")
    assert '"mxnet_pfc.runtime" = ["*.txt"]' in (REPO / "pyproject.toml").read_text()     # shipped in the wheel


# ---- the architectures read from the library

def test_architectures_are_read_from_the_librarys_fat_binaries(tmp_path):
    library = fake_cuda_library(tmp_path / "libmxnet.so", cubins=[86, 50, 60, 70, 80])
    assert doctor.fatbin_architectures(library) == ["sm_50", "sm_60", "sm_70", "sm_80", "sm_86"]
    library = fake_cuda_library(tmp_path / "libptx.so", cubins=[80, 90], ptx=[90])
    assert doctor.fatbin_architectures(library) == ["sm_80", "compute_90", "sm_90"]
    assert doctor.fatbin_architectures(doctor.mxnet_library()) == []           # this machine's CPU wheel
    (tmp_path / "not-elf.so").write_bytes(b"not a library")
    assert doctor.fatbin_architectures(tmp_path / "not-elf.so") is None
    assert doctor.fatbin_architectures(tmp_path / "missing.so") is None


# ---- the command

def run_doctor(tmp_path, *args, gpus=None):
    """python -m mxnet_pfc.doctor as a user runs it, with a stand-in nvidia-smi for `gpus` (None: none on PATH)."""
    bin_dir = tmp_path / "bin"
    path = system_path()
    if gpus is not None:
        fake_nvidia_smi_with_memory(bin_dir, gpus)
        path = f"{bin_dir}:{path}"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{path}"}
    return subprocess.run([sys.executable, "-m", "mxnet_pfc.doctor", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_no_gpu_machine_can_start_on_the_cpu(tmp_path):
    proc = run_doctor(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("mxnet-pfc doctor: what this machine will run\n")
    for line in (f"  python     {sys.version.split()[0]}", "  mxnet      1.9.1, CPU build",
                 "no GPU kernels (the CPU wheel)", "  gpu        none: nvidia-smi is not on PATH",
                 "  horovod    0.28.1: frameworks MXNet; controllers Gloo yes, MPI yes",
                 "  config.sh  will train on the CPU: MXNet sees no GPU and nvidia-smi lists none",
                 "  kernels    fused CPU kernels", "  memory     ", "GiB free for the output folder output",
                 "A run can start here."):
        assert line in out, (line, out)
    assert len(out.splitlines()) < 25                 # one screen


def test_h100_with_the_cpu_wheel_says_the_wheel_cannot_and_the_route(tmp_path):
    """What set-up leaves on an H100 machine: the CPU wheel. A run starts on the CPU; the screen says why."""
    proc = run_doctor(tmp_path, gpus=[H100_MEMORY])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "gpu        0: NVIDIA H100 80GB HBM3, compute capability 9.0, 81559 MiB: this MXNet (CPU build)" in out
    assert "the MXNet 1.9.1 CUDA wheels have no kernels for these GPUs: NVIDIA's MXNet containers (NGC)" in out
    assert ("config.sh  will train on the CPU: running on the CPU: MXNet sees no GPU (nvidia-smi lists "
            "NVIDIA H100") in out
    assert "no kernels for compute capability above 8.6" in out


def test_a_set_that_cannot_be_read_is_a_reason_not_to_start(tmp_path):
    proc = run_doctor(tmp_path, "--rec", "data/mine/train.rec")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "A run cannot start here:\n  - the set cannot be used: " in proc.stdout
    assert "data/mine/train.rec" in proc.stdout.split("A run cannot start here:")[1]


def test_help_says_what_it_checks(tmp_path):
    proc = run_doctor(tmp_path, "--help")
    assert proc.returncode == 0 and "--rec" in proc.stdout and "Exit 0 when a run can start" in proc.stdout


def test_make_doctor_runs_it_after_setup():
    proc = subprocess.run(["make", "-n", "doctor"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "setup-utils/install.sh" in proc.stdout
    assert "-m mxnet_pfc.doctor" in proc.stdout, proc.stdout


# ---- machines with a CUDA wheel (faked in-process: MXNet's GPU count, the wheel's name, Horovod's build)

@pytest.fixture
def cuda_machine(tmp_path, monkeypatch, capsys):
    """Runs doctor.main on a machine with nvidia-smi listing `gpus` and the mxnet-cu112 wheel installed."""
    import horovod.mxnet as hvd
    library = fake_cuda_library(tmp_path / "libmxnet.so", cubins=[50, 60, 70, 80, 86])
    monkeypatch.setattr(doctor, "mxnet_library", lambda: str(library))
    monkeypatch.setattr(device, "mxnet_cuda_wheel", lambda: "mxnet-cu112==1.9.1")
    monkeypatch.setattr(hvd, "cuda_built", lambda: True)
    monkeypatch.setattr(hvd, "nccl_built", lambda: 21805)
    monkeypatch.chdir(tmp_path)

    def run(gpus, *args):
        fake_nvidia_smi_with_memory(tmp_path / "bin", gpus)
        monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{system_path()}")
        monkeypatch.setattr(mx.context, "num_gpus", lambda: len(gpus))
        code = doctor.main(list(args))
        return code, capsys.readouterr().out
    return run


def write_property(folder: Path, identities: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "property").write_text(f"{identities},112,112\n")
    return folder / "train.rec"


def test_a100_machine_runs_on_its_gpus(cuda_machine, tmp_path):
    rec = write_property(tmp_path / "data" / "ms1m", 93_431)
    code, out = cuda_machine([A100_MEMORY] * 8, "--rec", str(rec))
    assert code == 0, out
    assert "  mxnet      1.9.1, mxnet-cu112==1.9.1, CUDA 11.2" in out
    assert "GPU kernels in " in out and "libmxnet.so: sm_50 sm_60 sm_70 sm_80 sm_86 (no PTX)" in out
    assert out.count("NVIDIA A100-SXM4-80GB, compute capability 8.0, 81920 MiB: this MXNet can run on it") == 8
    assert "horovod    0.28.1: frameworks MXNet; controllers Gloo yes, MPI yes; GPU operations: CUDA yes, " \
           "NCCL 2.18.5" in out
    assert "config.sh  will train on the GPU: MXNet sees 8 GPU(s)" in out
    assert f"set        {rec}: 93,431 identities" in out and "on 8 ranks" in out
    assert "GiB per rank fits in 80.0 GiB per GPU" in out
    assert "A run can start here." in out


def test_a100_machine_with_a_head_too_large_is_told_before_it_starts(cuda_machine, tmp_path):
    rec = write_property(tmp_path / "data" / "huge", 16_000_000)       # RecordIO's labels stop at 2^24
    code, out = cuda_machine([A100_MEMORY] * 8, "--rec", str(rec), "--np", "1")
    assert code == 1, out
    assert "does NOT fit in 80.0 GiB per GPU" in out and "python -m mxnet_pfc.plan" in out
    assert f"  - the head of {rec} needs" in out


def test_h100_machine_with_the_cuda_wheel_cannot_start_and_says_the_route(cuda_machine):
    code, out = cuda_machine([H100_MEMORY] * 8)
    assert code == 1, out
    assert ("0: NVIDIA H100 80GB HBM3, compute capability 9.0, 81559 MiB: this MXNet has no kernels for it "
            "(no sm_9x code, no PTX); NVIDIA's MXNet containers (NGC) are built for sm_90") in out
    assert "config.sh  will stop: MXNet (mxnet-cu112==1.9.1) cannot run on NVIDIA H100 80GB HBM3" in out
    assert "A run cannot start here:\n  - the trainer refuses this machine: " in out and "NGC" in out


def test_several_sets_are_judged_by_every_head(cuda_machine, tmp_path):
    """--rec and --images as the trainer takes them, repeated: the verdict counts each set's head over its rows
    of the batch (split by the sets' sizes), as the planner does."""
    from mxnet_pfc.data import synthetic_set
    from mxnet_pfc.data.set_rows import rows_per_set
    from mxnet_pfc.head.memory_model import GIB, combined, head_memory

    synthetic_set.generate(str(tmp_path / "a"), 40, 8, val_identities=10, val_pairs=100, seed=0)
    synthetic_set.generate(str(tmp_path / "b"), 24, 8, val_identities=10, val_pairs=100, seed=1)
    code, out = cuda_machine([A100_MEMORY] * 8, "--rec", str(tmp_path / "a" / "train.rec"), "--rec",
                             str(tmp_path / "b" / "train.rec"), "--np", "2")
    assert code == 0, out
    rows = rows_per_set(128, [320, 192])
    assert f"40 + 24 identities in 2 heads ({rows[0]} + {rows[1]} rows of each batch)" in out
    total = combined([head_memory(n, 2, 512, 1.0, r) for n, r in zip((40, 24), rows)]).total
    assert f"head {total / GIB:.2f} GiB per rank fits" in out
