"""Continuing a run from a checkpoint: what to read, what to check, where to start.

`read` runs before any collective (a failure there is agreed on with the rest
of setup); `restore` fills the module and the memory bank once they exist.
On another number of ranks the centers are re-sharded (memory_bank.py) and
the position is kept in samples seen (checkpoints.resume_position).

See docs/DESIGN.md section 5.3.
"""
from __future__ import annotations

from dataclasses import dataclass

import mxnet as mx

import symbols
from mxnet_pfc.head.set_heads import heads_of
from mxnet_pfc.models.inference import load_backbone
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.checkpoints import State
from mxnet_pfc.runtime.errors import CheckpointError, quoted, short
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.training import checkpoint, distill
from mxnet_pfc.training import config as config_lib


@dataclass(frozen=True)
class Resume:
    """A checkpoint checked against this run, with this rank's backbone parameters."""
    path: str
    state: State           # the checkpoint's state.json
    arg_params: dict
    aux_params: dict
    step: int              # the last step done, in this run's numbering
    epoch: int
    changes: "tuple[str, ...]" = ()    # what differs from the checkpoint's run, and what the resume does about it
    margin_state: "dict | None" = None  # the margin's running statistics to continue (None: start afresh)
    projection: "mx.nd.NDArray | None" = None   # the distillation's learned projection to continue (None: afresh)
    # sets 1, 2, ... of a run of several sets: each head's margin statistics to continue (None: afresh)
    extra_margin_states: "tuple[dict | None, ...]" = ()


def read(cfg, run: RunFolder, rank: int, world: int, symbol: mx.sym.Symbol, steps_per_epoch: int,
         global_batch: int, num_images: int, projection_shape: "tuple | None" = None) -> Resume:
    """The checkpoint cfg.resume names, checked against this run's classes, network and parameter shapes.
    `projection_shape`: the shape of the distillation projection this run learns (distill.py), if any,
    which a checkpoint of a distilled run holds beside the backbone."""
    path = checkpoints.locate(run.checkpoints, cfg.resume)
    state = State.read(path)
    margin = config_lib.margin_of(cfg)
    check_compatible(state, path, [cfg.num_classes, *cfg.extra_classes], cfg.embedding_size, cfg.network,
                     margin.subcenters)
    arg_params, aux_params = load_backbone(path, rank, same_world=state.world_size == world)
    saved_projection = arg_params.pop(distill.PROJECTION_WEIGHT, None)
    arg_shapes, aux_shapes = symbols.parameter_shapes(symbol, (cfg.batch_size, 3, cfg.image_size, cfg.image_size))
    checkpoints.check_params(arg_params, arg_shapes, path, cfg.network)
    checkpoints.check_params(aux_params, aux_shapes, path, cfg.network)
    step, epoch = checkpoints.resume_position(state, steps_per_epoch, global_batch)
    changes = describe_changes(state, path, cfg.seed, world, steps_per_epoch, global_batch, num_images, step)
    margin_state, margin_change = margin_state_to_continue(state, path, cfg.loss, margin)
    extra_margin_states = tuple(
        margin_state_to_continue(state, path, cfg.loss, config_lib.margin_of(cfg), number)[0]
        for number in range(1, len(state.heads())))
    saved_projection, projection_change = projection_to_continue(saved_projection, projection_shape)
    return Resume(path, state, arg_params, aux_params, step, epoch,
                  changes + margin_change + projection_change + starting_point_notes(state, cfg), margin_state,
                  saved_projection, extra_margin_states)


def check_compatible(state: State, path: str, classes: "list[int]", embedding_size: int, network: str,
                     subcenters: int = 1) -> None:
    """The checkpoint's heads and backbone must be the configured ones (`classes`: each set's class count,
    set 0 first); the message says which differs.

    A network given as a symbol file is known by its graph, not its name: check_params compares the
    parameters' names and shapes."""
    problems = checkpoints.head_mismatches(state, classes[0], embedding_size, subcenters)
    saved = [count for count, _ in state.heads()]
    if len(saved) != len(classes):
        problems.append(f"it trained {len(saved)} set(s), this run {len(classes)} (--rec/--images, extra_sets)")
    else:
        problems += [f"its set {number} has {then} classes, this run's {now} (extra_classes)"
                     for number, (then, now) in enumerate(zip(saved[1:], classes[1:]), start=1) if then != now]
    if state.network != network and not (symbols.is_symbol_file(state.network) or symbols.is_symbol_file(network)):
        problems.append(f"its network is {state.network}, the configuration's {network} (network)")
    if problems:
        raise CheckpointError(f"checkpoint {path} does not fit this run: " + "; ".join(problems))


def projection_to_continue(saved, shape: "tuple | None") -> "tuple[mx.nd.NDArray | None, tuple[str, ...]]":
    """(the checkpoint's distillation projection if this run continues it, what the resume says)."""
    if shape is None:
        return None, (("the checkpoint's distillation projection is left out: this run has no projection",)
                      if saved is not None else ())
    if saved is None:
        return None, ("the distillation's projection starts afresh (the checkpoint holds none)",)
    if tuple(saved.shape) != tuple(shape):
        return None, (f"the distillation's projection starts afresh: the checkpoint's maps to "
                      f"{saved.shape[0]} dimensions, this run's teacher has {shape[0]}",)
    return saved, ()


def starting_point_notes(state: State, cfg) -> "tuple[str, ...]":
    """What the resume says about the options of a run's start (--pretrained, --init_centers: not used
    when resuming) and its teacher, where they differ from the checkpoint's run."""
    saved, defaults = state.config, config_lib.Config()
    notes = []
    for name in ("pretrained", "init_centers"):
        given, then = getattr(cfg, name), saved.get(name, getattr(defaults, name))
        if given != then and given != getattr(defaults, name):
            notes.append(f"--{name} {given} is not used: this run started from {short(then or 'random')} and "
                         "continues its checkpoint")
    if saved.get("teacher", "") != cfg.teacher:
        notes.append(f"teacher {short(saved.get('teacher') or '(none)')} -> {cfg.teacher or '(none)'}")
    return tuple(notes)


def margin_state_to_continue(state: State, path: str, loss: str, margin,
                             set_number: int = 0) -> "tuple[dict | None, tuple[str, ...]]":
    """(the checkpoint's margin statistics of set `set_number`'s head if this run continues them, what the
    resume says about them).

    Statistics continue under the same loss (any world size: they are global-batch figures); another
    --loss, or a checkpoint without them (written before they were kept), starts them afresh, and says so.
    A damaged record is refused, naming the field. `margin` is this run's, fresh (loss's); the check loads
    the record into it."""
    fresh = margin.state()
    saved_loss = state.config.get("loss")
    saved = state.margin_state if set_number == 0 else state.extra_heads[set_number - 1].get("margin_state")
    field = "margin_state" if set_number == 0 else f"extra_heads[{set_number - 1}].margin_state"
    if saved_loss != loss:
        return None, ((f"loss {short(saved_loss)} -> {loss}: the new loss's running statistics start afresh",)
                      if fresh else ())
    if saved is None or saved == {}:
        return None, ((f"{loss}'s running statistics start afresh (the checkpoint holds none)",)
                      if fresh else ())
    try:
        if not isinstance(saved, dict):
            raise ValueError(f"expected an object, got {quoted(saved)}")
        margin.load_state(saved)
    except ValueError as error:
        raise CheckpointError(f"{path}/state.json: field {field!r} is damaged: {error}") from None
    return saved, ()


def describe_changes(state: State, path: str, seed: int, world: int, steps_per_epoch: int, global_batch: int,
                     num_images: int, step: int) -> "tuple[str, ...]":
    """What differs from the checkpoint's run (ranks, global batch, training set, seed) and what the resume
    does about each; refuses a --seed changed within an epoch, which would re-order the rest of it."""
    changes = []
    saved_images = state.num_images
    within = state.step % state.steps_per_epoch
    saved_seed = state.config.get("seed", seed)
    if saved_seed != seed:
        if within:
            raise CheckpointError(
                f"--seed {seed}: checkpoint {path} was trained with --seed {short(saved_seed)}, {within} steps into an "
                f"epoch; the seed orders the images of each epoch, so another one would show the rest of this "
                f"epoch's images twice or never. Resume with --seed {short(saved_seed)}, or from a checkpoint at the "
                f"end of an epoch")
        changes.append(f"seed {short(saved_seed)} -> {seed}: the epochs from here are ordered (and negatives drawn) "
                       f"by the new seed")
    if state.world_size != world:
        changes.append(f"ranks {state.world_size} -> {world}: centers and momentum re-sharded, the averaged "
                       f"BatchNorm statistics used")
    if saved_images is not None and saved_images != num_images:
        changes.append(f"training set {short(saved_images)} -> {num_images} images: epoch {step // steps_per_epoch} "
                       f"goes on from the same share of it, in the new set's order")
    elif saved_images is None and state.steps_per_epoch * state.global_batch != steps_per_epoch * global_batch:
        changes.append(f"the training set differs ({state.steps_per_epoch} steps of {state.global_batch} per "
                       f"epoch then, {steps_per_epoch} of {global_batch} now)")
    if state.global_batch != global_batch:
        changes.append(f"global batch {state.global_batch} -> {global_batch}: step {state.step} is step "
                       f"{step} here (the position is kept in samples seen within epoch {step // steps_per_epoch})")
    return tuple(changes)


def restore(resume: Resume, module, head) -> None:
    """Backbone, its optimizer state, this rank's centers and momentum and the margin's running statistics,
    from the checkpoint."""
    arg_params = dict(resume.arg_params)
    current = module.get_params()[0]
    if distill.PROJECTION_WEIGHT in current:        # the saved projection, or this run's fresh one
        arg_params[distill.PROJECTION_WEIGHT] = (resume.projection if resume.projection is not None
                                                 else current[distill.PROJECTION_WEIGHT])
    module.set_params(arg_params, resume.aux_params)
    # a projection not continued takes no momentum from the checkpoint either
    checkpoint.load_optimizer_state(resume.path, module,
                                    leave_out=() if resume.projection is not None else (distill.PROJECTION_WEIGHT,))
    heads = heads_of(head)
    for number, ((_, shards), each) in enumerate(zip(resume.state.heads(), heads)):   # check_compatible: as many
        each.bank.load(checkpoints.head_folder(resume.path, number), shards)
    for each, margin_state in zip(heads, (resume.margin_state, *resume.extra_margin_states)):
        if margin_state:
            each.margin.load_state(margin_state)


def describe(resume: Resume) -> str:
    """The log line of a resumed run: the checkpoint by what it holds, and what changed since."""
    saved = resume.state
    line = (f"resuming from {resume.path} ({saved.samples_seen:,} samples seen, step {saved.step} on "
            f"{saved.world_size} rank(s)) at step {resume.step}, epoch {resume.epoch}")
    if resume.margin_state:
        line += "; the margin's running statistics continue: " + ", ".join(
            f"{name} {quoted(value)}" for name, value in resume.margin_state.items())
    return line + "".join(f"\n  - {change}" for change in resume.changes) if resume.changes else line
