"""Speed and memory of the Partial FC head alone, on synthetic embeddings.

Run under a launcher, one process per rank, e.g. on this machine's CPU:

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python benchmarks/bench_head.py \\
        --num-classes 1000000 --sample-rate 0.1

Every step is timed twice, side by side in the same processes: the head
(forward_backward: allgather, sampling, logits, softmax, gradients, SGD of the
centers) and then its three matrix products alone (logits, embedding gradient,
center gradient) with the same shapes: the floor no head can beat. Reported:
medians over the measured steps, their ratio, samples/s, and peak resident
memory per rank.
"""
from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
from tqdm import tqdm

from mxnet_pfc import CombinedMarginLoss, PartialFC
from mxnet_pfc.head import margin
from mxnet_pfc.plan import head_memory
from mxnet_pfc.runtime import comm
from timing import append_json, synced

nd = mx.nd


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-classes", type=int, default=100_000, help="identities in all (default 100000)")
    p.add_argument("--sample-rate", type=float, default=0.1,
                   help="fraction of each rank's centers sampled per step (default 0.1)")
    p.add_argument("--embedding-size", type=int, default=512, help="embedding dimension D (default 512)")
    p.add_argument("--batch-size", type=int, default=64, help="embeddings per rank per step (default 64)")
    p.add_argument("--steps", type=int, default=8, help="measured steps; the median is reported (default 8)")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps run before measuring (at least 1; peak memory is read after them; default 2)")
    p.add_argument("--margin", default="arcface", choices=sorted(margin.PRESETS),
                   help="margin preset of the head (default arcface)")
    p.add_argument("--kernels", default="auto", choices=["auto", "fused", "mxnet"],
                   help="fused C++ CPU kernels, MXNet ops, or auto (fused where available; the default)")
    p.add_argument("--json", type=Path, help="append the result as one JSON line to this file (default: print only)")
    return p.parse_args(argv)


def time_matmuls(N, S, D, ctx, cache):
    """Seconds for the step's three products alone: (N,D)x(S,D)^T, (N,S)x(S,D), (N,S)^T x(N,D)."""
    if S not in cache:
        cache.clear()
        # Operands and preallocated outputs (as the head's workspace): the floor
        # pays no page faults the head does not pay either.
        cache[S] = [nd.random.normal(shape=shape, ctx=ctx) for shape in ((N, D), (S, D), (N, S))] + \
                   [nd.zeros(shape, ctx=ctx) for shape in ((N, S), (N, D), (S, D))]
    x, w, g, logits, grad_x, grad_w = cache[S]

    def products():
        nd.dot(x, w, transpose_b=True, out=logits)
        nd.dot(g, w, out=grad_x)
        nd.dot(g, x, transpose_a=True, out=grad_w)
    return synced(products)      # all ranks multiply at once, as they do inside a step


def main(argv=None):
    args = parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        raise SystemExit("--warmup and --steps must be at least 1")
    comm.init()
    rank, world = comm.rank(), comm.size()
    ctx = mx.cpu()
    fused = {"auto": None, "fused": True, "mxnet": False}[args.kernels]
    pfc = PartialFC(CombinedMarginLoss.from_name(args.margin), args.embedding_size, args.num_classes,
                    sample_rate=args.sample_rate, ctx=ctx, seed=1234, fused_kernels=fused)
    B, D, N = args.batch_size, args.embedding_size, args.batch_size * world
    if rank == 0:
        print(f"[bench_head] {world} ranks, {args.num_classes} classes, rate {args.sample_rate}, "
              f"D={D}, batch {B}/rank ({N} global), {pfc.ops.name} kernels", flush=True)
    rng = np.random.default_rng(100 + rank)
    head, floor, cache = [], [], {}
    steps = range(args.warmup + args.steps)
    for step in tqdm(steps, desc="steps", disable=rank != 0, file=sys.stdout):
        x = nd.array(rng.normal(size=(B, D)).astype(np.float32), ctx=ctx)
        y = rng.integers(0, args.num_classes, size=B)
        elapsed = synced(lambda: pfc.forward_backward(x, y))
        if step < args.warmup:
            # The head's own peak: taken before the floor's operands exist.
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
            continue
        head.append(elapsed)
        floor.append(time_matmuls(N, pfc.sampled_index.shape[0], D, ctx, cache))
    mine = [float(np.median(head)), float(np.median(floor)), peak_mb, pfc.num_sample, pfc.bank.num_local]
    table = comm.gather_rows(mine)
    if rank != 0:
        return
    step_s = max(row[0] for row in table)        # the slowest rank sets the pace
    model = head_memory(args.num_classes, world, D, args.sample_rate, B)
    floor_s = max(row[1] for row in table)
    result = {
        "world": world, "num_classes": args.num_classes, "sample_rate": args.sample_rate,
        "embedding_size": D, "batch_per_rank": B, "kernels": pfc.ops.name,
        "step_ms": round(step_s * 1e3, 1), "matmul_ms": round(floor_s * 1e3, 1),
        "ratio": round(step_s / floor_s, 2),
        "samples_per_s": round(N / step_s, 1), "samples_per_s_per_rank": round(B / step_s, 1),
        "peak_rss_mb": [round(row[2]) for row in table],   # after the warm-up steps, head only
        "bank_mb_per_rank": [round(row[4] * D * 4 * 2 / 2 ** 20) for row in table],
        # mxnet_pfc.plan's prediction of the head's own memory on the largest shard (on a CPU rank
        # the device and the host are one memory)
        "model_head_mb": round((model.total + model.host) / 2 ** 20),
    }
    print("rank  step ms  matmuls ms  ratio  sampled  local centers  peak RSS MB")
    for r, (h, f, mem, ns, nl) in enumerate(table):
        print(f"{r:4d} {h * 1e3:8.1f} {f * 1e3:11.1f} {h / f:6.2f} {int(ns):8d} {int(nl):14d} {mem:12.0f}")
    print(f"[bench_head] the memory model (mxnet_pfc.plan) predicts {result['model_head_mb']} MB for the head "
          f"per rank, on top of the process's own", flush=True)
    print(f"[bench_head] step {result['step_ms']} ms (matmuls alone {result['matmul_ms']} ms, "
          f"ratio {result['ratio']}), {result['samples_per_s']} samples/s "
          f"({result['samples_per_s_per_rank']} per rank)", flush=True)
    if args.json:
        append_json(args.json, result)


if __name__ == "__main__":
    main()
