#!/usr/bin/env bash
# Fine-tuning a trained model and distilling it into a smaller student, through config.sh on NP = 2 local ranks.
# Model A is the synthetic default of `make run` (500 identities x 32 images, r18-lite 128-d, cosface-small,
# 250 steps), trained once into $OUT/a and kept (delete it to train it again). Set B is another synthetic set:
# 200 identities x 16 images drawn with seed 7 (other identities than A's seed 0), 1000 held-out val pairs.
# On B, each run STEPS steps (default 60), seed SEED (default 0), from the same options:
#   fine-tune   scratch, pretrained (A, random centers), imprint (A, --init_centers imprint), freeze
#               (A, --freeze_backbone_steps FREEZE, default 20), imprint+freeze;
#   distillation a 64-d student from scratch with --teacher A --distill_weight WEIGHT (default 10), and the
#               same student without a teacher.
# Options given here are added to every run on B. Every run verifies B's val.bin before its first step
# (--val_at_start) and at its end, and logs every step (--frequent 1); `python -m mxnet_pfc.verify` of A on
# the same val.bin is the check that --pretrained loads A exactly (it equals run pretrained's step 0).
# benchmarks/fine_tune_table.py prints the tables from the runs' metrics.jsonl; they are also written to
# benchmarks/results/fine_tune.md (rewritten). Each run writes $OUT/RUN (removed first) and $OUT/RUN.log.
# About 6 minutes on this 2-core machine at load 4-6 (A's run 1m45s of it, then 35-60 s a run); the runs are
# deterministic (a second invocation gave the same losses and accuracies), their speed is not.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NP="${NP:-2}"
OUT="${OUT:-/tmp/fine-tune}"
STEPS="${STEPS:-60}"
FREEZE="${FREEZE:-20}"
WEIGHT="${WEIGHT:-10}"
SEED="${SEED:-0}"
RESULTS=benchmarks/results/fine_tune.md
export PYTHONWARNINGS=ignore::DeprecationWarning
mkdir -p "$OUT" benchmarks/results
: > "$OUT/runs.tsv"
echo "$(date '+%F %T') load $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores" > "$OUT/started"

train() {       # train NAME OPTION... : one run through config.sh; its wall time, exit status and load to runs.tsv
    local name="$1" started status=0
    shift
    rm -rf "${OUT:?}/$name"
    echo "$(date +%T) $name ..."
    started=$(date +%s%N)
    .venv/bin/horovodrun --gloo -np "$NP" -H "localhost:$NP" bash config.sh -- \
        --output "$OUT/$name" "$@" > "$OUT/$name.log" 2>&1 || status=$?
    printf '%s\t%s\t%s\t%s\n' "$name" "$(( ($(date +%s%N) - started) / 1000000 ))" "$status" \
        "$(cut -d' ' -f1 /proc/loadavg)" >> "$OUT/runs.tsv"
    [ "$status" = 0 ] || echo "  $name failed (exit $status): $OUT/$name.log"
}

if [ ! -f "$OUT/a/model-0000.params" ]; then
    train a
else
    echo "model A: $OUT/a (kept)"
fi
if [ ! -f "$OUT/data-b/COMPLETE" ]; then
    rm -rf "${OUT:?}/data-b"
    .venv/bin/python -m mxnet_pfc.data.synthetic --output "$OUT/data-b" --identities 200 \
        --images-per-identity 16 --val-pairs 1000 --seed 7
fi
.venv/bin/python -m mxnet_pfc.verify "$OUT/a" "$OUT/data-b/val.bin" --json "$OUT/a-on-b.json" \
    > "$OUT/a-on-b.log" 2>&1 || echo "verify of A on B failed: $OUT/a-on-b.log"

on_b=(--recipe synthetic-toy --dataset synthetic --rec "$OUT/data-b/train.rec" --val_targets "$OUT/data-b/val.bin"
      --val_at_start true --frequent 1 --verbose 1000 --max_update "$STEPS" --seed "$SEED" "$@")
train scratch "${on_b[@]}"
train pretrained "${on_b[@]}" --pretrained "$OUT/a"
train imprint "${on_b[@]}" --pretrained "$OUT/a" --init_centers imprint
train freeze "${on_b[@]}" --pretrained "$OUT/a" --freeze_backbone_steps "$FREEZE"
train imprint+freeze "${on_b[@]}" --pretrained "$OUT/a" --init_centers imprint --freeze_backbone_steps "$FREEZE"
train student+teacher "${on_b[@]}" --embedding_size 64 --teacher "$OUT/a" --distill_weight "$WEIGHT"
train student "${on_b[@]}" --embedding_size 64

.venv/bin/python benchmarks/fine_tune_table.py "$OUT" --np "$NP" --extra "$*" \
    --fine-tune scratch pretrained imprint freeze imprint+freeze --distill student+teacher student | tee "$RESULTS"
