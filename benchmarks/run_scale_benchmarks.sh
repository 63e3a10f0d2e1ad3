#!/usr/bin/env bash
# The 10^7-identity figures of docs/benchmarks.md: the head with 10M classes, embedding 128
# (10M x 512 float32 centers + momentum are 41 GB, more than this machine's
# 24 GiB), sample rates 0.01 and 0.1, batch 64 per rank, 2 ranks, one thread
# each. A 1,000-class run first gives the process's own memory (MXNet, Horovod,
# buffers), so that peak RSS - baseline can be set against mxnet_pfc.plan.
# Results append to benchmarks/results/scale.jsonl and print as a table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NP="${NP:-2}"
OUT=benchmarks/results/scale.jsonl
mkdir -p benchmarks/results
: > "$OUT"
export OMP_NUM_THREADS=1 MXNET_OMP_MAX_THREADS=1
run() {
    .venv/bin/horovodrun --gloo -np "$NP" -H "localhost:$NP" .venv/bin/python benchmarks/bench_head.py \
        --embedding-size 128 --batch-size 64 --json "$OUT" "$@" | grep -v -i "warning\|lazy_update"
}
run --num-classes 1000 --sample-rate 1.0 --steps 8
for rate in 0.01 0.1; do
    run --num-classes 10000000 --sample-rate "$rate" --steps "${STEPS:-6}"
done
.venv/bin/python - "$OUT" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
base = max(rows[0]["peak_rss_mb"])
print(f"\nprocess baseline (1,000 classes): {base} MB peak RSS per rank")
print("| classes | rate | step ms | 3 matmuls alone ms | samples/s (total) | peak RSS/rank MB | "
      "RSS - baseline MB | model's head MB | model / measured |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows[1:]:
    peak = max(r["peak_rss_mb"])
    print(f"| {r['num_classes']:,} | {r['sample_rate']} | {r['step_ms']} | {r['matmul_ms']} | {r['samples_per_s']} | "
          f"{peak} | {peak - base} | {r['model_head_mb']} | {r['model_head_mb'] / (peak - base):.3f} |")
PY
