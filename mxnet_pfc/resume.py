"""Continuing a run from a checkpoint: what to read, what to check, where to start.

`read` runs before any collective (a failure there is agreed on with the rest
of setup); `restore` fills the module and the memory bank once they exist.
On another number of ranks the centers are re-sharded (memory_bank.py) and
the position is kept in samples seen (checkpoint.resume_position).

See docs/DESIGN.md section 5.3.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import mxnet as mx

from . import checkpoint
from .checkpoint import CheckpointError


@dataclass(frozen=True)
class Resume:
    """A checkpoint checked against this run, with this rank's backbone parameters."""
    path: str
    state: dict            # the checkpoint's state.json
    arg_params: dict
    aux_params: dict
    step: int              # the last step done, in this run's numbering
    epoch: int


def read(cfg, rank: int, world: int, symbol: mx.sym.Symbol, steps_per_epoch: int, global_batch: int) -> Resume:
    """The checkpoint cfg.resume names, checked against this run's classes, network and parameter shapes."""
    path = checkpoint.locate(os.path.join(cfg.output, "checkpoints"), cfg.resume)
    state = checkpoint.read_state(path)
    checkpoint.check_compatible(state, path, cfg.num_classes, cfg.embedding_size, cfg.network)
    arg_params, aux_params = checkpoint.load_backbone(path, rank, same_world=state["world_size"] == world)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(cfg.batch_size, 3, cfg.image_size, cfg.image_size))
    checkpoint.check_params(arg_params, {n: s for n, s in zip(symbol.list_arguments(), arg_shapes) if n != "data"},
                            path, cfg.network)
    checkpoint.check_params(aux_params, dict(zip(symbol.list_auxiliary_states(), aux_shapes)), path, cfg.network)
    step, epoch = checkpoint.resume_position(state, steps_per_epoch, global_batch)
    return Resume(path, state, arg_params, aux_params, step, epoch)


def restore(resume: Resume, module, bank) -> None:
    """Backbone, its optimizer state and this rank's centers and momentum, from the checkpoint."""
    module.set_params(resume.arg_params, resume.aux_params)
    try:
        module.load_optimizer_states(os.path.join(resume.path, "optimizer.states"))
    except Exception as error:       # a pickle of NDArrays: anything can go wrong in a damaged file
        raise CheckpointError(f"{resume.path}/optimizer.states: {error}") from None
    bank.load(resume.path, resume.state["shards"])


def describe(resume: Resume, world: int) -> str:
    """The log line of a resumed run."""
    saved = resume.state
    moved = "" if saved["world_size"] == world and saved["step"] == resume.step else (
        f" (saved on {saved['world_size']} ranks at step {saved['step']}, global batch {saved['global_batch']}: "
        f"centers re-sharded, position kept in samples seen)")
    return f"resuming from {resume.path} at step {resume.step}, epoch {resume.epoch}{moved}"
