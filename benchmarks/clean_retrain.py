"""Does cleaning pay? ArcFace on a noisy synthetic set, on its cleaned copy, and on the clean ground truth.

    make bench-clean                                   (python benchmarks/clean_retrain.py)
    make bench-clean ARGS="--seeds 0 --steps 300"      (a quicker look)

The recipe of docs/data.md, end to end, through config.sh on --np local ranks (CPU):
1. two synthetic sets of the same identities and seed: one with --noise of its images labelled as
   another identity (planted.json names them), one without (the ground truth); both hold the same
   held-out val.bin (its identities never trained on);
2. a sub-center ArcFace run (K = --subcenter-k) of --steps steps on the noisy set;
3. `python -m mxnet_pfc.clean` of it at each --thresholds angle (default 75, drop.py's, and 65, where the
   angle histogram of this recipe has its valley: docs/data.md): the dropped images scored against
   planted.json (precision, recall), beside what other thresholds would drop;
4. ArcFace runs (one center per class, the same scale and margin) of --steps steps each on (a) the noisy
   set, (b) each cleaned set, (c) the clean set, once per --seeds seed, each verified on the held-out pairs.
It prints a Markdown table: per set its images and identities, the verification accuracy (the median
over the seeds, and each seed's) and the loss of the last step (how well the run fits the set).
Everything is written under --dir (each run removed first). It says first how much disk and time it
needs; the runs are deterministic given a seed, their speed is not. Figures: docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BYTES_PER_IMAGE = 4300          # a synthetic face's JPEG, with the record's header
STEP_SECONDS = 0.45             # a step of 16 images per rank on 2 ranks of this 2-core machine, at load 4-8
RUN_OVERHEAD = 25               # start-up, the final verification and the export of one run, seconds


def horovodrun(np_: int) -> "list[str]":
    return [os.path.join(REPO, ".venv", "bin", "horovodrun"), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}"]


def sh(command: "list[str]", log: str) -> float:
    """Run COMMAND in the repository, its output to LOG; its wall time in s (exits when it fails)."""
    started = time.time()
    with open(log, "w") as f:
        status = subprocess.run([str(c) for c in command], cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if status:
        sys.exit(f"failed (exit {status}): {' '.join(map(str, command))}\n  see {log}")
    return time.time() - started


def generate(args, folder: str, noise: float) -> None:
    """A synthetic set, made again each time (seconds): the same seed makes the same identities."""
    shutil.rmtree(folder, ignore_errors=True)
    command = [sys.executable, "-m", "mxnet_pfc.data.synthetic", "--output", folder, "--identities",
               args.identities, "--images-per-identity", args.images_per_identity, "--val-identities",
               args.val_identities, "--val-pairs", args.val_pairs, "--seed", args.data_seed]
    sh(command + (["--label-noise", noise] if noise else []), folder + ".log")


def train(args, name: str, rec: str, classes: int, val: str, seed: int, loss: "list") -> dict:
    """One run through config.sh; its summary (metrics.jsonl's last line) and wall time."""
    out = os.path.join(args.dir, name)
    shutil.rmtree(out, ignore_errors=True)
    print(f"{time.strftime('%H:%M:%S')} {name} ...", flush=True)
    seconds = sh(horovodrun(args.np) + [
        "bash", "config.sh", "--", "--recipe", "synthetic-toy", "--dataset", "synthetic", "--rec", rec,
        "--val_targets", val, "--num_classes", classes, "--synthetic_identities", 0, "--batch_size", args.batch_size,
        "--max_update", args.steps, "--margin_s", args.margin_s, "--margin_m2", args.margin_m2, "--seed", seed,
        "--frequent", 50, "--verbose", 100000, "--output", out, *loss], out + ".log")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        summary = [json.loads(line) for line in f][-1]["summary"]
    return {"seconds": seconds, "accuracy": summary["verification"]["val"]["accuracy"], "loss": summary["final_loss"]}


def scores(out: str, planted: str, thresholds) -> dict:
    """Precision and recall of the dropped images against the planted noise, at each threshold."""
    noise = {case["key"] for case in json.load(open(planted))["noise"]}
    verdicts = [np.load(path) for path in sorted(glob.glob(os.path.join(out, ".work", "verdicts-*.npz")))]
    keys = np.concatenate([v["keys"] for v in verdicts])
    angles = np.concatenate([v["angles"] for v in verdicts])
    noisy = np.array([int(k) in noise for k in keys])
    found = {}
    for threshold in thresholds:
        dropped = angles > threshold
        hits = int((dropped & noisy).sum())
        found[threshold] = {"precision": hits / max(1, int(dropped.sum())), "recall": hits / max(1, int(noisy.sum())),
                            "dropped": int(dropped.sum())}
    return found


def images_and_classes(folder: str) -> "tuple[int, int]":
    with open(os.path.join(folder, "property")) as f:
        classes = int(f.read().split(",")[0])
    with open(os.path.join(folder, "train.idx")) as f:
        records = sum(1 for _ in f)
    return records - 1 - classes, classes          # the index holds the header and one record per class too


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/clean_retrain.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=os.path.join(REPO, "output", "bench-clean"),
                        help="where the sets and runs are written (default: %(default)s)")
    parser.add_argument("--identities", type=int, default=50, help="identities of the sets (default 50)")
    parser.add_argument("--images-per-identity", type=int, default=24, help="images of each (default 24)")
    parser.add_argument("--val-identities", type=int, default=250, help="held-out identities (default 250)")
    parser.add_argument("--val-pairs", type=int, default=1000, help="held-out verification pairs (default 1000)")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of both sets (default 0)")
    parser.add_argument("--noise", type=float, default=0.2, help="share of images mislabelled (default 0.2)")
    parser.add_argument("--steps", type=int, default=400, help="steps of every run (default 400)")
    parser.add_argument("--batch-size", type=int, default=16, help="images per rank per step (default 16)")
    parser.add_argument("--margin-s", type=float, default=32.0, help="scale of every run (default 32)")
    parser.add_argument("--margin-m2", type=float, default=0.35, help="angular margin of every run (default 0.35)")
    parser.add_argument("--subcenter-k", type=int, default=3, help="sub-centers per class of the first run (default 3)")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[75.0, 65.0],
                        help="the cleanings' thresholds, degrees: a cleaned set each (default 75 65)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="training seeds (default 0 1 2)")
    parser.add_argument("--np", type=int, default=2, help="local ranks (default 2)")
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "results", "clean_retrain.jsonl"),
                        help="the figures appended here, one JSON line a run (default: %(default)s)")
    args = parser.parse_args(argv)
    args.dir = os.path.abspath(args.dir)
    images = args.identities * args.images_per_identity
    sets = 2 + len(args.thresholds)
    runs = 1 + sets * len(args.seeds)
    disk = sets * images * BYTES_PER_IMAGE + 2 * args.val_pairs * BYTES_PER_IMAGE
    minutes = runs * (args.steps * STEP_SECONDS + RUN_OVERHEAD) / 60
    print(f"needs about {disk / 1e6:.0f} MB in {args.dir} ({sets} sets of up to {images:,} images, two val.bin) and "
          f"about {minutes:.0f} minutes on 2 busy cores ({runs} runs of {args.steps} steps, {args.np} ranks, "
          f"batch {args.batch_size} per rank)", flush=True)
    os.makedirs(args.dir, exist_ok=True)
    started = time.time()
    noisy, clean = os.path.join(args.dir, "noisy"), os.path.join(args.dir, "clean")
    generate(args, noisy, args.noise)
    generate(args, clean, 0.0)
    margin = ["--margin_m1", 1.0, "--margin_m3", 0.0]
    val = os.path.join(noisy, "val.bin")               # the same held-out pairs in both sets (seed + 1000003)
    sub = train(args, "subcenter", os.path.join(noisy, "train.rec"), args.identities, val, args.seeds[0],
                ["--loss", "subcenter-arcface", "--subcenter_k", args.subcenter_k, *margin])
    sets, cleaning = {"noisy": noisy}, {}
    for threshold in args.thresholds:
        cleaned = os.path.join(args.dir, f"cleaned-{threshold:g}")
        cleaning[threshold] = sh(horovodrun(args.np) + [
            sys.executable, "-m", "mxnet_pfc.clean", os.path.join(args.dir, "subcenter"), "--rec",
            os.path.join(noisy, "train.rec"), "--out", cleaned, "--threshold", threshold, "--start-over"],
            cleaned + ".log")
        sets[f"cleaned at {threshold:g} degrees"] = cleaned
    sets["clean (ground truth)"] = clean
    found = scores(cleaned, os.path.join(noisy, "planted.json"), sorted({*args.thresholds, *range(55, 90, 5)}))
    accuracy, loss = {name: [] for name in sets}, {name: [] for name in sets}
    for seed in args.seeds:
        for name, folder in sets.items():
            classes = images_and_classes(folder)[1]
            run = f"arcface-{os.path.basename(folder)}-seed{seed}"
            result = train(args, run, os.path.join(folder, "train.rec"), classes, val, seed,
                           ["--loss", "arcface", *margin])
            accuracy[name].append(result["accuracy"])
            loss[name].append(result["loss"])

    print(f"\nsub-center run ({args.subcenter_k} sub-centers, {args.steps} steps): held-out accuracy "
          f"{sub['accuracy']:.3f}; each cleaning {max(cleaning.values()):.0f} s at most ({cleaned}/angles.png: "
          "the angles' histogram)")
    print("\n| threshold (degrees) | dropped | precision | recall |\n|---|---|---|---|")
    for threshold, score in found.items():
        mark = " (cleaned with it)" if threshold in args.thresholds else ""
        print(f"| {threshold:g}{mark} | {score['dropped']} | {score['precision']:.3f} | {score['recall']:.3f} |")
    print(f"\n| ArcFace on | images | identities | accuracy, median of {len(args.seeds)} | per seed | "
          "last step's loss, median |\n|---|---|---|---|---|---|")
    for name, folder in sets.items():
        count, classes = images_and_classes(folder)
        print(f"| {name} | {count:,} | {classes} | {statistics.median(accuracy[name]):.3f} | "
              + ", ".join(f"{a:.3f}" for a in accuracy[name]) + f" | {statistics.median(loss[name]):.2f} |")
    print(f"\n{runs} runs of {args.steps} steps on {args.np} ranks, batch {args.batch_size} per "
          f"rank, r18-lite, s = {args.margin_s:g}, m = {args.margin_m2:g}; {(time.time() - started) / 60:.0f} min; "
          f"load {open('/proc/loadavg').read().split()[0]} at the end, {os.cpu_count()} cores")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "a") as f:
        f.write(json.dumps({"args": vars(args), "subcenter": sub,
                            "scores": {str(k): v for k, v in found.items()}, "accuracy": accuracy,
                            "loss": loss}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
