"""Speed and memory of the Partial FC head alone, on synthetic embeddings.

Run under a launcher, one process per rank, e.g. on this machine's CPU:

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python benchmarks/bench_head.py \\
        --num-classes 1000000 --sample-rate 0.1

Every step is timed twice, side by side in the same processes: the head
(forward_backward: allgather, sampling, logits, softmax, gradients, SGD of the
centers) and then its three matrix products alone (logits, embedding gradient,
center gradient) with the same shapes (K rows per sampled class for
sub-center ArcFace): the floor no head can beat. Reported:
medians over the measured steps, their ratio, samples/s, and peak resident
memory per rank.

With --versus LOSS (the loss axis of `make bench`), each loss of --margin (one
or more names of margin.LOSSES) is timed against a head with LOSS instead of
against the products. Two PartialFC heads, built with the same classes, rate
and seed (so the same initial centers), take turns at every step (which goes
first alternates), on the same embeddings and labels, each drawing the same
negatives (MXNet's generators are seeded from the step before each head's
call). Each head has its own memory bank: at 1M classes x 512 on 2 ranks that is
2 x 2 GB per rank, about 9 GB of this machine's 24. The losses of --margin run
one after the other in the same processes, each in a fresh head, against the
same LOSS head; a loss whose head would not fit beside it (the planner's bytes,
mxnet_pfc.plan, for every rank on this host, against the memory the kernel can
still give, with slack) is skipped and said so. Reported per loss: both heads'
median step, the ratio loss / LOSS of the medians and the median of each
step's own ratio (the two heads ran back to back, so a load that changes
slowly, such as others' jobs on the machine, cancels out of it), the loss
head's own floor (its three products with its rows, K per class for
sub-center ArcFace, timed after the two heads in every step) and the ratio
to it, and the
medians of the step's parts, timed inside both heads in every step (wrappers
on the head's objects; its code is unchanged):

  logits          MemoryBank.logits: cos * |w| against the sampled rows
  subcenters      sub-center ArcFace's pooling of the K rows' cosines and the
                  routing of each class's gradient to its winning row (its
                  K-fold logits are in "logits")
  hard_negatives  PartialFC._hard_negatives: CurricularFace's collective
                  "pfc.target_cos" and its host round-trip
  kernels         ops.scale_lse + ops.softmax_grad (where CurricularFace
                  modulates the hard negatives)
  softmax         partial_fc.global_softmax: the host's float64 margin,
                  log-sum-exp and loss (AdaFace's, ElasticFace's and MagFace's
                  own work)
  centers         MemoryBank.backward: the embeddings' gradient and the SGD of
                  the sampled rows
  rest            the step less the parts: the three collectives of every
                  loss, the input exchange, sampling, the embeddings' final
                  gradient

Every timer but softmax's (host work only) waits for MXNet's engine
(mx.nd.waitall) before and after its call, at points where the step waits for
that work soon anyway; both heads carry the same timers, so the ratio compares
like with like. A part's time excludes the timed parts inside it.
"""
from __future__ import annotations

import argparse
import gc
import resource
import sys
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from tqdm import tqdm

from mxnet_pfc import PartialFC
from mxnet_pfc.head import margin, partial_fc
from mxnet_pfc.head.memory_model import head_memory
from mxnet_pfc.runtime import comm, seeding
from timing import append_json, synced

nd = mx.nd
SEED = 1234
# The parts of a step timed with --versus, in the step's order (the module's docstring says what each is).
PARTS = ("logits", "subcenters", "hard_negatives", "kernels", "softmax", "centers")
REPORTED = PARTS + ("rest",)


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
    p.add_argument("--margin", nargs="+", default=["arcface"], choices=list(margin.LOSSES), metavar="LOSS",
                   help="loss of the head, from margin.LOSSES (default arcface); with --versus, one or more, "
                        f"timed one after the other. Choices: {', '.join(margin.LOSSES)}")
    p.add_argument("--versus", choices=list(margin.LOSSES), metavar="LOSS",
                   help="time each --margin loss against a head with this loss (e.g. arcface), side by side, "
                        "instead of against the matrix products")
    p.add_argument("--kernels", default="auto", choices=["auto", "fused", "mxnet"],
                   help="fused C++ CPU kernels, MXNet ops, or auto (fused where available; the default)")
    p.add_argument("--json", type=Path,
                   help="append the result as one JSON line (one per loss with --versus) to this file "
                        "(default: print only)")
    args = p.parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        p.error("--warmup and --steps must be at least 1")
    if args.versus is None and len(args.margin) > 1:
        p.error("several --margin losses need --versus")
    return args


def make_head(args, loss: str) -> PartialFC:
    """A head with loss `loss`; every head of a run gets the same seed, hence the same initial centers."""
    fused = {"auto": None, "fused": True, "mxnet": False}[args.kernels]
    return PartialFC(margin.make_margin(loss), args.embedding_size, args.num_classes,
                     sample_rate=args.sample_rate, ctx=mx.cpu(), seed=SEED, fused_kernels=fused)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


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


def sampled_rows(pfc: PartialFC) -> int:
    """The bank rows the last step multiplied: K per sampled class (K = 1 but for sub-center ArcFace)."""
    return pfc.sampled_index.shape[0] * pfc.bank.subcenters


def versus_matmuls(args, rank, world):
    """The default mode: the head's step against its three matrix products alone."""
    ctx = mx.cpu()
    pfc = make_head(args, args.margin[0])
    B, D, N = args.batch_size, args.embedding_size, args.batch_size * world
    if rank == 0:
        print(f"[bench_head] {world} ranks, {args.num_classes} classes, rate {args.sample_rate}, "
              f"D={D}, batch {B}/rank ({N} global), {args.margin[0]}, {pfc.ops.name} kernels", flush=True)
    rng = np.random.default_rng(100 + rank)
    head, floor, cache = [], [], {}
    steps = range(args.warmup + args.steps)
    for step in tqdm(steps, desc="steps", disable=rank != 0, file=sys.stdout):
        x = nd.array(rng.normal(size=(B, D)).astype(np.float32), ctx=ctx)
        y = rng.integers(0, args.num_classes, size=B)
        elapsed = synced(lambda: pfc.forward_backward(x, y))
        if step < args.warmup:
            # The head's own peak: taken before the floor's operands exist.
            peak_mb = peak_rss_mb()
            continue
        head.append(elapsed)
        floor.append(time_matmuls(N, sampled_rows(pfc), D, ctx, cache))
    mine = [float(np.median(head)), float(np.median(floor)), peak_mb, pfc.num_sample, pfc.bank.num_local]
    table = comm.gather_rows(mine)
    if rank != 0:
        return
    step_s = max(row[0] for row in table)        # the slowest rank sets the pace
    model = head_memory(args.num_classes, world, D, args.sample_rate, B)
    floor_s = max(row[1] for row in table)
    result = {
        "world": world, "num_classes": args.num_classes, "sample_rate": args.sample_rate,
        "embedding_size": D, "batch_per_rank": B, "kernels": pfc.ops.name, "loss": args.margin[0],
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


class PartTimers:
    """Times the parts (PARTS) of a head's step: each wrapped call adds its seconds, less those of the wrapped
    calls inside it, to `current`, the dict of the step being timed."""

    def __init__(self):
        self.current = dict.fromkeys(PARTS, 0.0)
        self.inner = 0.0        # seconds of the timed calls inside the one running
        partial_fc.global_softmax = self.wrap("softmax", partial_fc.global_softmax, sync=False)   # host only

    def wrap(self, part, fn, sync):
        def timed(*args, **kwargs):
            if sync:
                mx.nd.waitall()     # what came before is not this part's
            outer, self.inner = self.inner, 0.0
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            if sync:
                mx.nd.waitall()
            elapsed = time.perf_counter() - start
            self.current[part] += elapsed - self.inner
            self.inner = outer + elapsed
            return out
        return timed

    def instrument(self, pfc: PartialFC) -> PartialFC:
        """Times pfc's parts (its own wrappers: the head's code is unchanged)."""
        wrap = self.wrap
        pfc.bank.logits = wrap("logits", pfc.bank.logits, sync=True)
        pfc._pooled_logits = wrap("subcenters", pfc._pooled_logits, sync=True)
        pfc._subcenter_grad = wrap("subcenters", pfc._subcenter_grad, sync=True)
        pfc._hard_negatives = wrap("hard_negatives", pfc._hard_negatives, sync=True)
        pfc.ops.scale_lse = wrap("kernels", pfc.ops.scale_lse, sync=True)
        pfc.ops.softmax_grad = wrap("kernels", pfc.ops.softmax_grad, sync=True)
        pfc.bank.backward = wrap("centers", pfc.bank.backward, sync=True)
        return pfc

    def step(self, pfc, x, y, rank, step) -> "tuple[float, dict]":
        """(seconds, parts' seconds) of one step of pfc; the negatives drawn depend on (rank, step) only."""
        self.current = dict.fromkeys(PARTS, 0.0)
        seeding.seed_generators(SEED, rank, step)
        return synced(lambda: pfc.forward_backward(x, y)), self.current


def mem_available() -> "float | None":
    """Bytes the kernel can still give without swapping (MemAvailable); None where /proc/meminfo is not."""
    try:
        with open("/proc/meminfo") as f:
            return next(float(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return None


def memory_short(args, loss: str, world: int) -> "str | None":
    """Why a head with `loss` would not fit now (None: it fits, on every rank's word): the planner's bytes for
    its head on each of the `world` ranks, all taken to be on this host, plus 10% and 1 GiB, against MemAvailable."""
    model = head_memory(args.num_classes, world, args.embedding_size, args.sample_rate, args.batch_size,
                        subcenters=margin.make_margin(loss).subcenters)
    need = (model.total + model.host) * world
    available = mem_available()
    table = comm.gather_rows([float(available is None or need * 1.1 + 2 ** 30 <= available), available or 0.0])
    if all(row[0] for row in table):
        return None
    least = min(row[1] for row in table)
    return f"its head needs {need / 2 ** 30:.1f} GiB on {world} ranks, {least / 2 ** 30:.1f} GiB available"


def time_loss(args, timers, base, loss, rank) -> "list[list[float]]":
    """Every rank's medians over args.steps steps of a fresh head with `loss` and `base`, taking turns on the
    same batches: base's step, the loss head's step, base's parts, the loss head's parts (REPORTED), the
    per-step ratio loss / base; then peak RSS MB."""
    B, D = args.batch_size, args.embedding_size
    pfc = timers.instrument(make_head(args, loss))
    rng = np.random.default_rng(100 + rank)      # every loss sees the same batches
    times = {"versus": [], "loss": [], "floor": []}
    parts = {"versus": [], "loss": []}
    cache = {}
    steps = range(args.warmup + args.steps)
    for step in tqdm(steps, desc=loss, disable=rank != 0, file=sys.stdout):
        x = nd.array(rng.normal(size=(B, D)).astype(np.float32), ctx=mx.cpu())
        y = rng.integers(0, args.num_classes, size=B)
        turns = [("versus", base), ("loss", pfc)]
        for key, head in turns[::-1] if step % 2 else turns:
            elapsed, step_parts = timers.step(head, x, y, rank, step)
            if step >= args.warmup:
                times[key].append(elapsed)
                parts[key].append([step_parts[p] for p in PARTS] + [elapsed - sum(step_parts.values())])
        if step >= args.warmup:     # the loss head's own floor: its three products, with its rows (K per class)
            times["floor"].append(time_matmuls(B * comm.size(), sampled_rows(pfc), D, mx.cpu(), cache))
        if step == args.warmup - 1:
            peak_mb = peak_rss_mb()      # the process's high-water mark: both heads, warmed up
    paired = float(np.median(np.divide(times["loss"], times["versus"])))     # per step: the two ran back to back
    cache.clear()
    return comm.gather_rows([float(np.median(times["versus"])), float(np.median(times["loss"])),
                             *np.median(parts["versus"], axis=0), *np.median(parts["loss"], axis=0), paired,
                             float(np.median(times["floor"])), peak_mb])


def versus_loss(args, rank, world):
    """The --versus mode: each --margin loss against a head with loss args.versus, side by side."""
    B, D = args.batch_size, args.embedding_size
    timers = PartTimers()
    base = timers.instrument(make_head(args, args.versus))
    if rank == 0:
        print(f"[bench_head] {world} ranks, {args.num_classes} classes, rate {args.sample_rate}, D={D}, "
              f"batch {B}/rank ({B * world} global), {base.ops.name} kernels: {', '.join(args.margin)} "
              f"against {args.versus}", flush=True)
    rows = []
    for loss in args.margin:
        short = memory_short(args, loss, world)
        if short is None:
            table = time_loss(args, timers, base, loss, rank)
            gc.collect()        # frees the loss's head before the next one's (the timers' wrappers hold it in a cycle)
        if rank != 0:
            continue
        if short is None:
            r = versus_result(args, world, base.ops.name, loss, table)
            print(f"[bench_head] {loss}: {r['loss_ms']} ms against {args.versus}'s {r['versus_ms']} ms, "
                  f"ratio {r['ratio']} (per step {r['ratio_paired']}); its products alone {r['floor_ms']} ms, "
                  f"ratio {r['ratio_floor']}", flush=True)
        else:
            r = {**setting(args, world, base.ops.name), "loss": loss, "versus": args.versus, "skipped": short}
            print(f"[bench_head] {loss}: skipped, {short}", flush=True)
        rows.append(r)
        if args.json:
            append_json(args.json, r)
    if rank != 0:
        return
    print(f"{'loss':18s} {args.versus + ' ms':>14s} {'loss ms':>9s} {'ratio':>6s} {'per step':>8s} "
          f"{'floor ms':>9s} {'/ floor':>7s}   loss - {args.versus}, ms: "
          + "".join(f"{part:>15s}" for part in REPORTED))
    for r in rows:
        if "skipped" in r:
            print(f"{r['loss']:18s} skipped: {r['skipped']}")
            continue
        deltas = "".join(f"{r['loss_parts_ms'][p] - r['versus_parts_ms'][p]:+15.1f}" for p in REPORTED)
        print(f"{r['loss']:18s} {r['versus_ms']:14.1f} {r['loss_ms']:9.1f} {r['ratio']:6.3f} "
              f"{r['ratio_paired']:8.3f} {r['floor_ms']:9.1f} {r['ratio_floor']:7.3f}{' ' * 24}{deltas}")
    peaks = [max(r["peak_rss_mb"]) for r in rows if "skipped" not in r]
    if peaks:
        print(f"[bench_head] medians of {args.steps} steps, the slower rank's; peak RSS per rank {max(peaks)} MB "
              "(both heads)", flush=True)


def setting(args, world, kernels) -> dict:
    """What a JSON record says of the run's setting."""
    return {"world": world, "num_classes": args.num_classes, "sample_rate": args.sample_rate,
            "embedding_size": args.embedding_size, "batch_per_rank": args.batch_size, "kernels": kernels,
            "steps": args.steps}


def versus_result(args, world, kernels, loss, table) -> dict:
    """The JSON record of one loss from every rank's medians (the slowest rank's, as the step waits for it)."""
    k = len(REPORTED)
    slowest = np.max(np.array(table)[:, :-1], axis=0)
    versus_s, loss_s = slowest[0], slowest[1]
    return {
        **setting(args, world, kernels), "loss": loss, "versus": args.versus,
        "versus_ms": round(versus_s * 1e3, 1), "loss_ms": round(loss_s * 1e3, 1),
        "ratio": round(loss_s / versus_s, 3),
        "ratio_paired": round(slowest[2 + 2 * k], 3),
        "floor_ms": round(slowest[3 + 2 * k] * 1e3, 1), "ratio_floor": round(loss_s / slowest[3 + 2 * k], 3),
        "versus_parts_ms": {p: round(v * 1e3, 2) for p, v in zip(REPORTED, slowest[2:2 + k])},
        "loss_parts_ms": {p: round(v * 1e3, 2) for p, v in zip(REPORTED, slowest[2 + k:2 + 2 * k])},
        "peak_rss_mb": [round(row[-1]) for row in table],
    }


def main(argv=None):
    args = parse_args(argv)
    comm.init()
    if args.versus is None:
        versus_matmuls(args, comm.rank(), comm.size())
    else:
        versus_loss(args, comm.rank(), comm.size())


if __name__ == "__main__":
    main()
