#!/usr/bin/env bash
# The table "Each loss trained on the synthetic default" of docs/benchmarks.md: the synthetic default of `make run`
# (500 identities x 32 images, r18-lite, global batch 64, 250 steps) trained through config.sh on NP = 2
# local ranks once per loss, one run after another, each loss at its published parameters. The losses are
# those of mxnet_pfc.head.margin.LOSSES but the combined-margin ones (a loss added there joins by itself),
# after cosface-small, the set's own loss, as the reference; LOSS_NAMES="a b" picks some. Options given
# here are added to every run (e.g. --margin_s 32).
# Per loss: the exported model's verification accuracy on the set's val.bin (1000 held-out pairs, chance
# 0.5), the loss at the first and last step (--frequent 1 logs every step) and the run's wall time. The first run
# also verifies the untrained network (--val_at_start; the same network for every loss: one seed).
# About 12-18 minutes on this 2-core machine (80-120 s a run), too long for the test suite;
# tests/test_loss_presets.py trains every loss in a cheaper setting instead.
# The runs share the default's generated set (output/data/synthetic, made by the first run if missing);
# each writes to $ROOT/LOSS (default /tmp/train-losses), removed first, and its output to $ROOT/LOSS.log.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
NP="${NP:-2}"
ROOT="${ROOT:-/tmp/train-losses}"
export PYTHONWARNINGS=ignore::DeprecationWarning
LOSS_NAMES="${LOSS_NAMES:-cosface-small $(.venv/bin/python -c 'from mxnet_pfc.head.margin import LOSSES, CombinedMarginLoss
print(" ".join(name for name, (kind, _) in LOSSES.items() if kind is not CombinedMarginLoss))')}"
mkdir -p "$ROOT"
: > "$ROOT/runs.tsv"
at_start=(--val_at_start true)
for loss in $LOSS_NAMES; do
    rm -rf "${ROOT:?}/$loss"
    echo "$(date +%T) $loss ..."
    started=$(date +%s%N)
    status=0
    .venv/bin/horovodrun --gloo -np "$NP" -H "localhost:$NP" bash config.sh -- \
        --loss "$loss" --output "$ROOT/$loss" --frequent 1 "${at_start[@]}" "$@" > "$ROOT/$loss.log" 2>&1 || status=$?
    at_start=()
    printf '%s\t%s\t%s\n' "$loss" "$(( ($(date +%s%N) - started) / 1000000 ))" "$status" >> "$ROOT/runs.tsv"
done
.venv/bin/python - "$ROOT" "$NP" "$*" <<'PY'
import json, pathlib, sys
root, ranks, extra = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print(f"\n{ranks} ranks, config.sh -- --loss NAME {extra}".rstrip())
print("\n| loss | s | accuracy, last step | loss, first (step) | loss, last (step) | seconds |")
print("|---|---|---|---|---|---|")
untrained = []
for line in open(root / "runs.tsv"):
    loss, seconds, status = line.split()
    try:
        records = [json.loads(r) for r in open(root / loss / "metrics.jsonl")]
    except OSError:
        records = []
    logged = [r for r in records if "loss" in r]
    untrained = untrained or [f"{r['val/val/accuracy']:.3f}" for r in records
                              if r.get("step") == 0 and "val/val/accuracy" in r]
    summary = next((r["summary"] for r in records if "summary" in r), None)
    if status != "0" or summary is None:
        print(f"| {loss} | | failed (exit {status}; {root / loss}.log) | | | {int(seconds) / 1000:.0f} |")
        continue
    accuracy = ", ".join(f"{r['accuracy']:.3f}" for r in summary["verification"].values() if "accuracy" in r)
    cfg = json.loads((root / loss / "config.json").read_text()) if (root / loss / "config.json").exists() else {}
    first, last = logged[0], logged[-1]
    print(f"| {loss} | {cfg.get('margin_s', '')} | {accuracy} | {first['loss']:.2f} ({first['step']}) "
          f"| {last['loss']:.2f} ({last['step']}) | {int(seconds) / 1000:.0f} |")
print(f"\nthe untrained network (step 0 of the first run): {', '.join(untrained) or 'not measured'}")
print(f"(seconds: wall time of horovodrun, start-up and the final verification included; logs in {root})")
PY
