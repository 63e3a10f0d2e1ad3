"""python -m mxnet_pfc.ijb MODEL --root IJBC --target IJBC [--output DIR]

IJB-B / IJB-C evaluation of a saved model on the test data in InsightFace's
layout (ROOT/meta/*.txt, *.csv and ROOT/loose_crop/; docs/evaluation.md "IJB-B / IJB-C",
docs/DESIGN.md 3.4). Each face is aligned by its five points, embedded with its
mirror image (the two added), weighted by its detector score unless
--no-score-weight, averaged per media, summed per template and L2-normalised.
1:1: TAR at FAR 1e-6 .. 1e-1 over the template pairs, exact and as InsightFace
prints it. 1:N (when the gallery and probe CSVs are there): CMC top-1/5/10 and
TPIR at FPIR 1e-2 and 1e-1 per gallery and their mean. Writes
OUTPUT/ijb-<target>.json and ROC / CMC plots (PNG).
"""
from __future__ import annotations

import argparse
import os
import sys

from mxnet_pfc.eval import ijb_metrics, plots
from mxnet_pfc.eval.ijb_set import IJBSet
from mxnet_pfc.models.inference import load_model
from mxnet_pfc.runtime.device import add_context_option, choose_context
from mxnet_pfc.runtime.errors import exit_status
from mxnet_pfc.runtime.files import write_json
from mxnet_pfc.runtime.options import positive_int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.ijb", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the model: an exported prefix[,epoch], a training checkpoint folder or a "
                                      "training output folder")
    parser.add_argument("--root", required=True, help="the folder holding meta/ and loose_crop/ (e.g. IJBC)")
    parser.add_argument("--target", default="IJBC", choices=["IJBC", "IJBB"],
                        help="which set: it names the meta files (ijbc_..., ijbb_...) and the galleries "
                             "(G1/G2, S1/S2) (default: %(default)s)")
    parser.add_argument("--batch-size", "--batch_size", type=positive_int, default=64,
                        help="images per forward pass; each is embedded with its mirror (default: %(default)s)")
    parser.add_argument("--output", default="output/ijb",
                        help="folder for ijb-<target>.json and the PNG plots (default: %(default)s)")
    parser.add_argument("--no-score-weight", action="store_true",
                        help="do not weight each image's feature by its detector (faceness) score; "
                             "by default it is weighted, as in InsightFace's published figures")
    add_context_option(parser)
    return parser


def evaluate(args) -> dict:
    symbol, arg_params, aux_params, source = load_model(args.model)
    ctx = choose_context(args.context, 0)
    ijb = IJBSet(args.root, args.target, symbol, ctx, args.batch_size, score_weight=not args.no_score_weight)
    print(f"{source}: {ijb.describe()}", file=sys.stderr)
    found, curves = ijb.evaluate(arg_params, aux_params)
    report = {"model": source, **found}
    target, mode = ijb.name, ijb.mode
    os.makedirs(args.output, exist_ok=True)
    plots.draw_roc(os.path.join(args.output, f"ijb-{target}-roc.png"), {f"{args.target} [{mode}]": curves["roc"]},
                   f"{args.target} 1:1 ROC, {source}")
    if "cmc" in curves:
        plots.draw_cmc(os.path.join(args.output, f"ijb-{target}-cmc.png"),
                       {f"{name} [{mode}]": c for name, c in curves["cmc"].items()}, f"{args.target} 1:N CMC, {source}")
    write_json(os.path.join(args.output, f"ijb-{target}.json"), report)
    return report


def print_report(target: str, mode: str, report: dict) -> None:
    ver = report["verification"]
    print(f"{target} 1:1 [{mode}] {ver['pairs']} template pairs ({ver['same']} same, {ver['different']} different)")
    for far, fig in ver["far"].items():
        print(f"{target} 1:1 [{mode}] TAR@FAR={far}: {fig['tar']:.4f} (exact: FAR {fig['achieved_far']:.2e}), "
              f"{fig['tar_nearest']:.4f} (nearest ROC point, as InsightFace prints: FAR {fig['nearest_far']:.2e})")
    for name, entry in report.get("identification", {}).items():
        tops = ", ".join(f"top-{k} {entry[f'top{k}']:.4f}" for k in ijb_metrics.RANKS)
        tpirs = ", ".join(f"TPIR@FPIR={f} {v['tpir']:.4f}" for f, v in entry["fpir"].items())
        theirs = entry["insightface"]
        if name == "mean":
            their_tops = ", ".join(f"top-{k} {theirs[f'top{k}']:.4f}" for k in ijb_metrics.RANKS)
            label = "pooled over all probes"
        else:
            their_tops = ", ".join(f"top-{k} {theirs['hits'][k] / max(theirs['mated_probes'], 1):.4f}"
                                   for k in ijb_metrics.RANKS)
            label = "its counts"
        their_tpirs = ", ".join(f"TPIR@FPIR={f} {v:.4f}" for f, v in theirs["fpir"].items())
        print(f"{target} 1:N [{mode}] {name}: {tops}, {tpirs} (as InsightFace's ijb_evals prints, {label}: "
              f"{their_tops}, {their_tpirs})")


def run(args) -> None:
    report = evaluate(args)
    print_report(args.target, report["mode"], report)
    print(f"wrote {os.path.join(args.output, 'ijb-' + args.target.lower() + '.json')} and the plots", file=sys.stderr)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return exit_status("mxnet_pfc.ijb", run, args)


if __name__ == "__main__":
    sys.exit(main())
