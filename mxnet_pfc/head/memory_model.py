"""The Partial FC head's memory per rank, as mxnet_pfc.head.partial_fc allocates it (the planner's model).

The model counts the head's own arrays on one rank (the rank with the most
classes), as mxnet_pfc.head.partial_fc allocates them. On the device (what must
fit in --device-memory):

  centers, momentum   num_local x D, in the storage dtype (float32 here)
  sampled buffers     S gathered centers and their gradient (S x D float32 each)
                      on the MXNet-op path (GPU; the fused CPU kernels take
                      the centers in cache-sized blocks and need neither),
                      inverse norms, indices, and the sampler's draws
  logits              N x S float32 (N = global batch); the softmax gradient
                      is written over them in place
  gradients           N x D float32 four times: gathered embeddings, normalised
                      ones, their gradient and its allreduce

and in host memory, the sampler's tables: an int32 slot (num_local + 1) and a
one-byte mark per local class, and the draws copied from the device (none at
sample rate 1). On a CPU rank host and device are the same memory.

S = max(int(rate x num_local), the global batch's positives <= N). With K
sub-centers per class (--subcenters, sub-center ArcFace) every class has K rows:
centers, momentum and the sampled buffers are K times larger, and beside the
pooled N x S logits the head holds the sub-centers' cosines, their gradient and
its product with the cosines (N x S x K each) and K column slices and K masks
(N x S each), as the MXNet-operator path (the GPU's) holds them; the fused CPU
kernels hold none of the slices and masks, so on a CPU this is an upper bound. The
backbone, its activations and the framework's own memory are not in it: pass
them as --reserve (measure a run with a small head to find yours).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from mxnet_pfc.head.sampler import expected_draws, max_sampled_centers, num_sampled_centers, shard_range

GIB = 2 ** 30
DTYPE_BYTES = {"float32": 4, "float16": 2}

@dataclass(frozen=True)
class HeadMemory:
    """Bytes per rank of each part of the head: `total` on the device, `host` beside it."""
    num_local: int
    num_sample: int
    centers: int
    momentum: int
    sampled: int
    logits: int
    gradients: int
    held_gradients: int = 0     # gradient accumulation: MemoryBank.hold's buffers and what update takes
    host: int = 0               # the sampler's tables and its draws' host copies

    @property
    def total(self) -> int:
        """Device bytes: what has to fit beside the backbone."""
        return self.centers + self.momentum + self.sampled + self.logits + self.gradients + self.held_gradients

    def rows(self) -> "list[tuple[str, int]]":
        held = [("held gradients", self.held_gradients)] if self.held_gradients else []
        return [("centers", self.centers), ("momentum", self.momentum), ("sampled buffers", self.sampled),
                ("logits", self.logits), ("embedding gradients", self.gradients), *held,
                ("head total (device)", self.total), ("sampler (host)", self.host)]


def head_memory(classes: int, world: int, embedding: int, rate: float, batch: int,
                dtype: str = "float32", grad_accum: int = 1, subcenters: int = 1) -> HeadMemory:
    """The head's bytes on the rank holding the most classes; batch is per rank (per micro-batch)."""
    num_local = shard_range(classes, 0, world)[1]       # rank 0 holds the most
    n = batch * world
    full = num_sampled_centers(num_local, rate) >= num_local      # as the head's sampler decides
    num_sample = max_sampled_centers(num_local, rate, n)
    K = subcenters
    bank = num_local * K * embedding * DTYPE_BYTES[dtype]
    if full:
        draws, host = 0, 0                       # every local class: no draws, no tables
    else:
        # candidates drawn with replacement: int32 on the device, then on the host as int32 and
        # int64 with their int64 positions; the host tables: an int32 slot and a one-byte mark
        # per local class
        draws = expected_draws(num_local, num_sample) + n
        host = (num_local + 1) * 4 + num_local + draws * (4 + 8 + 8)
    # the center gradient, and the gathered centers unless every center is used (then read in place)
    sampled = num_sample * K * embedding * 4 * (1 if full else 2) + num_sample * K * 4 * 3 + draws * 4
    held = 0
    if grad_accum > 1:      # summed gradient and radial term of every row, a used flag; the union's rows taken
        union = min(num_local, grad_accum * num_sample) * K
        held = num_local * K * (embedding + 2) * 4 + union * (embedding * 2 + 2) * 4
    # with sub-centers: their cosines, pooling masks and gradient (partial_fc._pooled_logits, _subcenter_grad):
    # N x S x K three times, N x S 2K times beside the pooled logits
    logits = n * num_sample * 4 * (1 + (5 * K if K > 1 else 0))
    return HeadMemory(num_local, num_sample, centers=bank, momentum=bank, sampled=sampled,
                      logits=logits, gradients=n * embedding * 4 * 4, held_gradients=held, host=host)


def combined(memories: "list[HeadMemory]") -> HeadMemory:
    """Several sets' heads on one rank (one per set, each over its rows of the batch): every head keeps its
    own bank, buffers and sampler, so the rank holds their sum."""
    return HeadMemory(*(sum(getattr(m, f.name) for m in memories) for f in fields(HeadMemory)))


def fits(classes, world, embedding, rate, batch, dtype, budget, grad_accum=1, subcenters=1) -> bool:
    """Whether the head's device bytes at this rate and per-rank batch fit in `budget`."""
    return head_memory(classes, world, embedding, rate, batch, dtype, grad_accum, subcenters).total <= budget


def largest_rate(classes, world, embedding, batch, dtype, budget, grad_accum=1, subcenters=1) -> "float | None":
    """The largest sample rate below 1 (to 0.001) whose head fits in `budget` device bytes; None if none does.

    Rate 1 is not on the same scale: every center is used and read in place, with
    no gathered copy, so it can fit where 0.9 does not. Ask `fits` at rate 1 for it.
    """
    fits_at = lambda r: fits(classes, world, embedding, r, batch, dtype, budget, grad_accum, subcenters)  # noqa: E731
    if not fits_at(0.0):
        return None
    low, high = 0, 1000
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits_at(mid / 1000) else (low, mid)
    return low / 1000


def largest_batch(classes, world, embedding, rate, dtype, budget, grad_accum=1, subcenters=1) -> int:
    """The largest per-rank batch whose head fits in `budget` device bytes (0 if not even 1)."""
    fits_at = lambda b: fits(classes, world, embedding, rate, b, dtype, budget, grad_accum, subcenters)  # noqa: E731
    if not fits_at(1):
        return 0
    low, high = 1, 2
    while fits_at(high) and high < 2 ** 24:
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits_at(mid) else (low, mid)
    return low
