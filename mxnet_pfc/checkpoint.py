"""Training checkpoints: everything needed to continue a run exactly, written atomically.

One folder per checkpoint, OUTPUT/checkpoints/step-00001000/:

    model-symbol.json, model-0000.params     rank 0's backbone (arg:/aux: keys, MXNet's format)
    model-average-symbol.json, -0000.params  the same with parameters averaged over ranks
                                             (BatchNorm statistics are per rank)
    optimizer.states                         the backbone's SGD state (momentum), rank 0's;
                                             every rank holds the same one
    aux-rank00001.params                     each rank's own BatchNorm statistics
    centers-rank00001.npy, momentum-rank00001.npy
                                             each rank's class centers and their momentum,
                                             rows [class_start, class_start + num_local)
    state.json                               step, epoch, shards, schedule, configuration;
                                             written last

Every rank writes into step-00001000.tmp/; when all files are there rank 0
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
import json
import logging
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass

import mxnet as mx

from . import comm
from .errors import CheckpointError
from .files import write_json
from .memory_bank import MemoryBank, shard_files

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_STEP_DIR = re.compile(r"^step-(\d{8})$")


__all__ = ["CheckpointError", "BackboneSnapshot", "take_snapshot", "save", "locate", "read_state", "list_steps",
           "step_dir", "check_compatible", "check_params", "load_backbone", "resume_position"]


def aux_file(folder: str, rank: int) -> str:
    """Rank `rank`'s own BatchNorm statistics in a checkpoint folder."""
    return os.path.join(folder, f"aux-rank{rank:05d}.params")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"step-{step:08d}")


def list_steps(root: str) -> "list[int]":
    """Steps of the complete checkpoints under root, ascending."""
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        match = _STEP_DIR.match(name)
        if match and os.path.exists(os.path.join(root, name, "state.json")):
            steps.append(int(match.group(1)))
    return sorted(steps)


def locate(root: str, which: str) -> str:
    """The checkpoint folder for --resume: 'latest', a step number, or a folder path."""
    if which == "latest":
        steps = list_steps(root)
        if not steps:
            raise CheckpointError(f"--resume latest: no complete checkpoint in {root}")
        return step_dir(root, steps[-1])
    if which.isdigit():
        path = step_dir(root, int(which))
        if not os.path.exists(os.path.join(path, "state.json")):
            raise CheckpointError(f"--resume {which}: no complete checkpoint at step {int(which)} in {root} "
                                  f"(complete: {', '.join(map(str, list_steps(root))) or 'none'})")
        return path
    if not os.path.exists(os.path.join(which, "state.json")):
        raise CheckpointError(f"--resume {which}: not a complete checkpoint folder (no state.json)")
    return which


def read_state(path: str) -> dict:
    try:
        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: cannot read state.json: {error}") from None
    if state.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {state.get('format')}, this version reads {FORMAT_VERSION}")
    return state


def check_compatible(state: dict, path: str, num_classes: int, embedding_size: int, network: str) -> None:
    """The checkpoint's head and backbone must be the configured ones; the message says which differs."""
    problems = []
    if state["num_classes"] != num_classes:
        problems.append(f"it has {state['num_classes']} classes, the configuration {num_classes} (num_classes)")
    if state["embedding_size"] != embedding_size:
        problems.append(f"its embedding size is {state['embedding_size']}, the configuration's {embedding_size} "
                        "(embedding_size)")
    if state["network"] != network:
        problems.append(f"its network is {state['network']}, the configuration's {network} (network)")
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit this run: " + "; ".join(problems))


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


def save(root: str, step: int, *, module, bank: MemoryBank, symbol: mx.sym.Symbol, state: dict, keep: int,
         backbone: "BackboneSnapshot | None" = None) -> str:
    """Write the checkpoint of `step` (all ranks call this together); returns its folder.

    `state` holds the run's own fields (epoch, schedule, configuration ...);
    shards, world size and format are added here, and state.json is written
    once, last. `backbone` is the snapshot to save (taken here if not given).
    Any rank's failure raises on every rank, and the checkpoint is then not
    published: its partial folder is removed.
    """
    rank, world = comm.rank(), comm.size()
    final = step_dir(root, step)
    tmp = final + ".tmp"
    with comm.fail_together(f"preparing checkpoint {tmp}"):
        if rank == 0:
            os.makedirs(root, exist_ok=True)
            for stale in os.listdir(root):        # crashed saves, and a stale copy of this one
                if stale.endswith(".tmp") or stale == os.path.basename(final):
                    shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
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
            module.save_optimizer_states(os.path.join(tmp, "optimizer.states"))
            written += [os.path.join(tmp, name) for name in ("model-0000.params", "model-average-0000.params",
                                                             "optimizer.states")]
        for path in written:
            _fsync(path)
    with _discarded_on_failure(f"publishing checkpoint {final}", tmp, rank, explain):
        if rank == 0:
            missing = [os.path.basename(path) for r in range(world) for path in shard_files(tmp, r).values()
                       if not os.path.exists(path)]
            if missing:
                raise CheckpointError(f"rank 0 cannot see {', '.join(missing[:4])} in {tmp}: the output folder "
                                      "must be on a filesystem that every rank shares")
            write_json(os.path.join(tmp, "state.json"), {
                **state, "format": FORMAT_VERSION, "step": step, "world_size": world,
                "num_classes": bank.num_classes, "embedding_size": bank.embedding_size,
                "shards": [[int(a), int(b)] for a, b in shards], "saved_at": time.strftime("%Y-%m-%d %H:%M:%S")})
            os.replace(tmp, final)
            for old in list_steps(root)[:-keep] if keep > 0 else []:
                shutil.rmtree(step_dir(root, old), ignore_errors=True)
    log.info(f"checkpoint {final} written in {time.time() - started:.1f} s")
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
    full = getattr(error, "errno", None) == errno.ENOSPC or "space" in str(error).lower()
    if not full:
        return error
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    per_rank = bank.nbytes + sum(v.size * 4 for v in backbone.aux_params.values())
    params = sum(v.size * 4 for v in list(backbone.arg_params.values()) + list(backbone.aux_params.values()))
    needed = per_rank + (3 * params if rank == 0 else 0)       # model, model-average, optimizer.states
    steps = list_steps(root)
    previous = (f"the previous checkpoint {step_dir(root, steps[-1])} is intact" if steps
                else "there is no earlier checkpoint")
    free_text = f"{free / 1e6:.1f} MB free" if free is not None else "free space unknown"
    return CheckpointError(
        f"checkpoint {final} not written: the disk is full ({free_text} on the file system of {root}; this rank "
        f"writes about {needed / 1e6:.1f} MB per checkpoint; {str(error).splitlines()[0]}). Nothing of it is kept, "
        f"and {previous}: free space (or lower --keep_checkpoints), then continue with --resume latest")


def load_backbone(path: str, rank: int, same_world: bool, average: bool = False):
    """(arg_params, aux_params) for this rank: rank 0's weights with the rank's own BN statistics.

    On a different number of ranks (or with average=True) the averaged statistics are used.
    """
    try:
        _, arg_params, aux_params = mx.model.load_checkpoint(
            os.path.join(path, "model-average" if average else "model"), 0)
        own = aux_file(path, rank)
        if same_world and not average and os.path.exists(own):
            aux_params = mx.nd.load(own)
        elif not average:
            _, _, aux_params = mx.model.load_checkpoint(os.path.join(path, "model-average"), 0)
    except (OSError, mx.base.MXNetError) as error:
        raise CheckpointError(f"{path}: cannot read the backbone: {str(error).splitlines()[0]}") from None
    return arg_params, aux_params


def resume_position(state: dict, steps_per_epoch: int, global_batch: int) -> "tuple[int, int]":
    """(step, epoch) to continue from: the saved step, or on another global batch the same samples seen.

    The epoch is kept; within it, the steps done are converted by global batch size.
    """
    if state["global_batch"] == global_batch and state["steps_per_epoch"] == steps_per_epoch:
        return state["step"], state["step"] // steps_per_epoch
    epoch = state["step"] // state["steps_per_epoch"]
    within = (state["step"] % state["steps_per_epoch"]) * state["global_batch"] // global_batch
    return epoch * steps_per_epoch + min(within, steps_per_epoch - 1), epoch
