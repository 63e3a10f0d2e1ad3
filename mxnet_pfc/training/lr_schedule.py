"""The learning rate of each step: linear warm-up, then multi-step or polynomial decay.

One schedule drives both optimizers (the backbone's and the memory bank's).
Steps are 0-based and count optimizer steps of the global batch; epochs in the
configuration convert with steps_per_epoch (config.py explains the batch and
learning-rate arithmetic).
"""
from __future__ import annotations

import bisect


class LRSchedule:
    """Learning rate per step (0-based).

    multistep: lr x factor^(number of decay steps <= step);
    poly: lr x (1 - (step - warmup) / (max_update - warmup))^power.
    Warm-up: lr x (step + 1) / warmup_steps for the first warmup_steps steps.
    """

    def __init__(self, lr: float, max_update: int, kind: str = "multistep", decay_steps=(),
                 factor: float = 0.1, warmup_steps: int = 0, power: float = 2.0):
        self.lr, self.max_update, self.kind = lr, max_update, kind
        self.decay_steps, self.factor = sorted(int(s) for s in decay_steps), factor
        self.warmup_steps, self.power = int(warmup_steps), power

    @classmethod
    def from_config(cls, cfg, lr: float, max_update: int, steps_per_epoch: int) -> "LRSchedule":
        """The schedule a training configuration asks for, its epochs converted to steps."""
        return cls(lr, max_update, cfg.lr_schedule, [round(e * steps_per_epoch) for e in cfg.decay_epochs],
                   cfg.lr_factor, round(cfg.warmup_epochs * steps_per_epoch), cfg.poly_power)

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        if self.kind == "poly":
            span = max(1, self.max_update - self.warmup_steps)
            return self.lr * max(0.0, 1 - (step - self.warmup_steps) / span) ** self.power
        return self.lr * self.factor ** bisect.bisect_right(self.decay_steps, step)
