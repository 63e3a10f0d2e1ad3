#!/usr/bin/env bash
# The head figures of docs/benchmarks.md: 100k and 1M classes, sample rates 1.0 and 0.1,
# embedding 512, batch 64 per rank, 2 ranks on this machine's CPU (one thread
# each). Results append to benchmarks/results/head.jsonl and print as a table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NP="${NP:-2}"
STEPS="${STEPS:-8}"
OUT=benchmarks/results/head.jsonl
mkdir -p benchmarks/results
: > "$OUT"
export OMP_NUM_THREADS=1 MXNET_OMP_MAX_THREADS=1
for classes in 100000 1000000; do
    for rate in 1.0 0.1; do
        steps="$STEPS"
        [ "$classes" = 1000000 ] && [ "$rate" = 1.0 ] && steps=$(( STEPS / 2 > 3 ? STEPS / 2 : 3 ))
        .venv/bin/horovodrun --gloo -np "$NP" -H "localhost:$NP" .venv/bin/python benchmarks/bench_head.py \
            --num-classes "$classes" --sample-rate "$rate" --steps "$steps" --json "$OUT" "$@" \
            | grep -v -i "warning\|lazy_update"
    done
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print("\n| classes | rate | step ms | 3 matmuls alone ms | ratio | samples/s (total) | peak RSS/rank MB |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['num_classes']:,} | {r['sample_rate']} | {r['step_ms']} | {r['matmul_ms']} | "
          f"{r['ratio']} | {r['samples_per_s']} | {max(r['peak_rss_mb'])} |")
PY
