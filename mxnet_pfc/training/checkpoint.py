"""Writing a checkpoint's arrays (every rank together, atomically) and reading back the optimizer state.

The layout, the order and state.json are runtime/checkpoints.py's; this module
adds what needs MXNet and the running job: the backbone, its rank averages and
its SGD state, each rank's BatchNorm statistics and memory bank, written into
the folder's .tmp twin and published by rank 0 once every rank's files are
there. The format-1 optimizer.states (a pickle) is read by an unpickler that
builds arrays and nothing else. The contract (what a complete folder holds,
what a failure leaves): docs/DESIGN.md section 5.1.
"""
from __future__ import annotations

import errno
import logging
import os
import pickle
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass

import mxnet as mx

from mxnet_pfc.head.memory_bank import MemoryBank, shard_files
from mxnet_pfc.runtime import array_file, checkpoints, comm
from mxnet_pfc.runtime.errors import CheckpointError, mxnet_reason, quoted
from mxnet_pfc.runtime.mxnet_files import load_arrays
from mxnet_pfc.training.module import named_states

log = logging.getLogger(__name__)

__all__ = ["BackboneSnapshot", "take_snapshot", "save", "load_optimizer_state"]


def _fsync(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _average(params: "dict[str, mx.nd.NDArray]", prefix: str) -> "dict[str, mx.nd.NDArray]":
    """Each array averaged over ranks (collective: every rank, same names in the same order)."""
    return {name: comm.allreduce(value.astype("float32"), op="average", name=f"{prefix}.{name}")
            for name, value in sorted(params.items())}


@dataclass(frozen=True)
class BackboneSnapshot:
    """This rank's backbone parameters and their averages over ranks, taken at one step."""
    arg_params: dict
    aux_params: dict
    average_arg: dict
    average_aux: dict


def take_snapshot(module) -> BackboneSnapshot:
    """The backbone of this step on the CPU, with its rank averages (collective: every rank calls it)."""
    arg_params, aux_params = module.get_params()
    return BackboneSnapshot(arg_params, aux_params, _average(arg_params, "ckpt.arg"), _average(aux_params, "ckpt.aux"))


def save(root: str, step: int, *, module, banks: "list[MemoryBank]", symbol: mx.sym.Symbol,
         state: checkpoints.RunState, keep: int, backbone: "BackboneSnapshot | None" = None,
         extra_margin_states: "list[dict] | None" = None) -> str:
    """Write the checkpoint of `step` (all ranks call this together); returns its folder.

    `state` holds the run's own fields; the checkpoint's (step, world size,
    shards, format ...) are added here, and state.json is written once, last.
    `banks` are the memory banks of the run's sets, set 0 first (one for a run
    of one set); set S >= 1's go into the folder's set-S/ with its margin's
    statistics (`extra_margin_states`) in state.json's extra_heads.
    `backbone` is the snapshot to save (taken here if not given).
    Any rank's failure raises on every rank, and the checkpoint is then not
    published: its partial folder is removed.
    """
    rank, world = comm.rank(), comm.size()
    with comm.fail_together(f"preparing the checkpoint of step {step} in {root}"):
        sequence = 0
        if rank == 0:
            os.makedirs(root, exist_ok=True)
            for stale in os.listdir(root):        # crashed saves
                if stale.endswith(".tmp"):
                    shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
            sequence = 1 + max((c.sequence for c in checkpoints.list_checkpoints(root)), default=0)
    sequence = int(comm.gather_rows([sequence])[0][0])        # rank 0's, on every rank
    final = os.path.join(root, checkpoints.folder_name(sequence, step))
    tmp = final + ".tmp"
    with comm.fail_together(f"preparing checkpoint {tmp}"):
        if rank == 0:
            os.makedirs(tmp)
            for number in range(1, len(banks)):
                os.makedirs(checkpoints.head_folder(tmp, number))
    started = time.time()
    backbone = backbone or take_snapshot(module)
    shards = [[[int(a), int(b)] for a, b in comm.gather_rows([bank.class_start, bank.num_local])] for bank in banks]
    explain = lambda error: _explain_write_error(error, root, final, rank, banks, backbone)  # noqa: E731
    with _discarded_on_failure(f"writing checkpoint {tmp}", tmp, rank, explain):
        if not os.path.isdir(tmp):
            raise CheckpointError(f"rank {rank} cannot see {tmp}, which rank 0 created: the output folder must be "
                                  "on a filesystem that every rank shares")
        written = [path for number, bank in enumerate(banks)
                   for path in bank.save(checkpoints.head_folder(tmp, number))]
        aux = checkpoints.aux_file(tmp, rank)
        mx.nd.save(aux, backbone.aux_params)
        written.append(aux)
        if rank == 0:
            for prefix, arg, aux in ((checkpoints.MODEL, backbone.arg_params, backbone.aux_params),
                                     (checkpoints.AVERAGE_MODEL, backbone.average_arg, backbone.average_aux)):
                mx.model.save_checkpoint(os.path.join(tmp, prefix), 0, symbol, arg, aux)
                written.append(os.path.join(tmp, f"{prefix}-0000.params"))
            mx.nd.save(os.path.join(tmp, checkpoints.OPTIMIZER_FILE), module.optimizer_state())
            written.append(os.path.join(tmp, checkpoints.OPTIMIZER_FILE))
        for path in written:
            _fsync(path)
    with _discarded_on_failure(f"publishing checkpoint {final}", tmp, rank, explain):
        if rank == 0:
            missing = [os.path.relpath(path, tmp) for number in range(len(banks)) for r in range(world)
                       for path in shard_files(checkpoints.head_folder(tmp, number), r).values()
                       if not os.path.exists(path)]
            if missing:
                raise CheckpointError(f"rank 0 cannot see {', '.join(missing[:4])} in {tmp}: the output folder "
                                      "must be on a filesystem that every rank shares")
            margins = extra_margin_states or [{} for _ in banks[1:]]
            extra_heads = [{"num_classes": bank.num_classes, "shards": shards[number], "margin_state": margin}
                           for number, (bank, margin) in enumerate(zip(banks[1:], margins), start=1)]
            first = banks[0]
            checkpoints.State.of(state, sequence=sequence, step=step, world_size=world, num_classes=first.num_classes,
                                 embedding_size=first.embedding_size, subcenters=first.subcenters, shards=shards[0],
                                 saved_at=time.strftime("%Y-%m-%d %H:%M:%S"), extra_heads=extra_heads).write(tmp)
            os.replace(tmp, final)
            for old in checkpoints.list_checkpoints(root)[:-keep] if keep > 0 else []:     # never the one just written
                shutil.rmtree(old.path, ignore_errors=True)
    log.info(f"checkpoint {final} written in {time.time() - started:.1f} s "
             f"({state.samples_seen:,} samples seen, step {step} on {world} rank(s))")
    return final


@contextmanager
def _discarded_on_failure(what: str, tmp: str, rank: int, explain):
    """comm.fail_together for a step of writing; a failure is first explained (a full disk), and
    on any rank's failure rank 0 removes the partial folder (never loaded; removing it gives back
    the space it took)."""
    try:
        with comm.fail_together(what):
            try:
                yield
            except (OSError, CheckpointError, mx.base.MXNetError) as error:
                raise explain(error) from None
    except BaseException:
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _explain_write_error(error: BaseException, root: str, final: str, rank: int, banks: "list[MemoryBank]",
                         backbone: BackboneSnapshot) -> BaseException:
    """A failed write, said plainly: on a full disk, how much was needed and free, and what is still safe."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    per_rank = sum(bank.nbytes for bank in banks) + sum(v.size * 4 for v in backbone.aux_params.values())
    params = sum(v.size * 4 for v in list(backbone.arg_params.values()) + list(backbone.aux_params.values()))
    needed = per_rank + (3 * params if rank == 0 else 0)       # model, model-average, optimizer states
    # MXNet's own writers (the .params files) say only "FileStream.Write incomplete" on a full disk
    full = (getattr(error, "errno", None) == errno.ENOSPC or "space" in str(error).lower()
            or (isinstance(error, mx.base.MXNetError) and "Write incomplete" in str(error)
                and free is not None and free < needed))
    if not full:
        return error
    newest = checkpoints.latest(root)
    previous = (f"the previous checkpoint {newest.describe()} is intact" if newest
                else "there is no earlier checkpoint")
    free_text = f"{free / 1e6:.1f} MB free" if free is not None else "free space unknown"
    return CheckpointError(
        f"checkpoint {final} not written: the disk is full ({free_text} on the file system of {root}; this rank "
        f"writes about {needed / 1e6:.1f} MB per checkpoint; {mxnet_reason(error)}). Nothing of it is kept, "
        f"and {previous}: free space (or lower --keep_checkpoints), then continue with --resume latest")


class _LegacyArray:
    """Stands in for mxnet.ndarray.NDArray while a format-1 optimizer.states is unpickled: it takes
    only what an NDArray's pickle holds (no handle, then {'handle': bytes}) and keeps the bytes."""
    raw = None          # until __setstate__: an NDArray pickled without its bytes is refused, never built

    def __init__(self, handle=None):
        if handle is not None:
            raise pickle.UnpicklingError("an NDArray built from a handle")
        self.raw = None

    def __setstate__(self, state):
        if not (isinstance(state, dict) and set(state) == {"handle"}
                and isinstance(state["handle"], (bytes, bytearray))):
            raise pickle.UnpicklingError("an NDArray state that is not its bytes")
        self.raw = bytearray(state["handle"])       # MXNet reads it through a writable ctypes buffer

    def to_ndarray(self) -> mx.nd.NDArray:
        if not isinstance(self.raw, bytearray):
            raise pickle.UnpicklingError("an NDArray without its bytes")
        problem = array_file.array_problem(bytes(self.raw))     # MXNet would believe its shape, as in a file
        if problem is not None:
            raise pickle.UnpicklingError(problem)
        array = mx.nd.NDArray(handle=None)
        array.__setstate__({"handle": self.raw})         # MXNet's own decoder of an array's bytes
        return array


def _bytearray_of(data=b"", encoding=None) -> bytearray:
    """builtins.bytearray as a pickle may call it to rebuild bytes it holds (bytes; or text and 'latin-1'
    in protocols 0-2), never bytearray(N), which allocates N bytes the file does not hold."""
    if isinstance(data, bytes) and encoding is None:
        return bytearray(data)
    if isinstance(data, str) and encoding in ("latin-1", "latin1"):
        return bytearray(data, encoding)
    raise pickle.UnpicklingError(f"bytearray({type(data).__name__}) is not bytes the file holds")


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """What MXNet 1.9's Updater.get_states pickles (a dict of index: NDArray, None or a tuple of them),
    and nothing else: any other global a pickle names (os.system, builtins.eval ...) is refused."""
    ALLOWED = {("mxnet.ndarray.ndarray", "NDArray"): _LegacyArray, ("builtins", "bytearray"): _bytearray_of}

    def find_class(self, module, name):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}: an optimizer state holds only "
                                         "arrays") from None


def _legacy_optimizer_arrays(file: str, param_names: "list[str]") -> "dict[str, mx.nd.NDArray]":
    """A format-1 optimizer.states as optimizer_state()'s named arrays, read without running its code."""
    with open(file, "rb") as f:
        try:
            states = _ArraysOnlyUnpickler(f).load()
        except (pickle.UnpicklingError, OSError):
            raise
        except Exception as error:       # whatever else a crafted or damaged pickle makes the unpickler raise
            raise pickle.UnpicklingError(f"not a pickle of arrays ({type(error).__name__}: {error})") from None
    if isinstance(states, tuple) and len(states) == 2:         # (states, optimizer) of get_states(True)
        raise pickle.UnpicklingError("it holds an optimizer object, not only its states")
    if not isinstance(states, dict):
        raise pickle.UnpicklingError(f"a {type(states).__name__}, not a dict of states")
    built = {}
    for index, state in states.items():
        if not (isinstance(index, int) and 0 <= index < len(param_names)):
            raise pickle.UnpicklingError(f"state index {quoted(index)} is not a parameter's")
        parts = state if isinstance(state, tuple) else (state,)
        for part in parts:
            if part is not None and not isinstance(part, _LegacyArray):
                raise pickle.UnpicklingError(f"state of {param_names[index]!r} is a {type(part).__name__}")
        arrays = tuple(None if part is None else part.to_ndarray() for part in parts)
        built[index] = arrays if isinstance(state, tuple) else arrays[0]
    return named_states(built, param_names)


def load_optimizer_state(path: str, module, leave_out: "tuple[str, ...]" = ()) -> None:
    """The backbone's SGD state from checkpoint `path` into `module`: optimizer-states.params, or a format-1
    checkpoint's pickled optimizer.states through a loader that builds arrays and nothing else. The states
    of the parameters in `leave_out` are not taken (they start afresh)."""
    file = os.path.join(path, checkpoints.OPTIMIZER_FILE)
    try:
        if os.path.exists(file):
            arrays = load_arrays(file, CheckpointError)
            if isinstance(arrays, list) and not arrays:     # saved before the backbone's first update (a freeze)
                arrays = {}
            if not isinstance(arrays, dict):
                raise ValueError("its arrays have no names")
        else:
            file = os.path.join(path, checkpoints.LEGACY_OPTIMIZER_FILE)
            arrays = _legacy_optimizer_arrays(file, module.module._exec_group.param_names)
        module.load_optimizer_state({key: value for key, value in arrays.items()
                                     if key.partition("#")[0] not in leave_out}, file)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no optimizer state ({checkpoints.OPTIMIZER_FILE}, or "
                              f"{checkpoints.LEGACY_OPTIMIZER_FILE} of format 1)") from None
    except CheckpointError:         # load_arrays's, which names the file already
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, mx.base.MXNetError, OSError) as error:
        raise CheckpointError(f"{file}: refused: {mxnet_reason(error)}") from None
