"""python -m mxnet_pfc.ijb MODEL --root IJBC --target IJBC [--output DIR]

IJB-B / IJB-C evaluation of a saved model on the test data in InsightFace's
layout (ROOT/meta/*.txt, *.csv and ROOT/loose_crop/; README "IJB-B / IJB-C",
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

import mxnet as mx
import numpy as np
from tqdm import tqdm

from .errors import PfcError
from .eval import ijb_data, ijb_metrics, plots
from .files import write_json
from .inference import Embedder, load_model

CMC_RANKS = 20          # ranks drawn in the CMC plot


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.ijb", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="the model: an exported prefix[,epoch], a training checkpoint folder or a "
                                      "training output folder")
    parser.add_argument("--root", required=True, help="the folder holding meta/ and loose_crop/ (e.g. IJBC)")
    parser.add_argument("--target", default="IJBC", choices=["IJBC", "IJBB"],
                        help="which set: it names the meta files (ijbc_..., ijbb_...) and the galleries "
                             "(G1/G2, S1/S2) (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="images per forward pass; each is embedded with its mirror (default: %(default)s)")
    parser.add_argument("--output", default="output/ijb",
                        help="folder for ijb-<target>.json and the PNG plots (default: %(default)s)")
    parser.add_argument("--no-score-weight", action="store_true",
                        help="do not weight each image's feature by its detector (faceness) score; "
                             "by default it is weighted, as in InsightFace's published figures")
    parser.add_argument("--context", choices=["cpu", "gpu"], default="cpu",
                        help="where to run the model; gpu: the first GPU (default: %(default)s)")
    return parser


def embed_faces(root: str, faces: ijb_data.Faces, embedder: Embedder, batch_size: int) -> np.ndarray:
    """(N, D) float64: embedding of each aligned face plus that of its mirror image, not normalised."""
    out = []
    with tqdm(total=len(faces.names), desc="IJB images", unit="img", file=sys.stderr) as bar:
        for start in range(0, len(faces.names), batch_size):
            indices = range(start, min(start + batch_size, len(faces.names)))
            batch = np.stack([ijb_data.aligned_face(root, faces, i) for i in indices])
            batch = batch.transpose(0, 3, 1, 2).astype(np.float32)
            mirrored = batch[:, :, :, ::-1].copy()
            out.append(embedder(batch).astype(np.float64) + embedder(mirrored).astype(np.float64))
            bar.update(len(batch))
    return np.concatenate(out)


def verification_report(features: np.ndarray, templates: np.ndarray, pairs) -> "tuple[dict, tuple]":
    """1:1 figures: cosine of the two template features of each pair, TAR at each FAR both ways."""
    first, second, labels = pairs
    row = {int(t): i for i, t in enumerate(templates)}
    scores = np.sum(features[[row[t] for t in first]] * features[[row[t] for t in second]], axis=1)
    report = {"pairs": int(len(labels)), "same": int(labels.sum()), "different": int((labels == 0).sum()), "far": {}}
    for far in ijb_metrics.FARS:
        exact = ijb_metrics.tar_at_far_exact(labels, scores, far)
        nearest = ijb_metrics.tar_at_far_nearest(labels, scores, far)
        report["far"][f"{far:g}"] = {"tar": exact[0], "achieved_far": exact[1], "threshold": exact[2],
                                     "tar_nearest": nearest[0], "nearest_far": nearest[1],
                                     "nearest_threshold": nearest[2]}
    fpr, tpr, _ = ijb_metrics.roc_curve(labels, scores, drop_intermediate=True)
    return report, (fpr, tpr)


def identification_report(features, templates, one_to_n) -> "tuple[dict, dict]":
    """1:N figures per gallery (CMC, TPIR at FPIR) and their mean; the CMC curves for the plot."""
    row = {int(t): i for i, t in enumerate(templates)}
    probe_templates, probe_subjects = one_to_n["probe"]
    probes = features[[row[t] for t in probe_templates]]
    report, curves = {}, {}
    for name, (gallery_templates, gallery_subjects) in one_to_n.items():
        if name == "probe":
            continue
        similarity = probes @ features[[row[t] for t in gallery_templates]].T
        ranks = list(range(1, min(CMC_RANKS, len(gallery_templates)) + 1))
        cmc = ijb_metrics.cmc(similarity, probe_subjects, gallery_subjects, ranks)
        mated = np.isin(probe_subjects, gallery_subjects)
        entry = {"gallery_templates": int(len(gallery_templates)), "mated_probes": int(mated.sum()),
                 "non_mated_probes": int((~mated).sum()),
                 **{f"top{k}": cmc.get(k, cmc[ranks[-1]]) for k in ijb_metrics.RANKS}, "fpir": {}}
        for fpir in ijb_metrics.FPIRS:
            tpir, achieved, threshold = ijb_metrics.tpir_at_fpir(similarity, probe_subjects, gallery_subjects, fpir)
            entry["fpir"][f"{fpir:g}"] = {"tpir": tpir, "achieved_fpir": achieved, "threshold": threshold}
        report[name] = entry
        curves[name] = (ranks, [cmc[k] for k in ranks])
    galleries = list(report)
    report["mean"] = {**{f"top{k}": float(np.mean([report[g][f"top{k}"] for g in galleries]))
                         for k in ijb_metrics.RANKS},
                      "fpir": {f"{f:g}": {"tpir": float(np.mean([report[g]["fpir"][f"{f:g}"]["tpir"]
                                                                  for g in galleries]))}
                               for f in ijb_metrics.FPIRS}}
    return report, curves


def print_report(target: str, mode: str, report: dict) -> None:
    ver = report["verification"]
    print(f"{target} 1:1 [{mode}] {ver['pairs']} template pairs ({ver['same']} same, {ver['different']} different)")
    for far, fig in ver["far"].items():
        print(f"{target} 1:1 [{mode}] TAR@FAR={far}: {fig['tar']:.4f} (exact: FAR {fig['achieved_far']:.2e}), "
              f"{fig['tar_nearest']:.4f} (nearest ROC point, as InsightFace prints: FAR {fig['nearest_far']:.2e})")
    for name, entry in report.get("identification", {}).items():
        tops = ", ".join(f"top-{k} {entry[f'top{k}']:.4f}" for k in ijb_metrics.RANKS)
        tpirs = ", ".join(f"TPIR@FPIR={f} {v['tpir']:.4f}" for f, v in entry["fpir"].items())
        print(f"{target} 1:N [{mode}] {name}: {tops}, {tpirs}")


def evaluate(args) -> dict:
    target = args.target.lower()
    faces = ijb_data.read_faces(args.root, target)
    templates = np.unique(faces.templates)
    pairs = ijb_data.read_pairs(args.root, target, templates)
    one_to_n = {name: ijb_data.read_subjects(path, templates)
                for name, path in ijb_data.one_to_n_paths(args.root, target).items()}
    symbol, arg_params, aux_params, source = load_model(args.model)
    ctx = mx.gpu(0) if args.context == "gpu" else mx.cpu()
    print(f"{source}: {len(faces.names)} images, {len(templates)} templates, {len(pairs[0])} pairs"
          + (", 1:N galleries " + " ".join(n for n in one_to_n if n != "probe") if one_to_n else ", no 1:N files"),
          file=sys.stderr)
    embedder = Embedder(symbol, ctx, args.batch_size)
    embedder.set_params(arg_params, aux_params)
    image_features = embed_faces(args.root, faces, embedder, args.batch_size)
    if not args.no_score_weight:
        image_features *= faces.scores[:, None]
    mode = "flip-sum, " + ("unweighted" if args.no_score_weight else "detector-score weighted")
    features = ijb_metrics.template_features(image_features, faces.templates, faces.medias, templates)
    report = {"model": source, "target": args.target, "mode": mode, "images": len(faces.names),
              "templates": int(len(templates))}
    report["verification"], roc = verification_report(features, templates, pairs)
    os.makedirs(args.output, exist_ok=True)
    plots.draw_roc(os.path.join(args.output, f"ijb-{target}-roc.png"), {f"{args.target} [{mode}]": roc},
                   f"{args.target} 1:1 ROC, {source}")
    if one_to_n:
        report["identification"], curves = identification_report(features, templates, one_to_n)
        plots.draw_cmc(os.path.join(args.output, f"ijb-{target}-cmc.png"),
                       {f"{name} [{mode}]": c for name, c in curves.items()}, f"{args.target} 1:N CMC, {source}")
    write_json(os.path.join(args.output, f"ijb-{target}.json"), report)
    return report


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        report = evaluate(args)
    except (PfcError, OSError) as error:
        print(f"mxnet_pfc.ijb: {error}", file=sys.stderr)
        return 1
    print_report(args.target, report["mode"], report)
    print(f"wrote {os.path.join(args.output, 'ijb-' + args.target.lower() + '.json')} and the plots", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
