"""Compiling the fused kernels (pfc_kernels.cc) and loading them into MXNet.

The library is compiled on first use into a cache folder (MXNET_PFC_CACHE, by
default ~/.cache/mxnet_pfc), keyed by source, flags, MXNet version and CPU, so
that several ranks starting together compile it once (under a file lock).
MXNet loads a custom-op library safely only before Horovod starts its threads,
so this module hands `load_fused` to comm, which runs it before hvd.init().
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import mxnet as mx

from mxnet_pfc.runtime import comm

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("pfc_kernels.cc")
# -Bsymbolic: calls inside the library bind to its own copy of lib_api.cc, never to
# the one in libmxnet.so (other std::string ABI), which Horovod makes global.
# No -ffast-math (nor -Ofast, -funsafe-math-optimizations): linking with it adds
# crtfastmath.o, whose startup code turns on flush-to-zero and denormals-are-zero
# for the whole process that loads the library. The two flags below change no
# computed value; -fno-trapping-math lets GCC vectorise the branches of CurricularFace's
# loop, and the exp loops vectorise through libmvec (pfc_kernels.cc). Measured
# as fast as -ffast-math (docs/benchmarks.md, speed of the head).
FLAGS = ["-std=c++17", "-O3", "-fno-math-errno", "-fno-trapping-math", "-march=native", "-fopenmp", "-fPIC",
         "-shared", "-Wl,-Bsymbolic"]
_loaded: "bool | None" = None


def _mxnet_dir() -> Path:
    return Path(mx.__file__).parent


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return "unknown"


def _blas_flags() -> "list[str]":
    """Link against the OpenBLAS that MXNet ships beside libmxnet.so (its `dot` uses it)."""
    return [f"-L{_mxnet_dir()}", "-l:libopenblas.so.0", f"-Wl,-rpath,{_mxnet_dir()}"]


def library_path() -> Path:
    """Where the compiled kernels for this source, MXNet and CPU live."""
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), (_mxnet_dir() / "src" / "lib_api.cc").read_bytes(),
                 " ".join(FLAGS + _blas_flags()).encode(), mx.__version__.encode(), _cpu_signature().encode()):
        digest.update(part)
    cache = Path(os.environ.get("MXNET_PFC_CACHE", Path.home() / ".cache" / "mxnet_pfc"))
    return cache / f"libpfc_kernels-{digest.hexdigest()[:16]}.so"


def build(path: "Path | None" = None) -> Path:
    """Compile the kernels unless already there; raises RuntimeError on failure."""
    path = path or library_path()
    if path.exists():
        return path
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) found")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)          # other ranks wait here, then find it built
        if path.exists():
            return path
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
        os.close(fd)
        cmd = [compiler, *FLAGS, f"-I{_mxnet_dir() / 'include'}", str(SOURCE),
               str(_mxnet_dir() / "src" / "lib_api.cc"), "-o", tmp, *_blas_flags()]
        log.info("compiling the fused Partial FC kernels: %s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"compiling {SOURCE.name} failed:\n{proc.stderr[-3000:]}")
        os.replace(tmp, path)                     # atomic: nobody loads a half-written file
    return path


def load_fused() -> bool:
    """Load the fused kernels into MXNet once per process; False when unavailable."""
    global _loaded
    if _loaded is None:
        _loaded = False
        if os.environ.get("MXNET_PFC_KERNELS", "1") == "0":
            log.info("fused kernels disabled by MXNET_PFC_KERNELS=0")
        elif _horovod_started():
            log.warning("fused Partial FC kernels not loaded: Horovod was initialised first (import the head "
                        "before mxnet_pfc.runtime.comm.init(), and call that instead of hvd.init()); using MXNet ops")
        else:
            try:
                mx.library.load(str(build()), verbose=False)
                _loaded = True
            except Exception as err:              # any failure: fall back, say why
                log.warning("fused Partial FC kernels unavailable (%s); using MXNet ops", err)
    return _loaded


def _horovod_started() -> bool:
    """Whether horovod.mxnet is initialised (loading a library after that crashes MXNet)."""
    hvd = sys.modules.get("horovod.mxnet")
    if hvd is None:
        return False
    try:
        return bool(hvd.is_initialized())
    except Exception:
        return True


comm.run_before_horovod(load_fused)       # so that every process that imports the head loads them in time
