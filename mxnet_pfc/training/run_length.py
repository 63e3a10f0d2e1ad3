"""What a run will do, fixed at start-up: its global batch, its length in steps, and what it will cost.

The plan is decided on each rank from the configuration, the data and the
world size alone (no collectives), so that a failure here is agreed on with
the rest of setup before any collective starts.

See docs/DESIGN.md section 4.5.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from mxnet_pfc.runtime.checkpoints import State
from mxnet_pfc.training import config as config_lib

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunPlan:
    """What this run will do, from the configuration, the data and the world size."""
    num_images: int
    global_batch: int
    steps_per_epoch: int
    max_update: int            # the step the run ends at
    lr: float                  # peak learning rate for the global batch
    context: str
    length_note: str = ""      # how max_update was carried over from a checkpoint, if it was

    def describe(self, batch_size: int, world: int, grad_accum: int, lr_schedule: str) -> str:
        micro = (f" x {grad_accum} micro-batches (gradient accumulation: steps are optimizer steps)"
                 if grad_accum > 1 else "")
        return (f"{self.num_images} images, global batch {self.global_batch} = {batch_size} x {world} ranks{micro}, "
                f"{self.steps_per_epoch} steps/epoch, {self.max_update} steps, peak lr {self.lr:.4g} "
                f"({lr_schedule}), context {self.context}")


def global_batch(cfg: config_lib.Config, world: int) -> int:
    """The samples of one optimizer step: batch_size per rank x world_size x grad_accum micro-batches."""
    return cfg.batch_size * world * cfg.grad_accum


def planned_max_update(cfg: config_lib.Config, steps_per_epoch: int, global_batch: int,
               saved: "State | None") -> "tuple[int, str]":
    """(max_update, note): the step the run ends at.

    A run resumed on another global batch (another number of ranks, batch size
    or grad_accum) with the same --max_update keeps its length in samples, as its position is kept:
    the checkpoint's end step x its global batch / this global batch, rounded
    up. A --max_update that differs from the checkpoint's counts steps of this
    run's global batch. Without --max_update the length is num_epoch epochs.
    `saved` is the checkpoint's state.json, None for a fresh run.
    """
    if not cfg.max_update:
        return max(1, math.ceil(cfg.num_epoch * steps_per_epoch)), ""
    if saved is None or saved.config.get("max_update") != cfg.max_update:
        return cfg.max_update, ""
    # From the checkpoint's own end, not --max_update: a run resumed twice (4 ranks, then 2, then 2
    # again) keeps the first run's length.
    samples = saved.max_update * saved.global_batch
    max_update = math.ceil(samples / global_batch)
    if max_update == cfg.max_update:
        return max_update, ""
    return max_update, (f"--max_update {cfg.max_update} kept in samples: the checkpoint's run ends after "
                        f"{saved.max_update} steps of {saved.global_batch} = {samples} samples, "
                        f"{max_update} steps of {global_batch} here")


def make_plan(cfg: config_lib.Config, world: int, num_images: int, steps_per_epoch: int, context: str,
              resume=None) -> RunPlan:
    """The plan of this run; refuses a resumed run that has nothing left to train."""
    samples = global_batch(cfg, world)
    max_update, note = planned_max_update(cfg, steps_per_epoch, samples, resume.state if resume else None)
    if resume is not None and resume.step >= max_update:
        raise config_lib.ConfigError(
            f"nothing to train: checkpoint {resume.path} is at step {resume.step} (global batch "
            f"{samples}), and this run ends at step {max_update}"
            f"{' (' + note + ')' if note else ''}. To train longer, raise --max_update (or --num_epoch)")
    lr = cfg.lr * samples / cfg.lr_base_batch
    return RunPlan(num_images, samples, steps_per_epoch, max_update, lr, context, note)


COST_STEPS = 3      # steps timed (after the first, which builds and warms up) for the CPU cost estimate


def wants_cost_estimate(cfg: config_lib.Config, context: str) -> bool:
    """Whether to say what the run will cost before it goes on: a real recipe on a real set on a CPU (the
    synthetic default and the speed presets are meant for it, or say their length themselves)."""
    return (context.startswith("cpu") and cfg.recipe not in ("", config_lib.TOY_RECIPE)
            and bool(cfg.rec or cfg.images) and cfg.synthetic_identities == 0)


def cost_line(seconds_per_step: float, steps_per_epoch: int, max_update: int, done: int) -> str:
    """What the rest of a run will take at this step time, in a line a person reads."""
    epochs = max_update / steps_per_epoch
    return (f"on CPU: {seconds_per_step:.3g} s/step; an epoch is {steps_per_epoch:,} steps "
            f"({readable_duration(seconds_per_step * steps_per_epoch)}), the run {epochs:.3g} epochs "
            f"({readable_duration(seconds_per_step * (max_update - done))} from here); a GPU machine is the way "
            f"(README), or a shorter run: --max_update, --num_epoch")


def readable_duration(seconds: float) -> str:
    """45 s, 12 min, 35 h, 29 days: the unit a person plans in."""
    for unit, size, below in (("s", 1, 120), ("min", 60, 120 * 60), ("h", 3600, 48 * 3600)):
        if seconds < below:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds / 86400:.0f} days"
