"""Training checkpoints: everything needed to continue a run exactly, written atomically.

One folder per checkpoint, OUTPUT/checkpoints/ckpt-000007-step-00001000/ (the
7th checkpoint written in this folder, at step 1000 of the run that wrote it):

    model-symbol.json, model-0000.params     rank 0's backbone (arg:/aux: keys, MXNet's format)
    model-average-symbol.json, -0000.params  the same with parameters averaged over ranks
                                             (BatchNorm statistics are per rank)
    optimizer-states.params                  the backbone's SGD state (momentum), rank 0's, as
                                             named arrays in MXNet's format; every rank holds the same
    aux-rank00001.params                     each rank's own BatchNorm statistics
    centers-rank00001.npy, momentum-rank00001.npy
                                             each rank's class centers and their momentum,
                                             rows [class_start, class_start + num_local)
    state.json                               sequence, step, samples seen, shards, schedule,
                                             configuration (State and save); written last

Checkpoints are ordered by the sequence number (the order they were written),
never by step: a larger global batch (an elastic grow, a larger --batch_size
on resume) renumbers steps downwards, so step labels neither order nor name
checkpoints uniquely. Format-1 folders (step-NNNNNNNN, a pickled
optimizer.states) still load; their pickle is read by a loader that builds
arrays and refuses anything else, since unpickling can run code.

Every rank writes into the folder's .tmp twin; when all files are there rank 0
writes state.json and renames the folder. A folder without .tmp in its name
is therefore complete; a crash while saving leaves only a .tmp folder, which
loading ignores and the next save removes.

The folder must be on a filesystem every rank can read (as for the data):
resuming onto a different number of ranks reads other ranks' shards. The
centers and momentum files are the memory bank's (memory_bank.py writes and
reads them, re-sharding on load); docs/DESIGN.md section 5 has the whole layout.
"""
from __future__ import annotations

import errno
import logging
import os
import pickle
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import mxnet as mx

import symbols
from mxnet_pfc.head.memory_bank import MemoryBank, shard_files
from mxnet_pfc.runtime import array_file, comm
from mxnet_pfc.runtime.errors import CheckpointError, mxnet_reason, quoted
from mxnet_pfc.runtime.files import read_json, write_json
from mxnet_pfc.runtime.mxnet_files import load_arrays, load_checkpoint
from mxnet_pfc.training.module import named_states

log = logging.getLogger(__name__)

# 3: state.json without the fields nobody read (network and seed are the configuration's); 2: optimizer-states.params
# (arrays only); 1: MXNet's pickled optimizer.states
FORMAT_VERSION = 3
READABLE_FORMATS = (1, 2, 3)
STATE_FILE = "state.json"
STATE_BYTES = 64 << 20      # a state.json holds a shard per rank: a few KB at 10,000 ranks
OPTIMIZER_FILE = "optimizer-states.params"          # MXNet's array format: no code can be in it
LEGACY_OPTIMIZER_FILE = "optimizer.states"          # format 1: a pickle, read only through _ArraysOnlyUnpickler
_FOLDER = re.compile(r"^ckpt-(\d{6,})-step-(\d{8,})$")
_LEGACY_FOLDER = re.compile(r"^step-(\d{8})$")     # format 1 named folders by step alone


__all__ = ["BackboneSnapshot", "Saved", "State", "take_snapshot", "save", "locate", "read_state",
           "is_checkpoint", "list_checkpoints", "latest", "check_compatible", "check_params", "load_backbone",
           "resume_position"]


def is_checkpoint(folder: str) -> bool:
    """Whether `folder` is a complete checkpoint: state.json is written last, into the folder before it is
    published."""
    return os.path.isfile(os.path.join(folder, STATE_FILE))


def aux_file(folder: str, rank: int) -> str:
    """Rank `rank`'s own BatchNorm statistics in a checkpoint folder."""
    return os.path.join(folder, f"aux-rank{rank:05d}.params")


def folder_name(sequence: int, step: int) -> str:
    """A checkpoint's folder: its place in the output folder's history, then its step label.

    Step labels are not unique over a run's history (a larger global batch after
    an elastic grow or a changed --batch_size renumbers steps downwards); the
    sequence number is, and it orders checkpoints by when they were written.
    """
    return f"ckpt-{sequence:06d}-step-{step:08d}"


@dataclass(frozen=True)
class Saved:
    """A complete checkpoint under OUTPUT/checkpoints, and what it holds."""
    path: str
    sequence: int               # 1, 2, ... in the order written (0 for format-1 folders)
    step: int                   # the step label of the run that wrote it
    samples_seen: "int | None"  # samples trained over the run's whole history (None: state.json unreadable)
    world_size: "int | None"

    def describe(self) -> str:
        held = (f"{self.samples_seen:,} samples seen, step {self.step} on {self.world_size} rank(s)"
                if self.samples_seen is not None else f"step {self.step}, state.json unreadable")
        return f"{os.path.basename(self.path)} ({held})"


def samples_seen(state: dict) -> int:
    """The samples a checkpoint's run history had trained (format-1 checkpoints before samples_seen
    existed: its steps at its global batch)."""
    return state.get("samples_seen", state["step"] * state["global_batch"])


def _saved(root: str, name: str) -> "Saved | None":
    """The checkpoint in folder `name` of root, or None if it is not a complete one."""
    match, legacy = _FOLDER.match(name), _LEGACY_FOLDER.match(name)
    path = os.path.join(root, name)
    if not (match or legacy) or not is_checkpoint(path):
        return None
    sequence, step = (int(match.group(1)), int(match.group(2))) if match else (0, int(legacy.group(1)))
    try:
        state = read_json(os.path.join(path, STATE_FILE), STATE_BYTES)
        samples, world = samples_seen(state), state["world_size"]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (samples, world)):
            raise TypeError
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        samples, world = None, None
    return Saved(path, sequence, step, samples, world)


def list_checkpoints(root: str) -> "list[Saved]":
    """The complete checkpoints under root, oldest first: by the order they were written.

    Format-1 folders (step-NNNNNNNN, no sequence) come before every newer one, in
    the order of the samples they hold. Never by step label alone.
    """
    if not os.path.isdir(root):
        return []
    found = [saved for saved in (_saved(root, name) for name in os.listdir(root)) if saved is not None]
    return sorted(found, key=lambda c: (c.sequence, c.samples_seen if c.samples_seen is not None else -1, c.step))


def latest(root: str) -> "Saved | None":
    """The checkpoint written last under root, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def locate(root: str, which: str) -> str:
    """The checkpoint folder for --resume: 'latest', a step label, a folder name under root, or a folder path."""
    found = list_checkpoints(root)
    if which == "latest":
        if not found:
            raise CheckpointError(f"--resume latest: no complete checkpoint in {root}")
        return found[-1].path
    if which.isdigit():
        same = [c for c in found if c.step == int(which)]
        if len(same) == 1:
            return same[0].path
        if not same:
            raise CheckpointError(f"--resume {which}: no complete checkpoint at step {int(which)} in {root} "
                                  f"(complete: {', '.join(c.describe() for c in found) or 'none'})")
        raise CheckpointError(f"--resume {which}: {len(same)} checkpoints in {root} are labelled step {int(which)} "
                              f"(the step size changed between them): {'; '.join(c.describe() for c in same)}. "
                              f"Name one: --resume {same[-1].path}")
    for candidate in (which, os.path.join(root, which)):
        if is_checkpoint(candidate):
            return candidate
    raise CheckpointError(f"--resume {which}: not a complete checkpoint folder (no state.json)")


@dataclass(frozen=True)
class State:
    """The run's part of a checkpoint's state.json, which the trainer gives to `save`: where the run stands
    in its data and schedule, and how it was configured. `save` adds the checkpoint's own fields (format,
    sequence, step, world_size, num_classes, embedding_size, subcenters, shards, saved_at) and writes the file once,
    last; `read_state` reads and checks it. docs/DESIGN.md section 5.1 lists every field and its readers."""
    steps_per_epoch: int
    global_batch: int
    max_update: int            # the plan's length in steps of this global batch
    samples_seen: int          # over the run's whole history (resumes on other world sizes included)
    num_images: int
    best: dict                 # the best verification figures so far
    config: dict               # Config.to_dict(): network, seed, loss, the max_update asked for ...
    # the margin's running statistics after this step (Margin.state(); {}: a margin without any)
    margin_state: dict = field(default_factory=dict)
    # the backbone trains from this many samples seen on (--freeze_backbone_steps at the first run's global batch)
    freeze_until_samples: int = 0


_STATE_FIELDS = {        # field: (type, smallest value) of what a resume reads from state.json
    "step": (int, 0), "world_size": (int, 1), "num_classes": (int, 1), "embedding_size": (int, 1),
    "global_batch": (int, 1), "steps_per_epoch": (int, 1), "max_update": (int, 1), "shards": (list, None),
    "config": (dict, None), "config.network": (str, None),
}


def _field(state: dict, name: str):
    """The value of field `name` ('config.network': a field of a field), None when missing."""
    value = state
    for key in name.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def read_state(path: str) -> dict:
    """state.json of the checkpoint in `path`, its fields checked: a message names a missing or wrong one.

    Checkpoints of formats 1 and 2 hold fields nobody reads (network and seed beside the configuration's,
    epoch, next_lr, data): they are left alone.
    """
    file = os.path.join(path, STATE_FILE)
    try:
        state = read_json(file, STATE_BYTES)         # a regular file of bounded size and nesting
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: cannot read state.json: {error}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{file}: not a JSON object")
    if state.get("format") not in READABLE_FORMATS:
        raise CheckpointError(f"{path}: checkpoint format {quoted(state.get('format'))}, this version reads "
                              f"{', '.join(map(str, READABLE_FORMATS))}")
    fields = dict(_STATE_FIELDS, **({"samples_seen": (int, 0)} if "samples_seen" in state else {}))
    for name, (kind, least) in fields.items():
        value = _field(state, name)
        if not isinstance(value, kind) or isinstance(value, bool) or (least is not None and value < least):
            wanted = kind.__name__ + (f" >= {least}" if least is not None else "")
            raise CheckpointError(f"{file}: field {name!r} is {quoted(value)} (missing or damaged; expected {wanted})")
    shards = state["shards"]
    if (len(shards) != state["world_size"]
            or not all(isinstance(s, list) and len(s) == 2 and all(type(v) is int and v >= 0 for v in s)
                       for s in shards)
            or not tiles(shards, state["num_classes"])):
        raise CheckpointError(f"{file}: field 'shards' does not split {state['num_classes']} classes over "
                              f"{state['world_size']} ranks (rank r's [first class, count], contiguous from 0, "
                              f"none empty): {quoted(shards)}")
    return state


def tiles(shards: "list[list[int]]", num_classes: int) -> bool:
    """Whether shards[r] = [class_start, num_local] of rank r cover classes 0 .. num_classes - 1 once each, in
    rank order and none empty, as shard_range gives them: a resume fills each rank's rows from them, and a
    gap or an overlap would leave rows unset."""
    start = 0
    for class_start, count in shards:
        if class_start != start or count < 1:
            return False
        start += count
    return start == num_classes


def check_compatible(state: dict, path: str, num_classes: int, embedding_size: int, network: str,
                     subcenters: int = 1) -> None:
    """The checkpoint's head and backbone must be the configured ones; the message says which differs.

    A network given as a symbol file is known by its graph, not its name: check_params compares the
    parameters' names and shapes."""
    problems = head_mismatches(state, num_classes, embedding_size, subcenters)
    saved_network = state["config"]["network"]
    if saved_network != network and not (symbols.is_symbol_file(saved_network) or symbols.is_symbol_file(network)):
        problems.append(f"its network is {state['config']['network']}, the configuration's {network} (network)")
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit this run: " + "; ".join(problems))


def head_mismatches(state: dict, num_classes: int, embedding_size: int, subcenters: int = 1) -> "list[str]":
    """How a checkpoint's memory bank differs from this run's head (classes, width, sub-centers), one
    phrase each; [] when it fits."""
    problems = []
    saved_subcenters = state.get("subcenters", 1)       # written since sub-center ArcFace; 1 before
    if saved_subcenters != subcenters:
        problems.append(f"its memory bank has {quoted(saved_subcenters)} center(s) per class, this run {subcenters} "
                        "(--loss subcenter-arcface and subcenter_k)")
    if state["num_classes"] != num_classes:
        problems.append(f"it has {state['num_classes']} classes, the configuration {num_classes} (num_classes)")
    if state["embedding_size"] != embedding_size:
        problems.append(f"its embedding size is {state['embedding_size']}, the configuration's {embedding_size} "
                        "(embedding_size)")
    return problems


def check_params(params: dict, expected: dict, path: str, network: str) -> None:
    """Same parameter names and shapes as the configured network, or a message naming the first differences."""
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    shapes = [f"{name}: {tuple(params[name].shape)} in the checkpoint, {tuple(expected[name])} in {network}"
              for name in sorted(set(params) & set(expected)) if tuple(params[name].shape) != tuple(expected[name])]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if extra:
        problems.append(f"unexpected {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    if shapes:
        problems.append("shape mismatch " + "; ".join(shapes[:5]))
    if problems:
        raise CheckpointError(f"checkpoint {path}: backbone parameters do not fit network {network}: "
                              + "; ".join(problems))


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


def save(root: str, step: int, *, module, bank: MemoryBank, symbol: mx.sym.Symbol, state: State, keep: int,
         backbone: "BackboneSnapshot | None" = None) -> str:
    """Write the checkpoint of `step` (all ranks call this together); returns its folder.

    `state` holds the run's own fields; the checkpoint's (step, world size,
    shards, format ...) are added here, and state.json is written once, last.
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
            sequence = 1 + max((c.sequence for c in list_checkpoints(root)), default=0)
    sequence = int(comm.gather_rows([sequence])[0][0])        # rank 0's, on every rank
    final = os.path.join(root, folder_name(sequence, step))
    tmp = final + ".tmp"
    with comm.fail_together(f"preparing checkpoint {tmp}"):
        if rank == 0:
            os.makedirs(tmp)
    started = time.time()
    backbone = backbone or take_snapshot(module)
    shards = comm.gather_rows([bank.class_start, bank.num_local])
    explain = lambda error: _explain_write_error(error, root, final, rank, bank, backbone)  # noqa: E731
    with _discarded_on_failure(f"writing checkpoint {tmp}", tmp, rank, explain):
        if not os.path.isdir(tmp):
            raise CheckpointError(f"rank {rank} cannot see {tmp}, which rank 0 created: the output folder must be "
                                  "on a filesystem that every rank shares")
        written = bank.save(tmp)
        aux = aux_file(tmp, rank)
        mx.nd.save(aux, backbone.aux_params)
        written.append(aux)
        if rank == 0:
            mx.model.save_checkpoint(os.path.join(tmp, "model"), 0, symbol, backbone.arg_params, backbone.aux_params)
            mx.model.save_checkpoint(os.path.join(tmp, "model-average"), 0, symbol, backbone.average_arg,
                                     backbone.average_aux)
            mx.nd.save(os.path.join(tmp, OPTIMIZER_FILE), module.optimizer_state())
            written += [os.path.join(tmp, name) for name in ("model-0000.params", "model-average-0000.params",
                                                             OPTIMIZER_FILE)]
        for path in written:
            _fsync(path)
    with _discarded_on_failure(f"publishing checkpoint {final}", tmp, rank, explain):
        if rank == 0:
            missing = [os.path.basename(path) for r in range(world) for path in shard_files(tmp, r).values()
                       if not os.path.exists(path)]
            if missing:
                raise CheckpointError(f"rank 0 cannot see {', '.join(missing[:4])} in {tmp}: the output folder "
                                      "must be on a filesystem that every rank shares")
            write_json(os.path.join(tmp, STATE_FILE), {
                **asdict(state), "format": FORMAT_VERSION, "sequence": sequence, "step": step, "world_size": world,
                "num_classes": bank.num_classes, "embedding_size": bank.embedding_size, "subcenters": bank.subcenters,
                "shards": [[int(a), int(b)] for a, b in shards], "saved_at": time.strftime("%Y-%m-%d %H:%M:%S")})
            os.replace(tmp, final)
            for old in list_checkpoints(root)[:-keep] if keep > 0 else []:     # never the one just written
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


def _explain_write_error(error: BaseException, root: str, final: str, rank: int, bank: MemoryBank,
                         backbone: BackboneSnapshot) -> BaseException:
    """A failed write, said plainly: on a full disk, how much was needed and free, and what is still safe."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    per_rank = bank.nbytes + sum(v.size * 4 for v in backbone.aux_params.values())
    params = sum(v.size * 4 for v in list(backbone.arg_params.values()) + list(backbone.aux_params.values()))
    needed = per_rank + (3 * params if rank == 0 else 0)       # model, model-average, optimizer states
    # MXNet's own writers (the .params files) say only "FileStream.Write incomplete" on a full disk
    full = (getattr(error, "errno", None) == errno.ENOSPC or "space" in str(error).lower()
            or (isinstance(error, mx.base.MXNetError) and "Write incomplete" in str(error)
                and free is not None and free < needed))
    if not full:
        return error
    newest = latest(root)
    previous = (f"the previous checkpoint {newest.describe()} is intact" if newest
                else "there is no earlier checkpoint")
    free_text = f"{free / 1e6:.1f} MB free" if free is not None else "free space unknown"
    return CheckpointError(
        f"checkpoint {final} not written: the disk is full ({free_text} on the file system of {root}; this rank "
        f"writes about {needed / 1e6:.1f} MB per checkpoint; {mxnet_reason(error)}). Nothing of it is kept, "
        f"and {previous}: free space (or lower --keep_checkpoints), then continue with --resume latest")


def load_backbone(path: str, rank: int, same_world: bool, average: bool = False):
    """(arg_params, aux_params) for this rank: rank 0's weights with the rank's own BN statistics.

    On a different number of ranks (or with average=True) the averaged statistics are used.
    """
    try:
        _, arg_params, aux_params = load_checkpoint(
            os.path.join(path, "model-average" if average else "model"), 0, CheckpointError)
        own = aux_file(path, rank)
        if same_world and not average and os.path.exists(own):
            aux_params = load_arrays(own, CheckpointError)
        elif not average:
            _, _, aux_params = load_checkpoint(os.path.join(path, "model-average"), 0, CheckpointError)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read the backbone: {mxnet_reason(error)}") from None
    return arg_params, aux_params


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
    file = os.path.join(path, OPTIMIZER_FILE)
    try:
        if os.path.exists(file):
            arrays = load_arrays(file, CheckpointError)
            if isinstance(arrays, list) and not arrays:     # saved before the backbone's first update (a freeze)
                arrays = {}
            if not isinstance(arrays, dict):
                raise ValueError("its arrays have no names")
        else:
            file = os.path.join(path, LEGACY_OPTIMIZER_FILE)
            arrays = _legacy_optimizer_arrays(file, module.module._exec_group.param_names)
        module.load_optimizer_state({key: value for key, value in arrays.items()
                                     if key.partition("#")[0] not in leave_out}, file)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: no optimizer state ({OPTIMIZER_FILE}, or {LEGACY_OPTIMIZER_FILE} of "
                              "format 1)") from None
    except CheckpointError:         # load_arrays's, which names the file already
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, mx.base.MXNetError, OSError) as error:
        raise CheckpointError(f"{file}: refused: {mxnet_reason(error)}") from None


def resume_position(state: dict, steps_per_epoch: int, global_batch: int) -> "tuple[int, int]":
    """(step, epoch) to continue from: the saved step, or on another global batch the same samples seen.

    The epoch is kept; within it, the steps done are converted by global batch size.
    """
    if state["global_batch"] == global_batch and state["steps_per_epoch"] == steps_per_epoch:
        return state["step"], state["step"] // steps_per_epoch
    epoch = state["step"] // state["steps_per_epoch"]
    within = (state["step"] % state["steps_per_epoch"]) * state["global_batch"] // global_batch
    return epoch * steps_per_epoch + min(within, steps_per_epoch - 1), epoch
