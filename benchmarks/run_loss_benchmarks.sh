#!/usr/bin/env bash
# The loss axis of docs/benchmarks.md ("Margin losses"): each margin loss's head step against
# ArcFace's, side by side in the same processes (bench_head.py --versus arcface), at 100k and
# 1M classes, sample rates 1.0 and 0.1, embedding 512, batch 64 per rank, 2 ranks on this
# machine's CPU (one thread each). The losses are those of mxnet_pfc.head.margin.LOSSES whose
# class is not CombinedMarginLoss itself (ArcFace, CosFace and their mixes: one class, one cost);
# a loss added there joins by itself (LOSS_NAMES="a b" picks some). Results go to
# benchmarks/results/losses.jsonl (rewritten) and print as a table. 17 minutes here beside
# others' jobs (load ~6 on the 2 cores); 31 minutes at load 7-10.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NP="${NP:-2}"
STEPS="${STEPS:-8}"
OUT=benchmarks/results/losses.jsonl
mkdir -p benchmarks/results
: > "$OUT"
export OMP_NUM_THREADS=1 MXNET_OMP_MAX_THREADS=1
LOSS_NAMES="${LOSS_NAMES:-$(.venv/bin/python -c 'from mxnet_pfc.head.margin import LOSSES, CombinedMarginLoss
print(" ".join(name for name, (kind, _) in LOSSES.items() if kind is not CombinedMarginLoss))')}"
for classes in 100000 1000000; do
    for rate in 1.0 0.1; do
        # Twice the steps where a step is short, half (at least 3) where it takes seconds.
        steps="$STEPS"
        [ "$rate" = 0.1 ] && steps=$(( STEPS * 2 ))
        [ "$classes" = 1000000 ] && [ "$rate" = 1.0 ] && steps=$(( STEPS / 2 > 3 ? STEPS / 2 : 3 ))
        # shellcheck disable=SC2086  # one argument per loss
        .venv/bin/horovodrun --gloo -np "$NP" -H "localhost:$NP" .venv/bin/python benchmarks/bench_head.py \
            --num-classes "$classes" --sample-rate "$rate" --steps "$steps" --versus arcface \
            --margin $LOSS_NAMES --json "$OUT" "$@" \
            | grep -v -i "warning\|lazy_update\|setattr\|_float_to_str"
    done
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
base = rows[0]["versus"] if rows else "arcface"
parts = next((list(r["loss_parts_ms"]) for r in rows if "loss_parts_ms" in r), [])
print(f"\n| loss | classes | rate | {base} ms | loss ms | ratio | per step | floor ms | / floor | "
      + " | ".join(f"{p.replace('_', ' ')}" for p in parts) + " |")
print("|---" * (9 + len(parts)) + "|")
order = list(dict.fromkeys(r["loss"] for r in rows))      # margin.LOSSES's order
for r in sorted(rows, key=lambda r: (order.index(r["loss"]), r["num_classes"], -r["sample_rate"])):
    head = f"| {r['loss']} | {r['num_classes']:,} | {r['sample_rate']} |"
    if "skipped" in r:
        print(f"{head} skipped: {r['skipped']} |" + " |" * (5 + len(parts)))
        continue
    deltas = " | ".join(f"{r['loss_parts_ms'][p] - r['versus_parts_ms'][p]:+.1f}" for p in parts)
    print(f"{head} {r['versus_ms']} | {r['loss_ms']} | {r['ratio']:.2f} | {r['ratio_paired']:.2f} | "
          f"{r['floor_ms']} | {r['ratio_floor']:.2f} | {deltas} |")
print(f"\n(ratio: of the medians; per step: the median of each step's ratio; floor: the loss head's three matrix "
      f"products alone, with its rows (K per class), timed in the same steps; the parts: the loss's head's median "
      f"less {base}'s, ms; benchmarks/bench_head.py says what each is)")
PY
