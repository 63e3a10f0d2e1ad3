"""IJB template features and metrics, in plain numpy (docs/DESIGN.md section 3.4).

1:1 verification: ROC over template pairs (cosine score), and TAR at the ROC
point nearest a FAR, as InsightFace prints it (the exact TAR at FAR is
verification.tar_at_far, the .bin sets' own).
1:N identification, open set: CMC over mated probes, TPIR at FPIR. Kept free
of MXNet so that the tests can compare every figure with a brute-force count.
"""
from __future__ import annotations

import numpy as np

FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
FPIRS = (1e-2, 1e-1)
RANKS = (1, 5, 10)


def template_features(image_features: np.ndarray, templates: np.ndarray, medias: np.ndarray,
                      wanted: np.ndarray) -> np.ndarray:
    """L2-normalised features (len(wanted), D) of the templates `wanted`, as the IJB literature makes them.

    The images of a media (the frames of one video, or one still) are averaged,
    so that a long video does not outweigh a photo; the media of a template are
    summed; the sum is L2-normalised. image_features are per image (already
    flip-summed and, if asked, weighted by the detector score).
    """
    out = np.zeros((len(wanted), image_features.shape[1]), dtype=np.float64)
    order = np.argsort(templates, kind="stable")
    sorted_templates = templates[order]
    for row, template in enumerate(wanted):
        lo, hi = np.searchsorted(sorted_templates, [template, template + 1])
        members = order[lo:hi]
        if len(members) == 0:
            raise ValueError(f"template {template} has no images")
        for media in np.unique(medias[members]):
            out[row] += image_features[members[medias[members] == media]].mean(axis=0)
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


def roc_curve(labels: np.ndarray, scores: np.ndarray, drop_intermediate: bool = True):
    """(fpr, tpr, thresholds) as sklearn.metrics.roc_curve computes them (a pair is accepted when score >= threshold).

    One point per distinct score, from the highest down, after a first point
    (0, 0) at threshold +inf. drop_intermediate removes points that lie on a
    straight line between their neighbours, as sklearn does by default (the
    InsightFace scripts use that default, so their nearest-point figures see
    only the kept points).
    """
    labels, scores = np.asarray(labels).astype(bool), np.asarray(scores, dtype=np.float64)
    if labels.all() or not labels.any():
        raise ValueError("a ROC needs both same-subject (1) and different-subject (0) pairs")
    order = np.argsort(scores, kind="mergesort")[::-1]
    scores, labels = scores[order], labels[order]
    last_of_value = np.r_[np.nonzero(np.diff(scores))[0], len(scores) - 1]
    tps = np.cumsum(labels)[last_of_value].astype(np.float64)
    fps = 1 + last_of_value - tps
    thresholds = scores[last_of_value]
    if drop_intermediate and len(fps) > 2:
        keep = np.nonzero(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])[0]
        fps, tps, thresholds = fps[keep], tps[keep], thresholds[keep]
    fps, tps, thresholds = np.r_[0, fps], np.r_[0, tps], np.r_[np.inf, thresholds]
    return fps / fps[-1], tps / tps[-1], thresholds


def tar_at_far_nearest(labels: np.ndarray, scores: np.ndarray, far: float) -> "tuple[float, float, float]":
    """(TAR, its FAR, threshold) of the ROC point whose FAR is nearest `far`: the figure InsightFace prints.

    ijb_11.py takes sklearn's roc_curve (intermediate points dropped), and among
    equally near points the one with the highest TAR. That point's FAR may be
    above the target, so this figure can exceed the exact one (verification.tar_at_far).
    """
    fpr, tpr, thresholds = roc_curve(labels, scores, drop_intermediate=True)
    distance = np.abs(fpr - far)
    best = np.nonzero(distance == distance.min())[0][-1]
    return float(tpr[best]), float(fpr[best]), float(thresholds[best])


def mate_ranks(similarity: np.ndarray, probe_subjects: np.ndarray, gallery_subjects: np.ndarray):
    """(mated mask (P,), rank of the mate (P,), mate score (P,), top score (P,)) of each probe.

    A probe is mated when its subject has a template in the gallery. The rank
    of its mate is 1 + the number of non-mate gallery templates scoring at
    least as high as the best mate (ties count against the probe); 0 for
    non-mated probes. The top score is the highest score over the gallery.
    """
    is_mate = probe_subjects[:, None] == gallery_subjects[None, :]
    mated = is_mate.any(axis=1)
    mate_score = np.where(is_mate, similarity, -np.inf).max(axis=1)
    beaten_by = np.sum(np.where(is_mate, -np.inf, similarity) >= mate_score[:, None], axis=1)
    ranks = np.where(mated, 1 + beaten_by, 0)
    return mated, ranks, mate_score, similarity.max(axis=1)


def cmc(similarity: np.ndarray, probe_subjects: np.ndarray, gallery_subjects: np.ndarray,
        ranks=RANKS) -> "dict[int, float]":
    """{k: share of mated probes whose mate is within the top k}: closed-set identification over mated probes."""
    mated, mate_rank, _, _ = mate_ranks(similarity, probe_subjects, gallery_subjects)
    if not mated.any():
        raise ValueError("no probe has a mate in the gallery")
    return {k: float(np.mean(mate_rank[mated] <= k)) for k in ranks}


def tpir_at_fpir(similarity: np.ndarray, probe_subjects: np.ndarray, gallery_subjects: np.ndarray,
                 fpir: float) -> "tuple[float, float, float]":
    """(TPIR, its FPIR, threshold) at rank 1, open set (NIST IR 8238 / Grother's FRVT definitions).

    A search returns its top gallery template when that score is above the
    threshold t. FPIR(t): share of non-mated probes (subject not in the gallery)
    whose top score is above t. TPIR(t): share of mated probes whose mate is at
    rank 1 and scores above t. t is the lowest threshold with FPIR(t) <= fpir:
    of the n non-mated probes at most floor(fpir * n) are accepted. (InsightFace's
    ijb_evals.py takes the int(fpir * n)-th highest non-mated top score as t,
    which accepts one non-mated probe fewer.)
    """
    mated, mate_rank, mate_score, top = mate_ranks(similarity, probe_subjects, gallery_subjects)
    if mated.all() or not mated.any():
        raise ValueError("TPIR at FPIR needs both mated and non-mated probes")
    non_mated_tops = np.sort(top[~mated])[::-1]
    allowed = int(np.floor(fpir * len(non_mated_tops) + 1e-9))
    threshold = non_mated_tops[allowed] if allowed < len(non_mated_tops) else -np.inf
    hits = (mate_rank[mated] == 1) & (mate_score[mated] > threshold)
    return float(np.mean(hits)), float(np.mean(non_mated_tops > threshold)), float(threshold)


def identification_as_ijb_evals(similarity: np.ndarray, probe_subjects: np.ndarray, gallery_subjects: np.ndarray,
                                fpirs=FPIRS, chunk: int = 1024) -> dict:
    """One gallery's 1:N figures as InsightFace's ijb_evals.py (evaluation_1N) counts them, to print beside ours.

    - top-k: a mated probe counts when the first gallery template of its subject is among the first k of
      numpy's argsort of its scores, reversed; the figures are counts (`hits`), which ijb_evals divides by
      all probes of both galleries together (`pooled`), where ours averages the galleries' rates;
    - TPIR at FPIR: t is the int(fpir * n)-th highest top score of the n non-mated probes (the first when
      that is 0), so int(fpir * n) - 1 of them are above it, one fewer than ours; a mated probe counts when
      its mate scores above every other gallery template and above t.
    """
    mated = np.isin(probe_subjects, gallery_subjects)
    first_mate = {int(s): int(np.flatnonzero(gallery_subjects == s)[0]) for s in np.unique(probe_subjects[mated])}
    hits = {k: 0 for k in RANKS}
    positives, best_other, non_mated_tops = [], [], []
    for start in range(0, len(probe_subjects), chunk):
        scores = similarity[start:start + chunk]
        order = np.argsort(scores, axis=1)[:, ::-1][:, :max(RANKS)]
        for row, subject in enumerate(probe_subjects[start:start + chunk]):
            if int(subject) in first_mate:
                label = first_mate[int(subject)]
                for k in RANKS:
                    hits[k] += int(label in order[row, :k])
                is_mate = gallery_subjects == subject
                positives.append(scores[row][is_mate][0])
                best_other.append(scores[row][~is_mate].max() if (~is_mate).any() else -np.inf)
            else:
                non_mated_tops.append(scores[row].max())
    positives, best_other = np.array(positives), np.array(best_other)
    tops = np.sort(np.array(non_mated_tops))[::-1]
    fpir_figures = {}
    for fpir in fpirs:
        if len(tops) and len(positives):
            threshold = tops[max(int(len(tops) * fpir) - 1, 0)]
            fpir_figures[f"{fpir:g}"] = float(np.sum((positives > best_other) & (positives > threshold))
                                              / len(positives))
    return {"hits": hits, "mated_probes": int(len(positives)), "fpir": fpir_figures}

