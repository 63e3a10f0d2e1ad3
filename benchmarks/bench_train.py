"""The trainer's step beside its parts alone, side by side in the same processes, on dummy data.

Run under a launcher, one process per rank, e.g. on this machine's CPU:

    OMP_NUM_THREADS=1 horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python benchmarks/bench_train.py

The trainer's own set-up builds everything (trainer.prepare on a `speed-*`
style configuration: random images, no I/O; trainer.build_distributed: the head
and the module). Each round then times, one after the other:

  step     the trainer's step as Trainer.run takes it: next(data), then
           PartialFCModule.step (backbone forward, head with its three
           collectives and the centers' SGD, backward, gradient reduction and
           update)
  timed    the same step with the per-phase timing the trainer does once per
           log window (an engine wait after each phase), and its phase shares
  backbone the backbone alone on the same batch: forward, backward of a fixed
           embedding gradient, reduction and update
  head     the head alone: forward_backward on fixed embeddings of the same shape

With --extra-classes (several sets, one head per set: head/set_heads.py) the
step trains every set's head, each over its rows of the batch (split in
proportion to the class counts, as the trainer splits by the sets' sizes), and
`head` is the sum of each set's head measured alone on its rows: the ratio is
then a step with several heads against the backbone plus the heads' own steps
(the issue's goal: at most 1.05).

and prints medians over the rounds (the slowest rank sets the pace), the
step / (backbone + head) ratio (the trainer's own overhead: the goal is at
most 1.1), the cost of a timed step, and what one timed step per window of
`--frequent` steps costs training.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.set_rows import rows_per_set
from mxnet_pfc.head.set_heads import heads_of
from mxnet_pfc.runtime import comm
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import trainer
from mxnet_pfc.training.module import PHASES
from timing import append_json, synced

nd = mx.nd
PARTS = ("step", "timed", "backbone", "head")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--network", default="r18-lite", help="backbone, by name in symbols.NETWORKS (default r18-lite)")
    p.add_argument("--num-classes", type=int, default=100_000, help="identities in all (default 100000)")
    p.add_argument("--extra-classes", type=lambda text: [int(float(v)) for v in text.split(",")], default=[],
                   help="several sets: the class counts of the sets after the first, comma-separated; each set "
                        "trains its own head (default: one set)")
    p.add_argument("--sample-rate", type=float, default=0.1,
                   help="share of each rank's centers sampled per step (default 0.1)")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank per micro-batch (default 32)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--rounds", type=int, default=8, help="measured rounds of the four timings (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="rounds run before measuring (default 2)")
    p.add_argument("--frequent", type=int, default=50,
                   help="log window in steps, for the cost of one timed step per window (default 50)")
    p.add_argument("--json", type=Path, help="append the result as one JSON line to this file (default: print only)")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.warmup < 1 or args.rounds < 1:
        raise SystemExit("--warmup and --rounds must be at least 1")
    cfg = config_lib.make_config(dict(
        dataset="speed-1m", network=args.network, num_classes=args.num_classes, sample_rate=args.sample_rate,
        batch_size=args.batch_size, grad_accum=args.grad_accum, num_images=1_000_000, max_update=10_000,
        context="cpu", output="/tmp/bench_train-unused"))
    comm.init()
    rank, world = comm.rank(), comm.size()
    setup = trainer.prepare(cfg, RunFolder(cfg.output), rank, world)
    K, B = args.grad_accum, args.batch_size
    classes = [args.num_classes, *args.extra_classes]
    rows = rows_per_set(B, classes) if args.extra_classes else [B]
    built = dataclasses.replace(setup.cfg, extra_classes=tuple(args.extra_classes))     # the trainer's heads
    head, module = trainer.build_distributed(built, setup.ctx, setup.schedule, setup.symbol, None,
                                             rows if args.extra_classes else None)
    heads = heads_of(head)
    data, lr = setup.data, setup.schedule(0)
    embedding_grad = nd.random.normal(0, 1e-3, shape=(B, cfg.embedding_size), ctx=setup.ctx)
    embeddings = [nd.random.normal(shape=(n, cfg.embedding_size), ctx=setup.ctx) for n in rows]
    draw = np.random.default_rng(rank)
    # every micro-batch: each set's rows in set order, its own class ids (SetsIter's layout)
    set_labels = [draw.integers(0, n, (K, r)) for n, r in zip(classes, rows)]
    labels = np.concatenate([part[k] for k in range(K) for part in set_labels])
    if rank == 0:
        print(f"[bench_train] {world} ranks, {args.network}, {' + '.join(map(str, classes))} classes "
              f"({len(classes)} head(s), rows {' + '.join(map(str, rows))}), rate {args.sample_rate}, batch {B}/rank "
              f"x {K} micro-batches, {heads[0].ops.name} kernels, {setup.ctx}", flush=True)

    def trainer_step(phases=None):
        batch = next(data)
        module.step(batch.data, labels if args.extra_classes else batch.labels, lr, phases)

    def backbone_alone():
        batch = next(data)
        for k in range(K):
            module.module.forward(mx.io.DataBatch([batch.data[k * B:(k + 1) * B]]), is_train=True)
            module.module.backward(out_grads=[embedding_grad])
        module.module.update()
        module._clear_gradients()

    def head_alone(number):
        for k in range(K):
            heads[number].forward_backward(embeddings[number], set_labels[number][k], K, update=k == K - 1)

    seconds = {part: [] for part in PARTS}
    phase_seconds = {name: [] for name in PHASES}
    for round_ in tqdm(range(args.warmup + args.rounds), desc="rounds", disable=rank != 0, file=sys.stdout):
        phases = {}
        measured = dict(step=synced(trainer_step), timed=synced(lambda: trainer_step(phases)),
                        backbone=synced(backbone_alone),
                        head=sum(synced(lambda: head_alone(number)) for number in range(len(heads))))
        if round_ < args.warmup:
            continue
        for part, value in measured.items():
            seconds[part].append(value)
        for name in PHASES:
            phase_seconds[name].append(phases[name])
    mine = [float(np.median(seconds[part])) for part in PARTS] + \
           [float(np.median(phase_seconds[name])) for name in PHASES]
    table = comm.gather_rows(mine)
    data.close()
    if rank != 0:
        return
    slowest = np.max(np.array(table), axis=0)       # the slowest rank sets the pace
    median = dict(zip(PARTS, slowest[:len(PARTS)]))
    phases = dict(zip(PHASES, slowest[len(PARTS):]))
    parts = median["backbone"] + median["head"]
    timed_cost = median["timed"] / median["step"] - 1
    result = {
        "world": world, "network": args.network, "num_classes": args.num_classes, "sample_rate": args.sample_rate,
        "extra_classes": args.extra_classes, "rows": rows,
        "batch_per_rank": B, "grad_accum": K, "kernels": heads[0].ops.name,
        **{f"{part}_ms": round(value * 1e3, 1) for part, value in median.items()},
        "step_over_parts": round(median["step"] / parts, 3),
        "timed_step_cost": round(timed_cost, 3),
        "timing_cost_per_window": round(timed_cost / args.frequent, 4),
        "phase_shares": {name: round(value / sum(phases.values()), 3) for name, value in phases.items()},
        "samples_per_s": round(B * K * world / median["step"], 1),
    }
    print("rank  step ms  timed ms  backbone ms  head ms  step/(backbone+head)")
    for r, row in enumerate(table):
        print(f"{r:4d} {row[0] * 1e3:8.1f} {row[1] * 1e3:9.1f} {row[2] * 1e3:12.1f} {row[3] * 1e3:8.1f} "
              f"{row[0] / (row[2] + row[3]):21.3f}")
    shares = ", ".join(f"{name} {share:.0%}" for name, share in result["phase_shares"].items())
    print(f"[bench_train] step {result['step_ms']} ms = {result['step_over_parts']} x its parts alone "
          f"(backbone {result['backbone_ms']} ms + head {result['head_ms']} ms); {result['samples_per_s']} samples/s")
    print(f"[bench_train] a timed step costs {timed_cost:+.1%}; one per {args.frequent} steps: "
          f"{result['timing_cost_per_window']:+.2%} of training; phases of the timed step: {shares}", flush=True)
    if args.json:
        append_json(args.json, result)


if __name__ == "__main__":
    main()
