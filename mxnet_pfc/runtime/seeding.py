"""The one seeding rule of mxnet-pfc: MXNet's generators from (seed, rank, step).

MXNet's generators draw the head's sampled negatives, the initial centers and
the dropout masks. Each rank gets its own stream (ranks that shared one would
sample the same local ids and drop the same units), and the stream depends on
the step it starts at: MXNet cannot save a generator's state, so the trainer
seeds at the start of a run (step 0, or the step it resumes at) and again after
every checkpoint; a run resumed from a checkpoint then draws exactly what the
uninterrupted run drew after it. Nothing else in mxnet-pfc calls mx.random.seed.

See docs/DESIGN.md section 4.4.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np


def stream_seed(seed: int, rank: int, step: int) -> int:
    """The 31-bit seed of rank `rank`'s generators from step `step` on (independent across ranks and steps)."""
    return int(np.random.SeedSequence([int(seed), int(rank), int(step)]).generate_state(1)[0] % 2 ** 31)


def seed_generators(seed: int, rank: int, step: int) -> None:
    """Seed MXNet's generators on every device of this process for (seed, rank, step)."""
    mx.random.seed(stream_seed(seed, rank, step))
