"""Every collective call of mxnet-pfc goes through this module.

In a rank, Horovod is imported here and nowhere else. (The one other importer
is the elastic supervisor, runtime/supervisor.py: it runs outside the ranks and
without MXNet, and uses horovodrun's own test of which hosts are local.)
Without Horovod, or without a launcher, the process is a world of one and every
collective is the identity, so the single-process path is one branch per
function, in this file only.

Contract: every function below that communicates must be called by all ranks,
in the same order, with tensors of the same dtype (and, for allreduce and
broadcast, the same shape). Horovod matches collectives by call order.

See docs/DESIGN.md sections 2 (the head's three collectives) and 6 (failures).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Callable

import mxnet as mx
import numpy as np

from mxnet_pfc.runtime.errors import PfcError

# How long a fault may take to stop the job, when the launcher has not already
# (a process that dies closes its sockets, and horovodrun/mpirun end the job at
# once). Set before hvd.init(), which reads them; the environment overrides.
FAULT_BOUNDS = {
    # a peer that stops answering (host down, link cut, process frozen): a Gloo
    # operation fails after this (Horovod's default; horovodrun --gloo-timeout-seconds)
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "30",
    # Horovod's stall check (it acts under MPI only): a warning naming the ranks that
    # have not joined a collective after 60 s. A rank stuck outside collectives is
    # stopped by watchdog.py (--stall_timeout) under every launcher, so Horovod's
    # shutdown stays off: two timers would race to stop the same stall.
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "60",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0",
}

_hvd = None          # the horovod.mxnet module once initialised with size > 1
_initialised = False
_rank, _size, _local_rank = 0, 1, 0
# Loaders that init() runs before hvd.init(): MXNet loads a custom-op library safely only before Horovod
# starts its threads (MXLoadLib after hvd.init() crashes). The head's kernels put theirs here (kernels/build.py).
_before_horovod: "list[Callable[[], object]]" = []
# The collective this rank entered last, and when (time.monotonic()): for watchdog.py, which
# tells a rank waiting in a collective for a stuck peer from the stuck rank itself.
_entered = {"name": None, "at": 0.0}


def _enter(name: str) -> None:
    _entered["name"], _entered["at"] = name, time.monotonic()


def last_collective() -> "tuple[str | None, float]":
    """(name, time.monotonic() when entered) of the collective this rank entered last; (None, 0.0) before any."""
    return _entered["name"], _entered["at"]


def run_before_horovod(load: "Callable[[], object]") -> None:
    """Have init() call `load` before it starts Horovod (a custom-op library's loader: MXNet loads one safely
    only before Horovod's threads run). A loader registered after init() is never called by it."""
    _before_horovod.append(load)


def init() -> None:
    """Initialise Horovod if available, after the loaders of run_before_horovod; safe to call more than once.

    The head's kernels register their loader when the head is imported: import it (mxnet_pfc.PartialFC,
    mxnet_pfc.head) before calling this, or the head falls back to MXNet ops with a warning.
    """
    global _hvd, _initialised, _rank, _size, _local_rank
    if _initialised:
        return
    _initialised = True
    for load in _before_horovod:
        load()
    try:
        import horovod.mxnet as hvd
    except ImportError:
        return  # no Horovod: a world of one
    for name, value in FAULT_BOUNDS.items():
        os.environ.setdefault(name, value)
    hvd.init()
    _rank, _size = hvd.rank(), hvd.size()
    _local_rank = hvd.local_rank()
    if _size > 1:
        _hvd = hvd


def rank() -> int:
    init()
    return _rank


def size() -> int:
    init()
    return _size


def local_rank() -> int:
    init()
    return _local_rank


def is_distributed() -> bool:
    return size() > 1


def allgather(tensor: mx.nd.NDArray, name: str | None = None) -> mx.nd.NDArray:
    """Concatenation of every rank's tensor along axis 0, in rank order.

    First dimensions may differ between ranks; the others must match.
    """
    if _hvd is None:
        return tensor
    _enter(name or "allgather")
    return _hvd.allgather(tensor, name=name)


def allreduce(tensor: mx.nd.NDArray, op: str = "sum", name: str | None = None) -> mx.nd.NDArray:
    """Element-wise reduction over ranks, op in {'sum', 'max', 'min', 'average'}."""
    if _hvd is None:
        return tensor
    ops = {"sum": _hvd.Sum, "max": _hvd.Max, "min": _hvd.Min, "average": _hvd.Average}
    _enter(name or "allreduce")
    return _hvd.allreduce(tensor, op=ops[op], name=name)


def broadcast(tensor: mx.nd.NDArray, root_rank: int = 0, name: str | None = None) -> mx.nd.NDArray:
    """Rank root_rank's tensor, on every rank."""
    if _hvd is None:
        return tensor
    _enter(name or "broadcast")
    return _hvd.broadcast(tensor, root_rank=root_rank, name=name)


def barrier() -> None:
    """Returns once every rank has called it (a host sync point)."""
    if _hvd is not None:
        _enter("barrier")
        _hvd.allreduce(mx.nd.zeros((1,)), op=_hvd.Sum, name="barrier").wait_to_read()


def gather_rows(row: "list[float]") -> "list[list[float]]":
    """Each rank's small list of numbers (same length everywhere), for every rank.

    A host-side helper for agreeing on checks: one allreduce of a
    (world_size x len(row)) float64 table where each rank fills its own row.
    This is a host sync point (asnumpy).
    """
    import numpy as np

    table = np.zeros((size(), len(row)), dtype=np.float64)
    table[rank()] = row
    reduced = allreduce(mx.nd.array(table, ctx=mx.cpu(), dtype="float64"), op="sum")
    _enter("gather_rows")
    return reduced.asnumpy().tolist()


def broadcast_parameters(params: "dict[str, mx.nd.NDArray]", root_rank: int = 0) -> None:
    """Overwrite every rank's NDArrays in `params` with root_rank's, in place.

    One sum allreduce per dtype of every parameter flattened end to end: root_rank's values, zeros from the
    others, so each sum is root_rank's value exactly. Not Horovod's in-place broadcast_: pushed all at
    once (Horovod 0.28's broadcast_parameters) and then one at a time, each waited for, it still crashed
    rank 0 now and then inside the full test suite (a corrupted heap; an engine op with a garbage
    context), while allreduce runs thousands of times per run without a fault.
    """
    if _hvd is None:
        return
    groups: "dict[str, list[str]]" = {}
    for name in sorted(params):
        groups.setdefault(np.dtype(params[name].dtype).name, []).append(name)
    for dtype, names in groups.items():
        sizes = [params[name].size for name in names]
        if _rank == root_rank:
            flat = np.concatenate([params[name].asnumpy().ravel() for name in names])
        else:
            flat = np.zeros(sum(sizes), dtype)
        summed = allreduce(mx.nd.array(flat, ctx=mx.cpu(), dtype=dtype), op="sum",
                           name=f"parameters.{dtype}.{names[0]}").asnumpy()
        for name, start, size in zip(names, np.cumsum([0] + sizes[:-1]), sizes):
            params[name][:] = summed[start:start + size].reshape(params[name].shape)


def distributed_optimizer(optimizer: "mx.optimizer.Optimizer") -> "mx.optimizer.Optimizer":
    """`optimizer` with each gradient allreduced before its update (Horovod averages).

    For mx.mod.Module(..., kvstore=None): the module calls update() per parameter
    group and Horovod fuses the allreduces in the background.
    """
    if _hvd is None:
        return optimizer
    return _hvd.DistributedOptimizer(optimizer)


MESSAGE_BYTES = 1024      # of a failure's message that other ranks receive


def raise_if_any_failed(error: "BaseException | None", what: str) -> None:
    """Agree across ranks on whether `what` succeeded everywhere; raise on every rank if not.

    A rank that failed re-raises its own error; the others raise RankFailedError
    with the first failed rank's message, so that every rank's log says what
    went wrong and where. Without this, the healthy ranks would wait forever in
    the next collective.
    """
    import numpy as np

    text = f"{type(error).__name__}: {error}".encode()[:MESSAGE_BYTES] if error is not None else b""
    row = np.zeros(MESSAGE_BYTES + 1, dtype=np.int32)
    row[0] = 1 if error is not None else 0
    row[1:1 + len(text)] = np.frombuffer(text, dtype=np.uint8)
    mine = mx.nd.array(row[None], ctx=mx.cpu(), dtype="int32")
    _enter(f"agree: {what}")            # Horovod's allgather itself waits for every rank's row
    table = (mine if _hvd is None else _hvd.allgather(mine, name="agree")).asnumpy()
    failed = [r for r in range(len(table)) if table[r, 0]]
    if error is not None:
        raise error
    if failed:
        first = bytes(table[failed[0], 1:].astype(np.uint8)).rstrip(b"\0").decode(errors="replace")
        raise RankFailedError(f"{what} failed on rank(s) {', '.join(map(str, failed))}: "
                              f"rank {failed[0]}: {first}")


@contextmanager
def fail_together(what: str):
    """Run a block on every rank; if it failed on any rank, every rank raises when it ends.

    Wrap each piece of work that only some ranks may fail in (reading files,
    rank 0's writes) before the next collective:

        with comm.fail_together("setup"):
            data = open_the_data()

    The failing rank raises its own error, the others RankFailedError naming
    it (raise_if_any_failed). Only Exception is caught: a KeyboardInterrupt
    passes straight through.
    """
    error = None
    try:
        yield
    except Exception as caught:
        error = caught
    raise_if_any_failed(error, what)


class RankFailedError(PfcError, RuntimeError):
    """Another rank failed (its message is in this one); this rank stops with it."""


def horovod_gpu_build() -> "tuple[bool, int]":
    """(built with CUDA, NCCL version code or 0) of the installed Horovod: build flags only, no collective."""
    try:
        build = horovod_build()
    except ImportError:
        return False, 0
    return build["cuda"], build["nccl"]


def horovod_build() -> dict:
    """The installed Horovod's version and build flags (gloo, mpi, cuda: bools; nccl: its version code or 0),
    read without starting it. ImportError when horovod.mxnet cannot be imported: Horovod without MXNet."""
    import horovod
    import horovod.mxnet as hvd

    return dict(version=horovod.__version__, gloo=bool(hvd.gloo_built()), mpi=bool(hvd.mpi_built()),
                cuda=bool(hvd.cuda_built()), nccl=int(hvd.nccl_built()))


def shutdown() -> None:
    """Stop Horovod's background thread after the last collective, before the interpreter exits.

    Leaving it to the exit handlers races MXNet's own shutdown (seen as crashes at exit under mpirun).
    """
    if _hvd is not None:
        mx.nd.waitall()
        _hvd.shutdown()


# What Horovod's errors say when a peer is gone (its shutdown message, Gloo's transport errors).
_LOST_PEER_SIGNS = ("Horovod has been shut down", "Connection closed by peer", "Connection reset by peer",
                    "Timed out", "Broken pipe")


class LostRankError(PfcError, RuntimeError):
    """A collective failed because another rank is gone; this rank cannot go on."""


def lost_peer(error: BaseException) -> bool:
    """Whether `error` comes from a collective that failed because another rank is gone."""
    return _hvd is not None and any(sign in str(error) for sign in _LOST_PEER_SIGNS)


def raised_by_horovod(error: BaseException) -> bool:
    """Whether `error` is one of Horovod's own exceptions (HorovodInternalError ...): about the job, not a defect."""
    return type(error).__module__.split(".")[0] == "horovod"


def lost_peer_message() -> str:
    bounds = ", ".join(f"{name}={os.environ.get(name, '?')}" for name in FAULT_BOUNDS)
    return (f"lost contact with the other ranks: a collective failed because a rank died, froze or became "
            f"unreachable (the launcher's output names the first rank that exited; bounds: {bounds})")
