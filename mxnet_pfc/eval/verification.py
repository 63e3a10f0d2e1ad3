"""Face verification on InsightFace .bin pair sets (docs/DESIGN.md section 3.2).

Each image and its horizontal flip are embedded; the two embeddings are added
and L2-normalised. A pair is "same" when the squared distance between its
embeddings is below a threshold; the threshold is chosen on 9 folds and the
accuracy measured on the 10th, ten times: the reported figure is the mean and
standard deviation of the ten test-fold accuracies. The folds are contiguous
blocks of pairs, as in InsightFace's evaluation (an unshuffled k-fold split):
for LFW these are its ten official folds of 600 pairs. Alongside: XNorm (mean
norm of the raw embeddings) and TAR at FAR 1e-3 / 1e-4 over all pairs.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.eval.bin_file import FOLDS, BinFormatError, load_bin  # noqa: F401 (BinFormatError: its old home)
from mxnet_pfc.models.inference import Embedder
from mxnet_pfc.runtime.errors import ConfigError


def embed_with_mirror(embed_fn, images: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
    """(embed(image) + embed(mirror image), embed(image)) as float64, not normalised, for NCHW images.

    The flip-sum feature of the field's protocols (the .bin pairs here, IJB in ijb.py).
    """
    plain = embed_fn(images).astype(np.float64)
    return plain + embed_fn(images[:, :, :, ::-1].copy()).astype(np.float64), plain


def embed_pairs(embed_fn, images: np.ndarray, batch_size: int, progress=None) -> "tuple[np.ndarray, float]":
    """(L2-normalised embed(image) + embed(flipped image) as float64 (2P, D), XNorm).

    XNorm is the mean L2 norm of the raw embeddings of the unflipped images, a
    health figure of training (InsightFace reports it next to the accuracy).
    `progress`, if given, is called with the number of images done in each batch.
    """
    out, norms = [], []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        summed, plain = embed_with_mirror(embed_fn, chunk)
        out.append(summed)
        norms.append(np.linalg.norm(plain, axis=1))
        if progress is not None:
            progress(len(chunk))
    embeddings = np.concatenate(out)
    embeddings /= np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
    return embeddings, float(np.concatenate(norms).mean())


FARS = (1e-3, 1e-4)


@dataclass(frozen=True)
class TarAtFar:
    far: float           # the false accept rate asked for
    tar: float           # share of same pairs accepted at the threshold
    threshold: float     # cosine similarity: a pair is accepted when strictly above it
    achieved_far: float  # share of different pairs accepted (<= far)
    negatives: int       # different pairs in the set

    @property
    def resolved(self) -> bool:
        """False when the set has fewer than 1/far different pairs: the figure is then TAR at FAR 0."""
        return self.far * self.negatives >= 1


def tar_at_far(similarity: np.ndarray, issame: np.ndarray, far: float) -> TarAtFar:
    """TAR at the lowest threshold whose false accept rate over all different pairs is <= far.

    With n different pairs at most floor(far * n) may be accepted; when that is
    0 (fewer than 1/far pairs) the threshold is the highest different-pair score
    and the figure is the TAR at FAR = 0, a lower bound. The one TAR@FAR of the
    project: the .bin sets' and IJB's exact figure (docs/DESIGN.md 3.2, 3.4).
    InsightFace's IJB scripts read it off sklearn's ROC (accept when score >= a
    ROC threshold, the highest TPR with FPR <= far): the same pairs are accepted;
    the threshold named here is the highest different-pair score rejected.
    """
    negatives = np.sort(similarity[~issame])[::-1]
    positives = similarity[issame]
    if len(negatives) == 0 or len(positives) == 0:
        raise ValueError("TAR@FAR needs both same and different pairs")
    allowed = int(np.floor(far * len(negatives) + 1e-9))
    threshold = negatives[allowed] if allowed < len(negatives) else -np.inf
    accepted_negatives = int(np.sum(negatives > threshold))
    return TarAtFar(far, float(np.mean(positives > threshold)), float(threshold),
                    accepted_negatives / len(negatives), len(negatives))


@dataclass(frozen=True)
class VerificationResult:
    accuracy: float      # mean of the 10 test folds
    std: float           # their standard deviation
    threshold: float     # mean of the folds' best squared-distance thresholds
    xnorm: float = float("nan")
    tar: "tuple[TarAtFar, ...]" = ()
    pairs: int = 0

    def __str__(self) -> str:
        text = f"{self.accuracy:.4f} +- {self.std:.4f} (threshold {self.threshold:.2f}), XNorm {self.xnorm:.2f}"
        for t in self.tar:
            text += f", TAR@FAR={t.far:g} {t.tar:.4f}"
            if not t.resolved:
                text += f" (at FAR 0: only {t.negatives} different pairs)"
        return text

    def as_dict(self) -> dict:
        return dict(accuracy=self.accuracy, std=self.std, threshold=self.threshold,
                    cosine_threshold=1 - self.threshold / 2, xnorm=self.xnorm, pairs=self.pairs,
                    **{f"tar_at_far_{t.far:g}": t.tar for t in self.tar},
                    **{f"tar_at_far_{t.far:g}_cosine_threshold": t.threshold for t in self.tar})


def contiguous_folds(count: int, folds: int) -> np.ndarray:
    """The fold of each of `count` pairs: contiguous blocks, the first count % folds one pair longer."""
    sizes = [count // folds + (1 if k < count % folds else 0) for k in range(folds)]
    return np.repeat(np.arange(folds), sizes)


def ten_fold_accuracy(embeddings: np.ndarray, issame: np.ndarray, folds: int = FOLDS) -> VerificationResult:
    """Threshold on squared distance chosen on folds-1 folds, accuracy on the held-out fold (every fold
    needs a pair: load_bin refuses a set of fewer pairs than folds)."""
    distance = np.sum((embeddings[0::2] - embeddings[1::2]) ** 2, axis=1)
    thresholds = np.arange(0, 4, 0.01)
    # correct[t, i]: pair i is classified right at threshold t
    correct = (distance[None, :] < thresholds[:, None]) == issame[None, :]
    fold_of = contiguous_folds(len(issame), folds)
    accuracies, best = [], []
    for fold in range(folds):
        train, test = fold_of != fold, fold_of == fold
        t = int(np.argmax(correct[:, train].mean(axis=1)))
        best.append(thresholds[t])
        accuracies.append(correct[t, test].mean())
    return VerificationResult(float(np.mean(accuracies)), float(np.std(accuracies)), float(np.mean(best)),
                              pairs=len(issame))


def verify_embeddings(embeddings: np.ndarray, issame: np.ndarray, xnorm: float = float("nan"),
                      fars=FARS) -> VerificationResult:
    """The whole report for L2-normalised pair embeddings (2P, D): 10-fold accuracy, XNorm, TAR@FAR."""
    similarity = np.sum(embeddings[0::2] * embeddings[1::2], axis=1)
    tars = tuple(tar_at_far(similarity, issame, far) for far in fars)
    return dataclasses.replace(ten_fold_accuracy(embeddings, issame), xnorm=xnorm, tar=tars)


def set_names(paths) -> "list[str]":
    """The name of each .bin set in reports: its file name without .bin, and as many of its folders as tell
    it apart from another set of that name (a/lfw.bin, b/lfw.bin: 'a/lfw', 'b/lfw'). ConfigError for a file
    named twice, or two that only their extensions tell apart."""
    parts = []
    for path in paths:
        *folders, file = os.path.abspath(path).split(os.sep)
        parts.append([*folders, os.path.splitext(file)[0]])
    names = []
    for i, own in enumerate(parts):
        for depth in range(1, len(own) + 1):
            name = "/".join(own[-depth:])
            clash = next((j for j, other in enumerate(parts) if j != i and "/".join(other[-depth:]) == name), None)
            if clash is None:
                names.append(name)
                break
        else:
            how = "twice" if os.path.abspath(paths[i]) == os.path.abspath(paths[clash]) else \
                f"as {paths[i]} and {paths[clash]}, which only their extensions tell apart"
            raise ConfigError(f"the verification set {name} is named {how}: each set is evaluated once, under its "
                              "own name")
    return names


class Verifier:
    """The configured .bin sets, loaded once, evaluated against a backbone's current parameters."""

    def __init__(self, paths, symbol: mx.sym.Symbol, ctx: mx.Context, batch_size: int = 64,
                 image_size: int = FACE_SIZE):
        self.sets = {name: load_bin(path, image_size) for name, path in zip(set_names(paths), paths)}
        self.batch_size = batch_size
        self.embedder = Embedder(symbol, ctx, batch_size, image_size)

    def evaluate(self, arg_params, aux_params, progress: bool = False) -> "dict[str, VerificationResult]":
        """Every set's report for these backbone parameters (a tqdm bar per set when progress)."""
        self.embedder.set_params(arg_params, aux_params)
        results = {}
        for name, (images, issame) in self.sets.items():
            with tqdm(total=len(images), desc=name, unit="img", disable=not progress, file=sys.stderr) as bar:
                embeddings, xnorm = embed_pairs(self.embedder, images, self.batch_size, bar.update)
            results[name] = verify_embeddings(embeddings, issame, xnorm)
        return results
