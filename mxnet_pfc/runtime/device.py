"""Which device a rank trains on, and whether this machine can train there.

The MXNet 1.9.1 CUDA wheels (mxnet-cu112, mxnet-cu117) carry GPU machine code
for compute capability 5.0 to 8.6 (sm_50, 60, 70, 80, 86) and no PTX. On a
newer GPU (H100, H200: 9.0) the first operator fails with an opaque "no kernel
image is available"; with such a wheel installed, `choose_context` says so
before MXNet runs anything on the GPU, reading the GPUs from nvidia-smi (which
does not involve MXNet). An MXNet built from source is not second-guessed.

Horovod built without CUDA cannot take GPU arrays, and built without NCCL it
copies them through host memory: `check_horovod_gpu` says which, before the
first step.

Call order in the trainer (once per rank, before any collective):
    ctx = device.choose_context(cfg.context, comm.local_rank())
    device.check_horovod_gpu(ctx, comm.is_distributed())
"""
from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

from mxnet_pfc.runtime.errors import ConfigError

log = logging.getLogger(__name__)

WHEEL_GPUS_FILE = Path(__file__).with_name("mxnet_wheel_gpus.txt")


def _wheel_architectures() -> "list[str]":
    """The architectures (sm_XY) the MXNet 1.9.1 CUDA wheels have kernels for, from mxnet_wheel_gpus.txt,
    which setup-utils/install.sh reads too (one home of the fact)."""
    fields = dict(line.split("=", 1) for line in WHEEL_GPUS_FILE.read_text().splitlines()
                  if line.strip() and not line.startswith("#"))
    return fields["architectures"].split()


def architecture_capability(arch: str) -> "tuple[int, int]":
    """sm_86 -> (8, 6), sm_100 -> (10, 0)."""
    digits = arch.removeprefix("sm_").removeprefix("compute_")
    return int(digits[:-1]), int(digits[-1])


def wheel_runs_on(cap: "tuple[int, int]", architectures: "list[str] | None" = None) -> bool:
    """Whether machine code for `architectures` (default: the CUDA wheels') runs on a GPU of compute capability
    `cap`: CUDA runs code built for sm_XY on a GPU of X.Z when Y <= Z, same major only (its binary
    compatibility); the wheels carry no PTX for the driver to compile for other GPUs. install.sh's
    wheel_runs_on is the same rule."""
    return any(major == cap[0] and minor <= cap[1]
               for major, minor in map(architecture_capability, architectures or WHEEL_ARCHITECTURE_LIST))


# The architectures the MXNet 1.9.1 CUDA wheels have kernels for, and the highest of them.
WHEEL_ARCHITECTURE_LIST = _wheel_architectures()
MAX_COMPUTE_CAPABILITY = max(map(architecture_capability, WHEEL_ARCHITECTURE_LIST))
WHEEL_ARCHITECTURES = "sm_" + ", ".join(arch.removeprefix("sm_") for arch in WHEEL_ARCHITECTURE_LIST)
_MAX = "{}.{}".format(*MAX_COMPUTE_CAPABILITY)
WHAT_TO_DO = ("run NVIDIA's MXNet containers (NGC), which are built for newer GPUs, or MXNet built from source "
              "with CUDA 11.8 or 12 for this GPU's architecture (sm_90 for compute capability 9.0), "
              "or use a GPU of compute capability 5.0 to 8.x; --context cpu trains on the CPU")


def gpu_models(nvidia_smi: str = "nvidia-smi",
               timeout: float = 30) -> "list[tuple[str, tuple[int, int] | None]] | None":
    """[(name, (major, minor) or None when not reported)] for each GPU nvidia-smi lists.

    None when nvidia-smi is missing, fails or prints nothing usable: the GPUs
    cannot be checked then, which is not an error in itself.
    """
    if shutil.which(nvidia_smi) is None:
        return None
    try:
        proc = subprocess.run([nvidia_smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    gpus = []
    for line in proc.stdout.splitlines():
        if not line.strip():
            continue
        name, _, cap = line.rpartition(",")
        if not name:                      # no comma: not the format asked for
            return None
        try:
            major, minor = (int(part) for part in cap.strip().split("."))
            gpus.append((name.strip(), (major, minor)))
        except ValueError:                # "[N/A]" and the like
            gpus.append((name.strip(), None))
    return gpus or None


def unsupported_gpus(gpus: "list[tuple[str, tuple[int, int] | None]] | None") -> "list[tuple[str, tuple[int, int]]]":
    """The GPUs whose compute capability is known and that the MXNet wheels' kernels do not run on."""
    return [(name, cap) for name, cap in gpus or [] if cap is not None and not wheel_runs_on(cap)]


def check_compute_capability(gpus: "list[tuple[str, tuple[int, int] | None]] | None" = None,
                             wheel: "str | None" = None) -> None:
    """Raise ConfigError when a GPU is newer than the MXNet CUDA wheels' kernels (read from nvidia-smi).

    Every GPU nvidia-smi lists is checked (the ranks of a host use all of them).
    Unknown capabilities and a missing or failing nvidia-smi pass: only a GPU known
    to be unsupported stops the run. Only the registry's CUDA wheels (`wheel`: the
    installed mxnet-cu* distribution, found when not given) are known to lack the
    kernels: an MXNet built from source for the GPU passes.
    """
    if wheel is None:
        wheel = mxnet_cuda_wheel()
    if not wheel:
        return
    if gpus is None:
        gpus = gpu_models()
    bad = unsupported_gpus(gpus)
    if bad:
        named = ", ".join(f"{name} (compute capability {major}.{minor})" for name, (major, minor) in bad)
        raise ConfigError(f"MXNet ({wheel}) cannot run on {named}: the MXNet 1.9.1 CUDA wheels carry machine code "
                          f"for compute capability 5.0 to {_MAX} only ({WHEEL_ARCHITECTURES}) and no PTX. "
                          f"{WHAT_TO_DO[0].upper()}{WHAT_TO_DO[1:]}.")


def mxnet_cuda_wheel() -> str:
    """'mxnet-cu112==1.9.1' (say) when MXNet is one of the registry's CUDA wheels, else ''."""
    from importlib import metadata
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name.startswith("mxnet-cu"):
            return f"{name}=={dist.version}"
    return ""


def choose_context(kind: str, local_rank: int, gpus: "list | None" = None):
    """The context of this rank: GPU local_rank (mod the GPUs MXNet sees) when there are GPUs
    and `kind` is "auto" or "gpu", else the CPU.

    Raises ConfigError for "gpu" when MXNet sees no GPU (naming the GPUs nvidia-smi
    lists, if any), and before any GPU operation when a GPU is newer than the MXNet
    wheels support. `gpus` stands in for nvidia-smi's list (tests).
    """
    import mxnet as mx

    if kind == "cpu":
        return mx.cpu()
    count = mx.context.num_gpus()
    if count == 0:
        if gpus is None:
            gpus = gpu_models()
        seen = ""
        if gpus:
            seen = (f" (nvidia-smi lists {', '.join(name for name, _ in gpus)}; this MXNet is "
                    f"{'a CUDA build' if _mxnet_has_cuda() else 'the CPU wheel'})")
        hint = ""
        if gpus and unsupported_gpus(gpus):
            hint = f": the MXNet 1.9.1 CUDA wheels have no kernels for compute capability above {_MAX}; {WHAT_TO_DO}"
        elif gpus and not _mxnet_has_cuda():
            hint = ": install the CUDA wheel (make setup on this machine, or MXNET_PACKAGE=mxnet-cu112==1.9.1)"
        if kind == "gpu":
            raise ConfigError(f"context = gpu, but MXNet sees no GPU{seen}{hint}")
        if gpus:
            log.warning(f"running on the CPU: MXNet sees no GPU{seen}{hint}")
        return mx.cpu()
    check_compute_capability(gpus)
    return mx.gpu(local_rank % count)


def add_context_option(parser, what: str = "run the model") -> None:
    """--context of the commands that run a saved model (verify, embed, ijb) or compute on one (`what` they
    do there); see choose_context."""
    parser.add_argument("--context", choices=["auto", "cpu", "gpu"], default="auto",
                        help=f"where to {what}: auto takes the first GPU MXNet sees (stopping with the "
                             "reason if the MXNet wheel has no kernels for it), else the CPU; gpu stops with the "
                             "reason when there is none (default: %(default)s)")


def check_horovod_gpu(ctx, distributed: bool, horovod_build: "tuple[bool, int] | None" = None) -> None:
    """Before the first step: whether Horovod can reduce this rank's GPU arrays.

    Horovod built without CUDA refuses GPU arrays (ConfigError here instead of an
    error inside the first allreduce); built with CUDA but without NCCL it copies
    them through host memory (a warning: it works, slowly). Nothing to check on
    the CPU, or without a launcher (a world of one calls no collective).
    `horovod_build` is comm.horovod_gpu_build()'s (cuda, nccl), read when not given.
    """
    if ctx.device_type != "gpu" or not distributed:
        return
    if horovod_build is None:
        from mxnet_pfc.runtime import comm
        horovod_build = comm.horovod_gpu_build()
    cuda, nccl = horovod_build
    if not cuda:
        raise ConfigError("context = gpu with several ranks, but Horovod was built without CUDA and cannot take "
                          "GPU arrays: install a CUDA toolkit (nvcc) and run make setup again (it then builds "
                          "Horovod with CUDA and NCCL), or train with --context cpu")
    if not nccl:
        log.warning("Horovod was built with CUDA but without NCCL: every collective copies its GPU arrays through "
                    "host memory (slow). make setup on a machine with a CUDA toolkit builds it with NCCL")


def _mxnet_has_cuda() -> bool:
    try:
        import mxnet as mx
        return mx.runtime.Features().is_enabled("CUDA")
    except Exception:
        return False
