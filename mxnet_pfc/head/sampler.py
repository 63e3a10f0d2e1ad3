"""Which classes a rank owns and which of its centers a step uses: the head's sizing math, in NumPy only.

The planner (mxnet_pfc.plan) sizes a run with these same functions without
loading MXNet. docs/DESIGN.md section 1.1 defines the shard ranges, section 2.2
derives the sampler and its number of draws.
"""
from __future__ import annotations

import logging
import math
from typing import Callable

import numpy as np

log = logging.getLogger(__name__)


def shard_range(num_classes: int, rank: int, world_size: int) -> "tuple[int, int]":
    """(class_start, num_local) of `rank`: contiguous ranges, remainder on the first ranks."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in a world of size {world_size}")
    if num_classes < world_size:
        raise ValueError(f"num_classes ({num_classes}) must be at least the world size ({world_size})")
    base, remainder = divmod(num_classes, world_size)
    num_local = base + (1 if rank < remainder else 0)
    class_start = rank * base + min(rank, remainder)
    return class_start, num_local


def num_sampled_centers(num_local: int, sample_rate: float) -> int:
    """Centers taken per step before positives overflow it: int(rate * num_local), at least 1."""
    return min(num_local, max(1, int(sample_rate * num_local)))


def max_sampled_centers(num_local: int, sample_rate: float, global_batch: int) -> int:
    """The most centers one step can use on a rank: the sampled number, or more when a global
    batch of distinct positives exceeds it (each positive is always taken)."""
    return max(num_sampled_centers(num_local, sample_rate), min(num_local, global_batch))


def expected_draws(num_local: int, num_sample: int) -> int:
    """Uniform draws (with replacement) that give num_sample distinct classes with margin (docs/DESIGN.md 2.2)."""
    n, d = num_local, num_sample
    if d >= n:
        return 0
    mean = n * math.log(n / (n - d))
    return int(math.ceil(1.02 * mean + 3.0 * math.sqrt(mean) + 16))


class CenterSampler:
    """Picks the local centers of one step, on the host (docs/DESIGN.md 2.2 derives it).

    Every positive of the global batch (all of them, even beyond num_sample),
    plus negatives drawn uniformly without replacement up to num_sample in all;
    `sample` gives them as sorted unique local ids, and each row's column among
    them. The work per step is
    O(draws + N) plus a scan of one byte per local class, never a sort. The
    draws come from `draw(count)`: count uniform class ids in [0, num_local),
    with replacement (the head passes MXNet's generator, which seeding.py seeds).
    """

    def __init__(self, num_local: int, num_sample: int, draw: "Callable[[int], np.ndarray]"):
        self.num_local = num_local
        self.num_sample = num_sample
        self.draw = draw
        self.full = num_sample >= num_local
        self.num_draws = expected_draws(num_local, num_sample)
        self._all = np.arange(num_local, dtype=np.int32) if self.full else None
        self._table = None if self.full else np.zeros(num_local + 1, dtype=np.int32)
        self._chosen = None if self.full else np.zeros(num_local, dtype=bool)

    def sample(self, local_ids: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        """(index, target) for local_ids (N,) on the host, num_local marking other ranks' labels.

        index: sorted int32 local class ids (S,); target: int32 (N,), the column of
        each row's label in index (meaningless for rows of other ranks).
        """
        local_ids = np.asarray(local_ids, dtype=np.int64)
        if self.full:
            return self._all, local_ids.astype(np.int32)
        N, table, draws = local_ids.shape[0], self._table, self.num_draws
        rows = np.arange(N)
        for _attempt in range(20):
            candidates = np.asarray(self.draw(draws)).astype(np.int64)
            positions = np.arange(N, N + draws)
            # One draw per class holds its slot: whichever NumPy writes last. The choice depends
            # on positions only, never on the class, so the sample stays uniform.
            table[candidates] = positions
            table[local_ids] = rows                     # positives overwrite draws of the same class
            positives = local_ids[(table[local_ids] == rows) & (local_ids < self.num_local)]
            distinct = candidates[table[candidates] == positions]
            num_neg = max(self.num_sample - positives.shape[0], 0)
            if distinct.shape[0] >= num_neg:
                break
            log.warning("sampler drew %d distinct negatives, needed %d; drawing again", distinct.shape[0], num_neg)
            draws *= 2
        else:
            raise RuntimeError("the center sampler failed to draw enough distinct negatives")
        chosen = self._chosen
        chosen[positives] = True
        chosen[distinct[:num_neg]] = True
        index = np.flatnonzero(chosen)
        chosen[index] = False
        table[index] = np.arange(index.shape[0])
        return index.astype(np.int32), table[local_ids].astype(np.int32)
