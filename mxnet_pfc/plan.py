"""How much memory the Partial FC head needs per rank, and the largest sample rate or batch that fits.

    python -m mxnet_pfc.plan --classes 10e6 --world 8 --device-memory 11 --reserve 6
    python -m mxnet_pfc.plan --published

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
(N x S each). The
backbone, its activations and the framework's own memory are not in it: pass
them as --reserve (measure a run with a small head to find yours).
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from mxnet_pfc.head.sampler import expected_draws, max_sampled_centers, num_sampled_centers, shard_range

GIB = 2 ** 30
DTYPE_BYTES = {"float32": 4, "float16": 2}

# Published Partial FC settings (An et al., arXiv:2010.05222 and ICCVW 2021):
# (what, identities, GPUs, device memory GiB)
PUBLISHED = [
    ("10M identities on 8 RTX 2080 Ti", 10_000_000, 8, 11),
    ("29M identities on 8 V100 32GB", 29_000_000, 8, 32),
    ("100M identities on 64 RTX 2080 Ti", 100_000_000, 64, 11),
]


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


def report(what: str, classes: int, world: int, embedding: int, rate: float, batch: int, dtype: str,
           device_gib: "float | None", reserve_gib: float, grad_accum: int = 1, subcenters: int = 1) -> str:
    memory = head_memory(classes, world, embedding, rate, batch, dtype, grad_accum, subcenters)
    micro = f" x {grad_accum} micro-batches" if grad_accum > 1 else ""
    centers = f" ({subcenters} sub-centers per class)" if subcenters > 1 else ""
    lines = [f"{what}: {classes:,} classes on {world} ranks ({memory.num_local:,} per rank), embedding {embedding}, "
             f"sample rate {rate} ({memory.num_sample:,} sampled per rank), batch {batch}/rank{micro} "
             f"({batch * world * grad_accum:,} global), {dtype} centers and momentum{centers}"]
    lines += [f"  {name:<20} {size / GIB:9.3f} GiB" for name, size in memory.rows()]
    if device_gib:
        budget = int((device_gib - reserve_gib) * GIB)
        verdict = "fits" if memory.total <= budget else "does NOT fit"
        lines.append(f"  device {device_gib:g} GiB - reserve {reserve_gib:g} GiB for the rest = "
                     f"{budget / GIB:.2f} GiB for the head: {verdict}")
        rate_max = largest_rate(classes, world, embedding, batch, dtype, budget, grad_accum, subcenters)
        batch_max = largest_batch(classes, world, embedding, rate, dtype, budget, grad_accum, subcenters)
        full = fits(classes, world, embedding, 1.0, batch, dtype, budget, grad_accum, subcenters)
        lines.append("  largest sample rate below 1 at this batch: "
                     + ("none (the centers alone do not fit)" if rate_max is None else f"{rate_max:g}"))
        lines.append("  sample rate 1 at this batch: " + (
            "fits (every center is used and read in place: no gathered copy)" if full else "does not fit"))
        lines.append(f"  largest batch per rank at this rate: {batch_max:,}" if batch_max else
                     "  largest batch per rank at this rate: none")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mxnet_pfc.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=float, default=10e6, help="identities in all (default 1e7; 10e6 is accepted)")
    p.add_argument("--world", type=int, default=8, help="ranks (GPUs) in all (default 8)")
    p.add_argument("--embedding", type=int, default=512, help="embedding size (default 512)")
    p.add_argument("--sample-rate", type=float, default=0.1,
                   help="fraction of each rank's centers sampled per step (default 0.1)")
    p.add_argument("--batch", type=int, default=128, help="images per rank per step, or per micro-batch (default 128)")
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per step (the trainer's --grad_accum); above 1 the head holds summed "
                        "gradients, about one more copy of the centers (default 1)")
    p.add_argument("--subcenters", type=int, default=1,
                   help="centers per class (the trainer's subcenter_k with --loss subcenter-arcface; default 1)")
    p.add_argument("--dtype", choices=sorted(DTYPE_BYTES), default="float32",
                   help="storage of centers and momentum (default float32, as the trainer stores them; "
                        "float16 is a what-if)")
    p.add_argument("--device-memory", type=float,
                   help="GiB per device; with it, what fits is worked out (default: not given, no fit)")
    p.add_argument("--reserve", type=float, default=0.0,
                   help="GiB per device taken by the backbone, activations and framework (default 0)")
    p.add_argument("--published", action="store_true", help="print the published Partial FC settings instead")
    args = p.parse_args(argv)
    if (args.classes < 1 or args.world < 1 or args.embedding < 1 or args.batch < 1 or args.grad_accum < 1
            or args.subcenters < 1):
        p.error("--classes, --world, --embedding, --batch, --grad-accum and --subcenters must be positive")
    if not 0 < args.sample_rate <= 1:
        p.error("--sample-rate must be in (0, 1]")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.published:
        for what, classes, world, device in PUBLISHED:
            print(report(what, classes, world, args.embedding, args.sample_rate, args.batch, args.dtype,
                         device, args.reserve, args.grad_accum, args.subcenters))
            print()
        return 0
    print(report("plan", int(args.classes), args.world, args.embedding, args.sample_rate, args.batch, args.dtype,
                 args.device_memory, args.reserve, args.grad_accum, args.subcenters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
