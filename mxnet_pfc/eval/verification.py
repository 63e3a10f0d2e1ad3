"""Face verification on InsightFace .bin pair sets (DESIGN.md section 3).

Each image and its horizontal flip are embedded; the two embeddings are added
and L2-normalised. A pair is "same" when the squared distance between its
embeddings is below a threshold; the threshold is chosen on 9 folds and the
accuracy measured on the 10th, ten times: the reported figure is the mean and
standard deviation of the ten test-fold accuracies.
"""
from __future__ import annotations

import io
import os
import pickle
from dataclasses import dataclass

import cv2
import mxnet as mx
import numpy as np


class BinFormatError(ValueError):
    """A .bin file that is not (list of encoded images, list of booleans)."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """Refuses every global: lists, tuples, bytes, strings and booleans need none."""

    def find_class(self, module, name):
        raise BinFormatError(f"refusing to load {module}.{name}: a verification .bin holds only "
                             "a list of encoded images and a list of booleans")


def load_bin(path: str, image_size: int = 112) -> "tuple[np.ndarray, np.ndarray]":
    """(images float32 (2P, 3, H, W) RGB 0..255, issame bool (P,)) from a .bin pair set."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        loaded = _DataOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except BinFormatError as error:
        raise BinFormatError(f"{path}: {error}") from None
    except Exception as error:
        raise BinFormatError(f"{path}: not a pickle of (images, issame): {error}") from None
    if not (isinstance(loaded, (tuple, list)) and len(loaded) == 2):
        raise BinFormatError(f"{path}: expected a pair (images, issame), got {type(loaded).__name__}")
    bins, issame = loaded
    if not all(isinstance(b, (bytes, bytearray)) for b in bins):
        raise BinFormatError(f"{path}: the image list holds something other than encoded bytes")
    if not all(isinstance(s, (bool, np.bool_)) for s in issame) or len(bins) != 2 * len(issame):
        raise BinFormatError(f"{path}: expected {2 * len(issame)} images for {len(issame)} booleans, got {len(bins)}")
    images = np.empty((len(bins), 3, image_size, image_size), dtype=np.float32)
    for i, encoded in enumerate(bins):
        image = cv2.imdecode(np.frombuffer(encoded, dtype=np.uint8), cv2.IMREAD_COLOR)
        if image is None:
            raise BinFormatError(f"{path}: image {i} does not decode")
        if image.shape[:2] != (image_size, image_size):
            image = cv2.resize(image, (image_size, image_size))
        images[i] = image[:, :, ::-1].transpose(2, 0, 1)
    return images, np.asarray(issame, dtype=bool)


def embed_pairs(embed_fn, images: np.ndarray, batch_size: int) -> np.ndarray:
    """L2-normalised embed(image) + embed(flipped image), float64 (2P, D)."""
    out = []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        summed = embed_fn(chunk).astype(np.float64) + embed_fn(chunk[:, :, :, ::-1].copy()).astype(np.float64)
        out.append(summed)
    embeddings = np.concatenate(out)
    return embeddings / np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)


@dataclass(frozen=True)
class VerificationResult:
    accuracy: float
    std: float
    threshold: float     # mean of the folds' best squared-distance thresholds

    def __str__(self) -> str:
        return f"{self.accuracy:.4f} +- {self.std:.4f} (threshold {self.threshold:.2f})"


def ten_fold_accuracy(embeddings: np.ndarray, issame: np.ndarray, folds: int = 10) -> VerificationResult:
    """Threshold on squared distance chosen on folds-1 folds, accuracy on the held-out fold."""
    distance = np.sum((embeddings[0::2] - embeddings[1::2]) ** 2, axis=1)
    thresholds = np.arange(0, 4, 0.01)
    # correct[t, i]: pair i is classified right at threshold t
    correct = (distance[None, :] < thresholds[:, None]) == issame[None, :]
    fold_of = np.arange(len(issame)) % folds
    accuracies, best = [], []
    for fold in range(folds):
        train, test = fold_of != fold, fold_of == fold
        t = int(np.argmax(correct[:, train].mean(axis=1)))
        best.append(thresholds[t])
        accuracies.append(correct[t, test].mean())
    return VerificationResult(float(np.mean(accuracies)), float(np.std(accuracies)), float(np.mean(best)))


class Verifier:
    """The configured .bin sets, loaded once, evaluated against a backbone's current parameters."""

    def __init__(self, paths, symbol: mx.sym.Symbol, ctx: mx.Context, batch_size: int = 64, image_size: int = 112):
        self.sets = {os.path.splitext(os.path.basename(p))[0]: load_bin(p, image_size) for p in paths}
        self.batch_size = batch_size
        self.module = mx.mod.Module(symbol, data_names=["data"], label_names=None, context=ctx)
        self.module.bind(data_shapes=[("data", (batch_size, 3, image_size, image_size))], for_training=False)

    def _embed(self, images: np.ndarray) -> np.ndarray:
        count = len(images)
        if count < self.batch_size:        # the module is bound for full batches
            images = np.concatenate([images, np.zeros((self.batch_size - count, *images.shape[1:]), images.dtype)])
        self.module.forward(mx.io.DataBatch([mx.nd.array(images)]), is_train=False)
        return self.module.get_outputs()[0].asnumpy()[:count]        # host sync point

    def evaluate(self, arg_params, aux_params) -> "dict[str, VerificationResult]":
        self.module.set_params(arg_params, aux_params, allow_missing=False, force_init=True)
        return {name: ten_fold_accuracy(embed_pairs(self._embed, images, self.batch_size), issame)
                for name, (images, issame) in self.sets.items()}
