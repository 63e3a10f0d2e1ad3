"""The overlap search (head/center_search.most_similar) at scale: time, peak memory and bytes per rank.

Needs: about 40 minutes of one core at the default 100k x 100k classes, D = 512 (5.1e12 multiply-adds:
~25 G/s a core unloaded, a few G/s on a loaded one; W ranks split them), about 0.5 GB of memory per rank
(its shares of both sets' centers, one block, 64 MB of cosines), no disk. Run it on 1 and 2 ranks:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/overlap_search.py --json benchmarks/results/overlap.jsonl
    OMP_NUM_THREADS=1 horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python benchmarks/overlap_search.py ...

Each rank makes its shares of two sets of random unit centers (rows drawn by class id, so that any world
size holds the same sets), with --planted B classes near A classes (cosine about 0.95: the same identity in
two sets), and times most_similar (every rank starting together), then reads its peak resident memory
(VmHWM) and checks that each planted pair is its A class's best match. It prints the time, the rate, the
memory, the bytes broadcast, and the projection to --project classes each way on --project-ranks ranks
(the work scales as |A| x |B| x D / ranks; each rank's memory is the peak measured with its shares of both
sets and its top k per class scaled to the projection's: the blocks and the cosines in hand stay the same).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from mxnet_pfc.head.center_search import most_similar
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.runtime import comm

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from timing import append_json  # noqa: E402

CHUNK = 4096          # rows drawn from one seed: a class's row is the same on any world size


def rows_of(set_index: int, start: int, count: int, width: int) -> np.ndarray:
    """Rows start .. start + count - 1 of a set of random unit rows (by CHUNK-row seeds)."""
    out = np.empty((count, width), np.float32)
    for chunk in range(start // CHUNK, (start + count - 1) // CHUNK + 1 if count else 0):
        values = np.random.default_rng((set_index, chunk)).standard_normal((CHUNK, width), dtype=np.float32)
        lo, hi = max(start, chunk * CHUNK), min(start + count, chunk * CHUNK + CHUNK)
        out[lo - start:hi - start] = values[lo - chunk * CHUNK:hi - chunk * CHUNK]
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def planted_pairs(classes: int, planted: int) -> "tuple[np.ndarray, np.ndarray]":
    """(A classes, B classes) of the planted pairs, the same on every rank."""
    rng = np.random.default_rng(7)
    return rng.choice(classes, planted, replace=False), rng.choice(classes, planted, replace=False)


def peak_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=100_000, help="classes of each set (default: %(default)s)")
    parser.add_argument("--embedding-size", type=int, default=512, help="center width D (default: %(default)s)")
    parser.add_argument("--planted", type=int, default=1000,
                        help="B classes planted near A classes, each to be found (default: %(default)s)")
    parser.add_argument("--top-k", type=int, default=5,
                        help="most similar classes kept per class (default: %(default)s)")
    parser.add_argument("--block-rows", type=int, default=65536,
                        help="center rows broadcast at a time (default: %(default)s, the command's)")
    parser.add_argument("--project", type=int, default=2_000_000,
                        help="classes of each set in the projection (default: %(default)s)")
    parser.add_argument("--project-ranks", type=int, nargs="+", default=[16, 64, 256],
                        help="rank counts of the projection (default: %(default)s)")
    parser.add_argument("--json", default="", help="append the figures as one JSON line to this file (default: none)")
    args = parser.parse_args(argv)
    comm.init()
    rank, world = comm.rank(), comm.size()
    n, width = args.classes, args.embedding_size
    a_start, a_count = shard_range(n, rank, world)
    b_start, b_count = shard_range(n, rank, world)
    a, b = rows_of(0, a_start, a_count, width), rows_of(1, b_start, b_count, width)
    to_a, to_b = planted_pairs(n, args.planted)
    for i, j in zip(to_a, to_b):            # B class j: A class i's row, moved by noise of 0.33 its length
        if b_start <= j < b_start + b_count:
            b[j - b_start] = rows_of(0, i, 1, width)[0] + np.random.default_rng(int(j)).standard_normal(
                width, dtype=np.float32) * 0.33 / np.sqrt(width)
    if rank == 0:
        print(f"overlap search: {n:,} x {n:,} classes, D = {width}, {world} rank(s), k = {args.top_k}, "
              f"blocks of {args.block_rows:,} rows; {args.planted:,} planted pairs", flush=True)
    before = peak_bytes()
    comm.barrier()
    start = time.perf_counter()
    cos, ids = most_similar(a, b, b_start, args.top_k, args.block_rows)
    comm.barrier()
    seconds = time.perf_counter() - start
    mine = (to_a >= a_start) & (to_a < a_start + a_count)
    found = int((ids[to_a[mine] - a_start, 0] == to_b[mine]).sum())
    rows = comm.gather_rows([seconds, peak_bytes(), before, found])
    if rank != 0:
        return 0
    seconds = max(r[0] for r in rows)
    peak, held = max(r[1] for r in rows), max(r[2] for r in rows)
    found = int(sum(r[3] for r in rows))
    work = float(n) * n * width
    rate = work / seconds / world                   # multiply-adds a second per rank
    block = min(args.block_rows, -(-n // world))
    received = n * width * 4 * (world - 1) / world   # B rows from the other ranks' broadcasts
    print(f"  {seconds:.1f} s ({rate / 1e9:.2f} G multiply-adds/s per rank); peak resident memory "
          f"{peak / 1e9:.2f} GB per rank ({held / 1e9:.2f} GB before the search: its shares of the sets)")
    print(f"  broadcast: {n * width * 4 / 1e6:,.0f} MB of B rows in all, {received / 1e6:,.0f} MB received by "
          f"each rank, in blocks of at most {block * width * 4 / 1e6:.0f} MB; planted pairs found first: "
          f"{found:,} of {args.planted:,}")
    scale = (args.project / n) ** 2
    projections = {}
    for ranks in args.project_ranks:
        hours = seconds * world * scale / ranks / 3600
        # the measured peak, with this run's shares of the sets (and its top k per row) replaced by the projection's
        memory = peak + (args.project / ranks - n / world) * (2 * width * 4 + args.top_k * 12)
        projections[ranks] = {"hours": hours, "memory_bytes": memory}
        print(f"  projection to {args.project:,} x {args.project:,} on {ranks} ranks at this rate: {hours:.1f} h, "
              f"about {memory / 1e9:.1f} GB per rank")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        append_json(args.json, {"benchmark": "overlap_search", "classes": n, "embedding_size": width,
                                 "world_size": world, "seconds": seconds, "multiply_adds_per_s_per_rank": rate,
                                 "peak_bytes": peak, "shares_bytes": held, "broadcast_bytes": n * width * 4,
                                 "received_bytes_per_rank": received, "planted": args.planted, "found": found,
                                 "projection": {"classes": args.project,
                                                **{str(k): v for k, v in projections.items()}}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
