"""How much memory the Partial FC head needs per rank, and the largest sample rate or batch that fits.

    python -m mxnet_pfc.plan --classes 10e6 --world 8 --device-memory 11 --reserve 6
    python -m mxnet_pfc.plan --classes 5.8e6,2e6 --set-shares 3,1 --world 16     # two sets, a head each
    python -m mxnet_pfc.plan --published

The memory model is mxnet_pfc/head/memory_model.py; its docstring says what it counts.
"""
from __future__ import annotations

import argparse
import sys

from mxnet_pfc.data.errors import DataError
from mxnet_pfc.data.set_rows import rows_per_set
from mxnet_pfc.head.memory_model import (
    DTYPE_BYTES,
    GIB,
    combined,
    fits,
    head_memory,
    largest_batch,
    largest_rate,
)

# Published Partial FC settings (An et al., arXiv:2010.05222 and ICCVW 2021):
# (what, identities, GPUs, device memory GiB)
PUBLISHED = [
    ("10M identities on 8 RTX 2080 Ti", 10_000_000, 8, 11),
    ("29M identities on 8 V100 32GB", 29_000_000, 8, 32),
    ("100M identities on 64 RTX 2080 Ti", 100_000_000, 64, 11),
]


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


def report_sets(classes: "list[int]", shares: "list[float] | None", world: int, embedding: int, rate: float,
                batch: int, dtype: str, device_gib: "float | None", reserve_gib: float, grad_accum: int = 1,
                subcenters: int = 1) -> str:
    """Several sets trained together: each set's head over its rows of the batch (as the trainer splits it:
    by --set-shares, else in proportion to the sets' sizes, here their class counts), and their sum."""
    rows = rows_per_set(batch, classes, shares)
    lines, memories = [], []
    for number, (count, share) in enumerate(zip(classes, rows)):
        lines.append(report(f"set {number}", count, world, embedding, rate, share, dtype, None, 0.0, grad_accum,
                            subcenters))
        memories.append(head_memory(count, world, embedding, rate, share, dtype, grad_accum, subcenters))
    total = combined(memories)
    lines.append(f"all {len(classes)} heads on each rank (batch {batch}/rank = {' + '.join(map(str, rows))}):")
    lines += [f"  {name:<20} {size / GIB:9.3f} GiB" for name, size in total.rows()]
    if device_gib:
        budget = int((device_gib - reserve_gib) * GIB)
        lines.append(f"  device {device_gib:g} GiB - reserve {reserve_gib:g} GiB for the rest = {budget / GIB:.2f} "
                     f"GiB for the heads: {'fits' if total.total <= budget else 'does NOT fit'}")
    return "\n".join(lines)


def class_counts(text: str) -> "list[int]":
    """--classes: one count, or one per set, comma-separated (10e6 is accepted)."""
    try:
        counts = [int(float(item)) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected class counts, comma-separated (e.g. 5.8e6,2e6), got {text!r}")
    if any(count < 1 for count in counts):
        raise argparse.ArgumentTypeError(f"every class count must be at least 1, got {text!r}")
    return counts


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mxnet_pfc.plan", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--classes", type=class_counts, default=[10_000_000],
                   help="identities in all (default 1e7; 10e6 is accepted); several sets trained together: one "
                        "count per set, comma-separated, each set its own head")
    p.add_argument("--set-shares", type=lambda text: [float(v) for v in text.split(",")],
                   help="several sets: each set's share of the batch, comma-separated (the trainer's --set_shares; "
                        "default: in proportion to the class counts)")
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
    if (args.world < 1 or args.embedding < 1 or args.batch < 1 or args.grad_accum < 1
            or args.subcenters < 1):
        p.error("--classes, --world, --embedding, --batch, --grad-accum and --subcenters must be positive")
    if not 0 < args.sample_rate <= 1:
        p.error("--sample-rate must be in (0, 1]")
    if args.set_shares is not None and len(args.classes) < 2:
        p.error("--set-shares splits the batch between several sets: give one class count per set to --classes")
    if len(args.classes) > 1:
        try:
            rows_per_set(args.batch, args.classes, args.set_shares)
        except DataError as error:
            p.error(f"--classes/--set-shares/--batch: {error}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.published:
        for what, classes, world, device in PUBLISHED:
            print(report(what, classes, world, args.embedding, args.sample_rate, args.batch, args.dtype,
                         device, args.reserve, args.grad_accum, args.subcenters))
            print()
        return 0
    if len(args.classes) > 1:
        print(report_sets(args.classes, args.set_shares, args.world, args.embedding, args.sample_rate, args.batch,
                          args.dtype, args.device_memory, args.reserve, args.grad_accum, args.subcenters))
        return 0
    print(report("plan", args.classes[0], args.world, args.embedding, args.sample_rate, args.batch, args.dtype,
                 args.device_memory, args.reserve, args.grad_accum, args.subcenters))
    return 0


if __name__ == "__main__":
    sys.exit(main())
