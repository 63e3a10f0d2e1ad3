"""The tables of benchmarks/fine_tune.sh, from the runs it leaves in its output folder.

    python benchmarks/fine_tune_table.py OUT --fine-tune RUN... --distill RUN... [--extra '...']

OUT holds runs.tsv (run, wall ms, exit status, 1-minute load at its end), started (date and load),
a-on-b.json (`python -m mxnet_pfc.verify --json` of model A on B's val.bin) and one folder per run
with its config.json and metrics.jsonl. What each run was given is read from its config.json, so the
tables say what ran, not what the script meant to run. Markdown on stdout.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics

# Options of issue 25 that tell the runs apart, as config.json names them, and their value when not given.
OPTIONS = {"pretrained": "", "init_centers": "random", "freeze_backbone_steps": 0, "teacher": "",
           "distill_weight": None, "embedding_size": None}


def read_records(run: pathlib.Path) -> "list[dict]":
    try:
        return [json.loads(line) for line in open(run / "metrics.jsonl")]
    except OSError:
        return []


def val_key(config: dict) -> str:
    """The metrics key of the run's verification accuracy: sets are named by their file's stem."""
    target = pathlib.Path(config["val_targets"][0]).stem
    return f"val/{target}/accuracy"


def options_of(config: dict, root: pathlib.Path, model_a: dict) -> str:
    """The run's options of issue 25, paths under OUT shortened to their folder name."""
    words = []
    for name, unset in OPTIONS.items():
        value = config.get(name)
        if name == "distill_weight" and not config.get("teacher"):
            continue
        if name == "embedding_size" and value == model_a.get("embedding_size"):
            continue
        if value == unset or value is None:
            continue
        if isinstance(value, str) and value.startswith(str(root) + "/"):
            value = value[len(str(root)) + 1:]
        words.append(f"--{name} {value}")
    return " ".join(words) or "(none: from scratch)"


def fmt(value, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def summarise(root: pathlib.Path, name: str, steps: int) -> dict:
    """One run's figures from its metrics.jsonl."""
    run = root / name
    config = json.loads((run / "config.json").read_text()) if (run / "config.json").exists() else {}
    records = read_records(run)
    logged = [r for r in records if "loss" in r]
    key = val_key(config) if config.get("val_targets") else ""
    checked = {r["step"]: r[key] for r in records if key in r}
    cosines = [r["distill/cosine"] for r in logged if "distill/cosine" in r]
    teacher = [r["phase/teacher"] for r in logged if "phase/teacher" in r]
    rates = [r["samples_per_sec_per_rank"] for r in logged if "samples_per_sec_per_rank" in r]
    return dict(
        config=config, complete=bool(logged) and logged[-1]["step"] == steps and steps in checked,
        first=logged[0] if logged else None, last=logged[-1] if logged else None,
        acc_start=checked.get(0), acc_end=checked.get(steps),
        cos_first=statistics.mean(cosines[:5]) if cosines else None,
        cos_last=statistics.mean(cosines[-5:]) if cosines else None,
        rate=statistics.median(rates) if rates else None,
        teacher_share=statistics.median(teacher) if teacher else None)


def loss_cell(record) -> str:
    return "" if record is None else f"{record['loss']:.2f} ({record['step']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=pathlib.Path)
    parser.add_argument("--fine-tune", nargs="+", default=[], help="runs of the fine-tune table, in order")
    parser.add_argument("--distill", nargs="+", default=[], help="runs of the distillation table: the ones with a "
                        "teacher, and one without (the reference of the teacher's cost)")
    parser.add_argument("--np", default="2", help="ranks of every run")
    parser.add_argument("--extra", default="", help="options the script added to every run on B")
    args = parser.parse_args()
    root = args.root
    runs = {}
    for line in open(root / "runs.tsv"):
        name, ms, status, load = line.split("\t")
        runs[name] = dict(seconds=int(ms) / 1000, status=status, load=load.strip())
    model_a = json.loads((root / "a" / "config.json").read_text()) if (root / "a" / "config.json").exists() else {}
    started = (root / "started").read_text().strip() if (root / "started").exists() else "?"
    steps = None
    figures = {}
    for name in args.fine_tune + args.distill:
        config = json.loads((root / name / "config.json").read_text()) if (root / name / "config.json").exists() \
            else {}
        steps = steps or config.get("max_update")
        figures[name] = summarise(root, name, config.get("max_update", 0))

    def state(name: str) -> str:
        """'' for a finished run, else why its row is empty."""
        run = runs.get(name, {})
        if run.get("status") != "0":
            return f"failed (exit {run.get('status', '?')}; {root / name}.log)"
        return "" if figures[name]["complete"] else f"incomplete ({root / name}/metrics.jsonl)"

    print(f"Started {started}; {args.np} ranks through config.sh, {steps} steps on set B, seed "
          f"{next(iter(figures.values()))['config'].get('seed', '?') if figures else '?'}"
          f"{'; every run on B also ' + args.extra if args.extra else ''}. Model A: {root / 'a'} "
          f"({model_a.get('network', '?')} {model_a.get('embedding_size', '?')}-d, {model_a.get('loss', '?')}).")

    def table(title: str, names: "list[str]", headings: "list[str]", cells) -> None:
        """One markdown table: a row per run, `cells(figures)` its cells after run and options (a run that
        failed or did not finish says why instead)."""
        print(f"\n### {title}\n")
        print("| " + " | ".join(["run", "options", *headings, "seconds", "load"]) + " |")
        print("|" + "---|" * (len(headings) + 4))
        for name in names:
            f, why = figures[name], state(name)
            options = options_of(f["config"], root, model_a) if f["config"] else ""
            run = runs.get(name, {})
            row = [why] + [""] * (len(headings) - 1) if why else cells(f)
            print("| " + " | ".join([name, options, *row, f"{run.get('seconds', 0):.0f}", run.get("load", "")])
                  + " |")

    table(f"Fine-tuning A on set B ({steps} steps)", args.fine_tune,
          ["loss, first step", "loss, last step", "verification at 0", f"verification at {steps}"],
          lambda f: [loss_cell(f["first"]), loss_cell(f["last"]), fmt(f["acc_start"]), fmt(f["acc_end"])])
    try:
        verified = json.loads((root / "a-on-b.json").read_text())
        a_on_b = next(iter(verified.values()))["accuracy"]
    except (OSError, StopIteration, KeyError, ValueError):
        a_on_b = None
    loaded = [name for name in args.fine_tune if figures[name]["config"].get("pretrained")
              and figures[name]["acc_start"] is not None]
    print(f"\n`python -m mxnet_pfc.verify {root / 'a'} {root / 'data-b' / 'val.bin'}` (A on B): "
          f"{fmt(a_on_b, 4) or 'failed (' + str(root / 'a-on-b.log') + ')'}; "
          + ", ".join(f"{name} at step 0: {figures[name]['acc_start']:.4f}" for name in loaded)
          + (" (equal: --pretrained loads A exactly)" if a_on_b is not None and loaded
             and all(abs(figures[name]["acc_start"] - a_on_b) < 1e-9 for name in loaded)
             else " (NOT equal)" if loaded else ""))

    table(f"Distillation on set B ({steps} steps)", args.distill,
          ["distill/cosine, first 5 steps", "last 5 steps", "loss, first step", "loss, last step",
           f"verification at {steps}", "samples/s per rank (median)", "teacher's share of a step (median)"],
          lambda f: [fmt(f["cos_first"]), fmt(f["cos_last"]), loss_cell(f["first"]), loss_cell(f["last"]),
                     fmt(f["acc_end"]), fmt(f["rate"], 1),
                     "" if f["teacher_share"] is None else format(f["teacher_share"], ".0%")])
    taught = [n for n in args.distill if figures[n]["config"].get("teacher") and figures[n]["rate"]]
    alone = [n for n in args.distill if not figures[n]["config"].get("teacher") and figures[n]["rate"]]
    if taught and alone:
        ratio = figures[alone[0]]["rate"] / figures[taught[0]]["rate"]
        print(f"\nThe teacher's cost: {alone[0]} {figures[alone[0]]['rate']:.1f} / {taught[0]} "
              f"{figures[taught[0]]['rate']:.1f} samples/s per rank = {ratio:.2f}x the time per sample "
              "(medians of every step's log line; the two runs one after the other, not at once).")
    print("\n(loss: the logged training loss at its step, the distillation term included where there is a teacher; "
          "verification: 10-fold accuracy on B's val.bin, 1000 pairs of identities in neither set, chance 0.5; "
          "seconds: wall time of horovodrun, start-up and verifications included; load: the 1-minute load "
          f"average as the run ended, on a shared machine; logs in {root})")


if __name__ == "__main__":
    main()
