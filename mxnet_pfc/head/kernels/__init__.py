"""The head's memory-bound steps, fused (C++ CPU kernels) or composed of MXNet ops.

Both implementations have the same interface and are checked against the same
float64 reference. `head_ops(ctx)` picks the fused kernels for CPU contexts
when they build (g++ and the lib_api.h that ships with mxnet), and the MXNet
op compositions otherwise (GPU contexts, no compiler, or MXNET_PFC_KERNELS=0).

The library is compiled on first use into a cache folder (MXNET_PFC_CACHE, by
default ~/.cache/mxnet_pfc), keyed by source, flags, MXNet version and CPU, so
that several ranks starting together compile it once (under a file lock).

docs/DESIGN.md sections 2.3-2.6 give the math each step computes, 2.9 the NaN handling.
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
import numpy as np

nd = mx.nd
log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("pfc_kernels.cc")
# -Bsymbolic: calls inside the library bind to its own copy of lib_api.cc, never to
# the one in libmxnet.so (other std::string ABI), which Horovod makes global.
# -ffast-math lets the compiler assume no NaN or Inf; the kernels test for them
# on the bits instead (pfc_kernels.cc, not_finite), which it cannot optimise away.
FLAGS = ["-std=c++17", "-O3", "-ffast-math", "-march=native", "-fopenmp", "-fPIC",
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
            log.warning("fused Partial FC kernels not loaded: Horovod was initialised first "
                        "(call mxnet_pfc.runtime.comm.init() instead of hvd.init()); using MXNet ops")
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


def head_ops(ctx: mx.Context, fused: "bool | None" = None):
    """FusedOps on CPU when they load (or when fused=True), else MXNetOps."""
    if fused is None:
        fused = ctx.device_type == "cpu" and load_fused()
    elif fused and not (ctx.device_type == "cpu" and load_fused()):
        raise RuntimeError("fused kernels requested but unavailable for " + str(ctx))
    return FusedOps() if fused else MXNetOps()


def logaddexp(a: nd.NDArray, b: nd.NDArray) -> nd.NDArray:
    """log(exp(a) + exp(b)) without overflow; either may be -inf (not both)."""
    top = nd.maximum(a, b)
    return top + nd.log(nd.exp(a - top) + nd.exp(b - top))


def take_rows(weight: nd.NDArray, index: nd.NDArray) -> nd.NDArray:
    """weight[index]; the array itself (no copy) when index, sorted and unique, holds every row."""
    return weight if index.shape[0] == weight.shape[0] else nd.take(weight, index)


def set_rows(table: nd.NDArray, index: nd.NDArray, values: nd.NDArray) -> None:
    """table[index] = values in place, along the first axis (for repeated indices one value wins)."""
    nd._internal._scatter_set_nd(lhs=table, rhs=values, indices=index.reshape((1, -1)), shape=table.shape,
                                 out=table)


def center_gradients(grad: nd.NDArray, xh: nd.NDArray, weight: nd.NDArray, index: nd.NDArray):
    """(rows, grad . rows, grad^T . xh) for the centers `index` of weight, as MXNet products: the
    embeddings' gradient and the centers' gradient without its radial term (docs/DESIGN.md section 2.5)."""
    rows = take_rows(weight, index)
    return rows, nd.dot(grad, rows), nd.dot(grad, xh, transpose_a=True)


def _filtered(logits: nd.NDArray, threshold: float) -> nd.NDArray:
    """1 where inter-class filtering applies: above the threshold and finite (NaN compares
    false; +Inf is kept so that the loss check sees it, as in the fused kernels)."""
    return (logits > threshold) * (logits < np.inf)


def _filter_attrs(threshold: "float | None") -> dict:
    """The kernels' inter-class filter attribute: absent when filtering is off."""
    return {} if threshold is None else {"threshold": repr(float(threshold))}


class FusedOps:
    """The C++ kernels of pfc_kernels.cc (CPU)."""

    name = "fused"

    def inv_norm(self, weight):
        return nd.pfc_inv_norm(weight)

    def scale_lse(self, logits, col_scale, target, mask, margin, threshold=None):
        s, m1, m2, m3 = margin.as_tuple()
        lse, f_t, df_t = nd.pfc_scale_lse(logits, col_scale, target, mask, s=repr(s), m1=repr(m1), m2=repr(m2),
                                          m3=repr(m3), **_filter_attrs(threshold))
        return logits, lse, f_t, df_t

    def softmax_grad(self, logits, lse, inv_norm, target, mask, target_grad, s, n, threshold=None):
        b = nd.pfc_softmax_grad(logits, lse, inv_norm, target, mask, target_grad, s=s, inv_n=1.0 / n,
                                **_filter_attrs(threshold))
        return logits, b

    def sgd_rows(self, weight, mom, grad, coef, rows, index, lr, momentum, wd):
        nd.pfc_sgd_rows(weight, mom, grad, coef, index, lr=lr, momentum=momentum, wd=wd)

    def logits(self, xh, weight, index, out):
        inv = nd.empty((index.shape[0],), ctx=weight.context)
        nd.pfc_logits(xh, weight, index, out=[out, inv])
        return out, inv

    def center_step(self, grad, xh, coef, index, weight, mom, lr, momentum, wd):
        return nd.pfc_center_step(grad, xh, coef, index, weight, mom, lr=lr, momentum=momentum, wd=wd)


class MXNetOps:
    """The same steps composed of MXNet operators (any context)."""

    name = "mxnet"

    def __init__(self):
        self._ones = {}

    def _ones_col(self, n, ctx):
        if (n, ctx) not in self._ones:
            self._ones[(n, ctx)] = nd.ones((n, 1), ctx=ctx)
        return self._ones[(n, ctx)]

    def inv_norm(self, weight):
        # A gemv with ones is far faster than nd.norm's reduction on CPU.
        squares = nd.dot(nd.square(weight), self._ones_col(weight.shape[1], weight.context))
        return 1.0 / nd.sqrt(squares.reshape((-1,)))

    @staticmethod
    def _set_targets(matrix, target, mask, values):
        rows = nd.arange(matrix.shape[0], ctx=matrix.context, dtype="int32")
        values = nd.where(mask, values, nd.pick(matrix, target, axis=1))
        nd._internal._scatter_set_nd(lhs=matrix, rhs=values, indices=nd.stack(rows, target),
                                     shape=matrix.shape, out=matrix)

    def scale_lse(self, logits, col_scale, target, mask, margin, threshold=None):
        logits = nd.broadcast_mul(logits, col_scale.reshape((1, -1)), out=logits)
        others = logits.copy()
        if threshold is not None:       # filtered cells enter the sum as logit 0
            others = nd.where(_filtered(others, threshold), nd.zeros_like(others), others)
        # The target cells leave the sum as -1e30, not -inf: a row whose only column is its
        # target (one sampled center) then gets log-sum-exp -1e30, as in the fused kernel,
        # where -inf would make its max shift inf - inf = NaN.
        self._set_targets(others, target, mask, nd.full(mask.shape, -1e30, ctx=mask.context))
        top = nd.max(others, axis=1)
        lse_others = top + nd.log(nd.sum(nd.exp(nd.broadcast_sub(others, top.reshape((-1, 1)))), axis=1))
        f_t, df_t = margin.target_logit(nd.pick(logits, target, axis=1) / margin.s)
        zeros = nd.zeros_like(f_t)
        f_t, df_t = nd.where(mask, f_t, zeros), nd.where(mask, df_t, zeros)    # rows of other ranks: 0, unused
        # The target enters the sum as its margined logit; it is never subtracted
        # from a sum that holds the unmargined one (that loses the other terms).
        lse = nd.where(mask, logaddexp(lse_others, f_t), lse_others)
        return logits, lse, f_t, df_t

    def softmax_grad(self, logits, lse, inv_norm, target, mask, target_grad, s, n, threshold=None):
        grad = nd.exp(nd.broadcast_sub(logits, lse.reshape((-1, 1))))
        grad = nd.broadcast_mul(grad, (s / n * inv_norm).reshape((1, -1)), out=grad)
        if threshold is not None:       # a filtered cell was a constant 0: no gradient (targets set below)
            grad = nd.where(_filtered(logits, threshold), nd.zeros_like(grad), grad)
        self._set_targets(grad, target, mask, target_grad)
        ones = self._ones_col(logits.shape[0], logits.context)
        b = nd.dot(grad * logits, ones, transpose_a=True).reshape((-1,)) / s
        return grad, b

    def logits(self, xh, weight, index, out):
        rows = take_rows(weight, index)
        return nd.dot(xh, rows, transpose_b=True, out=out), self.inv_norm(rows)

    def center_step(self, grad, xh, coef, index, weight, mom, lr, momentum, wd):
        rows, grad_xh, center_grad = center_gradients(grad, xh, weight, index)
        self.sgd_rows(weight, mom, center_grad, coef, rows, index, lr, momentum, wd)
        return grad_xh

    def sgd_rows(self, weight, mom, grad, coef, rows, index, lr, momentum, wd):
        grad -= nd.broadcast_mul(rows, coef.reshape((-1, 1)))
        if index.shape[0] == weight.shape[0]:     # sorted, unique, every row: a dense update
            nd.sgd_mom_update(weight, grad, mom, lr=lr, momentum=momentum, wd=wd, out=weight)
        else:
            sparse = nd.sparse.row_sparse_array((grad, index.astype("int64")), shape=weight.shape,
                                                ctx=weight.context)
            nd.sgd_mom_update(weight, sparse, mom, lr=lr, momentum=momentum, wd=wd,
                              lazy_update=True, out=weight)
