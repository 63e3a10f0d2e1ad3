"""IJB-B / IJB-C evaluation of parameters (docs/DESIGN.md 3.4): the library of the ijb command (mxnet_pfc/ijb.py).

IJBSet reads an IJB-layout set's meta files once and evaluates any parameters:
each face aligned by its five points, embedded with its mirror image (the two
added), weighted by its detector score unless told not to, averaged per media,
summed per template and L2-normalised; 1:1 TAR at FAR over the template pairs,
and 1:N CMC and TPIR at FPIR per gallery. The trainer evaluates its sets with
it (eval/during_training.py), the command a saved model.
"""
from __future__ import annotations

import sys

import mxnet as mx
import numpy as np
from tqdm import tqdm

from mxnet_pfc.eval import ijb_data, ijb_metrics
from mxnet_pfc.eval.verification import embed_with_mirror, tar_at_far
from mxnet_pfc.models.inference import Embedder

CMC_RANKS = 20          # ranks drawn in the CMC plot


def embed_faces(root: str, faces: ijb_data.Faces, embedder: Embedder, batch_size: int,
                progress: bool = True) -> np.ndarray:
    """(N, D) float64: embedding of each aligned face plus that of its mirror image, not normalised."""
    out = []
    with tqdm(total=len(faces.names), desc="IJB images", unit="img", file=sys.stderr, disable=not progress) as bar:
        for start in range(0, len(faces.names), batch_size):
            indices = range(start, min(start + batch_size, len(faces.names)))
            batch = np.stack([ijb_data.aligned_face(root, faces, i) for i in indices])
            out.append(embed_with_mirror(embedder, batch.transpose(0, 3, 1, 2).astype(np.float32))[0])
            bar.update(len(batch))
    return np.concatenate(out)


def verification_report(features: np.ndarray, templates: np.ndarray, pairs) -> "tuple[dict, tuple]":
    """1:1 figures: cosine of the two template features of each pair, TAR at each FAR both ways."""
    first, second, labels = pairs
    row = {int(t): i for i, t in enumerate(templates)}
    scores = np.sum(features[[row[t] for t in first]] * features[[row[t] for t in second]], axis=1)
    report = {"pairs": int(len(labels)), "same": int(labels.sum()), "different": int((labels == 0).sum()), "far": {}}
    for far in ijb_metrics.FARS:
        exact = tar_at_far(scores, labels == 1, far)
        accepted = scores[scores > exact.threshold]
        # reported as the ROC threshold, as before and as InsightFace's: accept when score >= it
        roc_threshold = float(accepted.min()) if accepted.size else float("inf")
        nearest = ijb_metrics.tar_at_far_nearest(labels, scores, far)
        report["far"][f"{far:g}"] = {"tar": exact.tar, "achieved_far": exact.achieved_far,
                                     "threshold": roc_threshold, "tar_nearest": nearest[0],
                                     "nearest_far": nearest[1], "nearest_threshold": nearest[2]}
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
        entry["insightface"] = ijb_metrics.identification_as_ijb_evals(similarity, probe_subjects, gallery_subjects)
        report[name] = entry
        curves[name] = (ranks, [cmc[k] for k in ranks])
    galleries = list(report)
    theirs = [report[g]["insightface"] for g in galleries]
    report["mean"] = {**{f"top{k}": float(np.mean([report[g][f"top{k}"] for g in galleries]))
                         for k in ijb_metrics.RANKS},
                      "fpir": {f"{f:g}": {"tpir": float(np.mean([report[g]["fpir"][f"{f:g}"]["tpir"]
                                                                  for g in galleries]))}
                               for f in ijb_metrics.FPIRS},
                      # ijb_evals.py's "[Mean]": hits of both galleries over all probes; its TPIRs' mean
                      "insightface": {**{f"top{k}": sum(t["hits"][k] for t in theirs) / len(probe_subjects)
                                         for k in ijb_metrics.RANKS},
                                      "fpir": {f"{f:g}": float(np.mean([t["fpir"][f"{f:g}"] for t in theirs]))
                                               for f in ijb_metrics.FPIRS
                                               if all(f"{f:g}" in t["fpir"] for t in theirs)}}}
    return report, curves


class IJBSet:
    """One IJB-layout set, its meta files read (and checked) once; evaluated against any parameters.

    The trainer keeps one per --ijb_targets entry (rank 0) and evaluates it with
    the .bin sets; the command evaluates one saved model.
    """

    def __init__(self, root: str, target: str, symbol: mx.sym.Symbol, ctx: mx.Context, batch_size: int = 64,
                 score_weight: bool = True):
        self.root, self.target, self.batch_size, self.score_weight = root, target, batch_size, score_weight
        self.name = target.lower()
        self.faces = ijb_data.read_faces(root, self.name)
        self.templates = np.unique(self.faces.templates)
        self.pairs = ijb_data.read_pairs(root, self.name, self.templates)
        paths = ijb_data.one_to_n_paths(root, self.name)
        self.one_to_n = {name: ijb_data.read_subjects(path, self.templates) for name, path in paths.items()}
        ijb_data.check_mates(self.one_to_n, paths)
        self.mode = "flip-sum, " + ("detector-score weighted" if score_weight else "unweighted")
        self.embedder = Embedder(symbol, ctx, batch_size)

    def describe(self) -> str:
        galleries = " ".join(n for n in self.one_to_n if n != "probe")
        return (f"{self.target} ({self.root}): {len(self.faces.names)} images, {len(self.templates)} templates, "
                f"{len(self.pairs[0])} pairs" + (f", 1:N galleries {galleries}" if galleries else ", no 1:N files"))

    def evaluate(self, arg_params: dict, aux_params: dict, progress: bool = True) -> "tuple[dict, dict]":
        """(report, curves): the 1:1 (and 1:N) figures of these parameters, and the ROC / CMC curves."""
        self.embedder.set_params(arg_params, aux_params)
        image_features = embed_faces(self.root, self.faces, self.embedder, self.batch_size, progress)
        if self.score_weight:
            image_features *= self.faces.scores[:, None]
        features = ijb_metrics.template_features(image_features, self.faces.templates, self.faces.medias,
                                                 self.templates)
        report = {"target": self.target, "mode": self.mode, "images": len(self.faces.names),
                  "templates": int(len(self.templates))}
        report["verification"], roc = verification_report(features, self.templates, self.pairs)
        curves = {"roc": roc}
        if self.one_to_n:
            report["identification"], curves["cmc"] = identification_report(features, self.templates, self.one_to_n)
        return report, curves


def headline(report: dict) -> "dict[str, float]":
    """The figures the trainer logs each verification: exact TAR at FAR 1e-4 and 1e-3, mean top-1 (1:N)."""
    figures = {f"tar_at_far_{far}": report["verification"]["far"][far]["tar"] for far in ("0.0001", "0.001")}
    if "identification" in report:
        figures["top1"] = report["identification"]["mean"]["top1"]
    return figures
