"""What this machine will run: the preflight to run first, above all on a GPU machine.

    python -m mxnet_pfc.doctor                                  # also: make doctor
    python -m mxnet_pfc.doctor --rec data/mine/train.rec        # and whether this set's head fits

One screen: Python; the MXNet package and its build (CPU or CUDA, and the GPU
architectures its library holds kernels for, read from the library's CUDA fat
binaries); each GPU nvidia-smi lists, with its compute capability, memory and
whether this MXNet can run on it; Horovod's frameworks and controllers as
built; whether config.sh will train on a GPU or the CPU, and why (the
trainer's own decision, runtime/device.py, called here); the fused kernels'
state; free memory and disk in the output folder; and with --rec/--images the
memory planner's verdict (mxnet_pfc.plan) for the set on the GPUs found.

Exit 0 when a run can start, 1 when it cannot (the reasons are printed last).
It runs with a rank's environment (runtime/rank_environment.py, as config.sh does), so it
sees the CUDA libraries a rank sees.
"""
from __future__ import annotations

import argparse
import logging
import mmap
import os
import platform
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mxnet_pfc.runtime import device, rank_environment

GIB = 2 ** 30
FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)      # a CUDA fat binary container's header
ROUTE = ("NVIDIA's MXNet containers (NGC) are built for sm_90; or train on the CPU (make setup installs the "
         "CPU wheel on such a machine; --context cpu)")


@dataclass
class Report:
    """The lines of the screen and the reasons a run cannot start."""
    lines: "list[tuple[str, str]]" = field(default_factory=list)
    blockers: "list[str]" = field(default_factory=list)
    notes: "list[str]" = field(default_factory=list)

    def add(self, topic: str, text: str) -> None:
        self.lines.append((topic, text))

    def render(self) -> str:
        out = ["mxnet-pfc doctor: what this machine will run"]
        out += [f"  {topic:<10} {text}" for topic, text in self.lines]
        out += [f"  note: {note}" for note in self.notes]
        if self.blockers:
            out.append("A run cannot start here:")
            out += [f"  - {reason}" for reason in self.blockers]
        else:
            out.append("A run can start here.")
        return "\n".join(out)


# ---- facts read from files and tools

def fatbin_architectures(library: "str | Path") -> "list[str] | None":
    """The GPU code in an ELF library's CUDA fat binaries (its .nv_fatbin section): 'sm_XY' for machine code,
    'compute_XY' for PTX, sorted; [] when the library has no such section (a CPU build); None when the file
    cannot be read as a 64-bit ELF. Only the headers are read (the section of a CUDA MXNet is ~500 MB)."""
    try:
        with open(library, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:5] != b"\x7fELF\x02":
                return None
            shoff, = struct.unpack_from("<Q", data, 0x28)
            shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
            sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
            names_at = sections[shstrndx][4]
            for name, _type, _flags, _addr, offset, size in sections:
                if data[names_at + name:data.find(b"\0", names_at + name)] == b".nv_fatbin":
                    found = _fatbin_entries(data, offset, offset + size)
                    return sorted(found, key=lambda arch: (device.architecture_capability(arch), arch))
            return []
    except (OSError, ValueError, struct.error, IndexError):
        return None


def _fatbin_entries(data, start: int, end: int) -> "set[str]":
    """The architectures of every fat binary container between start and end (containers may be padded)."""
    found, at = set(), data.find(FATBIN_MAGIC, start, end)
    while at >= 0:
        header_size, = struct.unpack_from("<H", data, at + 6)
        body, = struct.unpack_from("<Q", data, at + 8)
        entry, container_end = at + header_size, at + header_size + body
        while entry + 32 <= container_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch, = struct.unpack_from("<I", data, entry + 28)
            if entry_header == 0:
                break
            found.add(f"{'compute' if kind == 1 else 'sm'}_{arch}")
            entry += entry_header + payload
        at = data.find(FATBIN_MAGIC, max(container_end, at + 4), end)
    return found


def nvidia_smi_gpus() -> "tuple[list[tuple[str, tuple[int, int] | None, str]], str]":
    """([(name, compute capability or None, memory)], what nvidia-smi said when it lists none)."""
    if shutil.which("nvidia-smi") is None:
        return [], "nvidia-smi is not on PATH (no NVIDIA driver here)"
    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return [], f"nvidia-smi failed: {error}"
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        return [], f"nvidia-smi failed (exit {proc.returncode}): {said[0] if said else 'no output'}"
    gpus = []
    for line in proc.stdout.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 3:
            continue
        memory, cap = parts[-1], parts[-2]
        try:
            capability = tuple(int(x) for x in cap.split("."))
        except ValueError:
            capability = None
        gpus.append((", ".join(parts[:-2]), capability if capability and len(capability) == 2 else None, memory))
    return gpus, "" if gpus else "nvidia-smi lists no GPU"


def memory_gib(text: str) -> "float | None":
    """'81920 MiB' -> 80.0."""
    try:
        value, unit = text.split()
        return float(value) / {"MiB": 1024, "GiB": 1}[unit]
    except (ValueError, KeyError):
        return None


def available_host_memory() -> "tuple[float, float] | None":
    """(available, total) GiB from /proc/meminfo."""
    try:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return int(fields["MemAvailable"].split()[0]) / 2 ** 20, int(fields["MemTotal"].split()[0]) / 2 ** 20
    except (OSError, KeyError, ValueError):
        return None


def mxnet_library() -> "str | None":
    import mxnet as mx
    found = mx.libinfo.find_lib_path()
    return found[0] if found else None


# ---- the screen

def check(args: argparse.Namespace) -> Report:
    report = Report()
    version = platform.python_version()
    python_ok = sys.version_info[:2] >= (3, 11)
    report.add("python", f"{version} ({sys.executable})" + ("" if python_ok else ": 3.11 or later is needed"))
    if not python_ok:
        report.blockers.append(f"Python {version}: this project needs 3.11 (make setup builds its .venv with it)")

    try:
        import mxnet as mx
    except Exception as error:                       # any import failure is the finding
        report.add("mxnet", f"cannot be imported: {error}")
        report.blockers.append(f"MXNet cannot be imported ({error}): run make setup")
        return report
    wheel = device.mxnet_cuda_wheel()
    cuda = mx.runtime.Features().is_enabled("CUDA")
    build = "CUDA build" if cuda else "CPU build"
    if wheel:
        digits = wheel.split("==")[0].removeprefix("mxnet-cu")
        build = f"{wheel}, CUDA {digits[:-1]}.{digits[-1]}" if digits.isdigit() else wheel
    report.add("mxnet", f"{mx.__version__}, {build}")
    architectures = None
    if cuda or wheel:
        library = mxnet_library()
        architectures = fatbin_architectures(library) if library else None
        if architectures:
            report.add("", f"GPU kernels in {library}: {' '.join(architectures)}"
                       + ("" if any(a.startswith("compute_") for a in architectures) else " (no PTX)"))
        else:
            architectures = device.WHEEL_ARCHITECTURE_LIST
            report.add("", f"GPU kernels: {' '.join(architectures)} (the known table of the 1.9.1 CUDA wheels, "
                       f"{device.WHEEL_GPUS_FILE.name}; not read from the library)")
    else:
        report.add("", "no GPU kernels (the CPU wheel)")

    gpus, why_none = nvidia_smi_gpus()
    for index, (name, cap, memory) in enumerate(gpus):
        if cap is None:
            verdict = "compute capability not reported: not checked"
        elif not architectures:
            verdict = "this MXNet (CPU build) cannot use it"
        elif device.wheel_runs_on(cap, [a for a in architectures if a.startswith("sm_")]) or any(
                a.startswith("compute_") and device.architecture_capability(a) <= cap for a in architectures):
            verdict = "this MXNet can run on it"
        else:
            verdict = f"this MXNet has no kernels for it (no sm_{cap[0]}x code, no PTX); {ROUTE}"
        capability = f"compute capability {cap[0]}.{cap[1]}" if cap else "compute capability unknown"
        report.add("gpu" if index == 0 else "", f"{index}: {name}, {capability}, {memory}: {verdict}")
    if not gpus:
        report.add("gpu", f"none: {why_none}")
    if gpus and not (cuda or wheel) and device.unsupported_gpus([(n, c) for n, c, _ in gpus]):
        report.notes.append(f"the MXNet 1.9.1 CUDA wheels have no kernels for these GPUs: {ROUTE}")

    horovod = horovod_line(report)
    context = config_sh_context(report, [(name, cap) for name, cap, _ in gpus], horovod)
    kernels_line(report, context)
    output = args.output
    if args.sets:
        output = set_verdict(report, args, gpus, context) or output
    resources_lines(report, output or "output")
    return report


def horovod_line(report: Report) -> "tuple[bool, int] | None":
    """Horovod's build as (cuda, nccl), and its line; None when horovod.mxnet cannot be imported."""
    from mxnet_pfc.runtime import comm

    try:
        build = comm.horovod_build()
    except Exception as error:
        report.add("horovod", f"horovod.mxnet cannot be imported: {error}")
        report.blockers.append(f"Horovod with MXNet support cannot be imported ({error}): run make setup")
        return None
    yes = lambda flag: "yes" if flag else "no"     # noqa: E731
    nccl = build["nccl"]
    nccl_text = f"{nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}" if nccl else "no"
    report.add("horovod", f"{build['version']}: frameworks MXNet; controllers Gloo {yes(build['gloo'])}, MPI "
               f"{yes(build['mpi'])}; GPU operations: CUDA {yes(build['cuda'])}, NCCL {nccl_text}")
    return build["cuda"], nccl


class _Said(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def config_sh_context(report: Report, gpus: list, horovod: "tuple[bool, int] | None"):
    """Where config.sh's ranks will train, from the trainer's own choice (device.choose_context, --context auto)
    and its Horovod check for several ranks; its refusal is a blocker."""
    import mxnet as mx

    said, logger = _Said(), logging.getLogger(device.__name__)
    logger.addHandler(said)
    logger.propagate = False                         # said once, on the screen
    try:
        ctx = device.choose_context("auto", 0, gpus=gpus or [])
        if horovod is not None:
            device.check_horovod_gpu(ctx, distributed=True, horovod_build=horovod)
    except device.ConfigError as error:
        report.add("config.sh", f"will stop: {error}")
        report.blockers.append(f"the trainer refuses this machine: {error}")
        return None
    finally:
        logger.removeHandler(said)
        logger.propagate = True
    if ctx.device_type == "gpu":
        why = f"MXNet sees {mx.context.num_gpus()} GPU(s): rank i takes GPU i (mod their number)"
    elif said.messages:
        why = said.messages[0]
    else:
        why = "MXNet sees no GPU and nvidia-smi lists none"
    report.add("config.sh", f"will train on the {'GPU' if ctx.device_type == 'gpu' else 'CPU'}: {why}"
               + ("" if ctx.device_type == "gpu" else " (--context auto)"))
    for message in said.messages[1:]:
        report.notes.append(message)
    return ctx


def kernels_line(report: Report, context) -> None:
    """The fused CPU kernels of the head (compiled once into a cache; the head uses MXNet ops without them)."""
    if os.environ.get("MXNET_PFC_KERNELS", "1") == "0":
        report.add("kernels", "fused CPU kernels disabled by MXNET_PFC_KERNELS=0 (the head uses MXNet ops)")
        return
    from mxnet_pfc.head.kernels import build
    path = build.library_path()
    if not path.exists():
        report.add("kernels", f"fused CPU kernels not compiled yet: the first run compiles them into {path} "
                   "(make setup does it now); without a compiler the head uses MXNet ops")
        return
    state = "loaded" if build.load_fused() else "compiled but do not load (see the warning above; MXNet ops instead)"
    used = "" if context is None or context.device_type == "cpu" else " (a GPU run uses MXNet ops)"
    report.add("kernels", f"fused CPU kernels {state}: {path}{used}")


def set_verdict(report: Report, args: argparse.Namespace, gpus: list, context) -> "str | None":
    """The planner's head memory per rank for this set with the recipe the trainer would use, against the
    memory of the GPUs found (or this host's, on the CPU). Returns the run's output folder."""
    from mxnet_pfc.data import folders
    from mxnet_pfc.data.iterators import RecordSource
    from mxnet_pfc.data.set_rows import rows_per_set
    from mxnet_pfc.head.memory_model import combined, head_memory
    from mxnet_pfc.training import config as config_lib

    on_gpu = context is not None and context.device_type == "gpu"
    world = args.np or (len(gpus) if on_gpu else 2)
    what = " + ".join(path for _, path in args.sets)
    try:        # the sets as the trainer reads --rec and --images, in order (several: a head each)
        cfg = config_lib.parse_args([item for kind, path in args.sets for item in (f"--{kind}", path)])
        indexes = {number: folders.scan(path) for number, (kind, path) in enumerate(args.sets) if kind == "images"}
        cfg = config_lib.resolve_config(cfg, world, indexes.get(0), {n: i for n, i in indexes.items() if n})
        classes = [cfg.num_classes, *cfg.extra_classes]
        rows = [cfg.batch_size]
        if len(args.sets) > 1:      # each set's rows of the batch, by the sets' sizes as the trainer splits it
            rows = rows_per_set(cfg.batch_size, [len(RecordSource(path)) if kind == "rec" else len(indexes[number])
                                                 for number, (kind, path) in enumerate(args.sets)])
    except Exception as error:               # the trainer would stop on the same: the finding
        report.add("set", f"{what}: {error}")
        report.blockers.append(f"the set cannot be used: {error}")
        return None
    subcenters = config_lib.margin_of(cfg).subcenters
    memory = combined([head_memory(count, world, cfg.embedding_size, cfg.sample_rate, share, "float32",
                                   cfg.grad_accum, subcenters) for count, share in zip(classes, rows)])
    identities = " + ".join(f"{count:,}" for count in classes)
    heads = f" in {len(classes)} heads ({' + '.join(map(str, rows))} rows of each batch)" if len(classes) > 1 else ""
    report.add("set", f"{what}: {identities} identities{heads}; {cfg.network}, embedding {cfg.embedding_size}, "
               f"sample rate {cfg.sample_rate:g}, batch {cfg.batch_size}/rank on {world} ranks")
    if on_gpu:
        sizes = [memory_gib(m) for _, _, m in gpus]
        budget = min(s for s in sizes if s) if any(sizes) else None
        where = "per GPU"
    else:
        host = available_host_memory()
        budget = host[0] / world if host else None
        where = f"of this host's available memory per rank ({world} ranks)"
    head = memory.total / GIB
    if budget is None:
        report.add("", f"head {head:.2f} GiB per rank (planner); the memory to hold it is not known")
    elif head > budget:
        report.add("", f"head {head:.2f} GiB per rank does NOT fit in {budget:.1f} GiB {where} "
                   "(python -m mxnet_pfc.plan finds the sample rate or batch that fits)")
        report.blockers.append(f"the head of {what} needs {head:.2f} GiB per rank, more than {budget:.1f} GiB {where}")
    else:
        report.add("", f"head {head:.2f} GiB per rank fits in {budget:.1f} GiB {where}, leaving "
                   f"{budget - head:.1f} GiB for the backbone and activations (not in the planner)")
    return cfg.output


def resources_lines(report: Report, output: str) -> None:
    host = available_host_memory()
    if host:
        report.add("memory", f"{host[0]:.1f} GiB available of {host[1]:.1f} GiB")
    existing = Path(output).absolute()
    while not existing.exists():
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    report.add("disk", f"{usage.free / GIB:.1f} GiB free for the output folder {output} (on {existing})")


class _SetOption(argparse.Action):
    """--rec and --images, in the order given: [(kind, path), ...] (the trainer's sets, set 0 first)."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.sets = [*namespace.sets, (option_string.lstrip("-"), value)]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mxnet_pfc.doctor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rec", dest="sets", action=_SetOption, default=[],
                   help="an InsightFace RecordIO set (train.rec, train.idx beside it): the planner's verdict for its "
                        "head with the recipe the trainer would use; repeatable, and with --images, as the "
                        "trainer's (several sets: every head) (default: none)")
    p.add_argument("--images", dest="sets", action=_SetOption, default=[],
                   help="a folder of faces, FACES/<identity>/<images>: the same verdict (default: none)")
    p.add_argument("--np", type=int, default=0,
                   help="ranks for the set's verdict (default 0: one per GPU found, or 2 on the CPU as make run)")
    p.add_argument("--output", default="",
                   help="the output folder whose disk is reported (default: the run's, or output/)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    # A rank's environment (the CUDA libraries on LD_LIBRARY_PATH, read once by the loader): this process is
    # started again with it when it lacks it, so MXNet loads here as on a rank of config.sh.
    env = rank_environment.rank_environment(os.environ, len(os.sched_getaffinity(0)),
                                          rank_environment.site_packages())
    if env.get("LD_LIBRARY_PATH") != os.environ.get("LD_LIBRARY_PATH") and argv is None:
        os.execve(sys.executable, [sys.executable, "-m", "mxnet_pfc.doctor", *sys.argv[1:]], env)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report = check(args)
    print(report.render(), flush=True)
    return 1 if report.blockers else 0


if __name__ == "__main__":
    sys.exit(main())
