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
import io
import os
import pickle
import sys
from dataclasses import dataclass

import cv2
import mxnet as mx
import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE, ImageError, decode_face
from mxnet_pfc.models.inference import Embedder
from mxnet_pfc.runtime.errors import PfcError


class BinFormatError(PfcError, ValueError):
    """A .bin file that is not (list of encoded images, list of booleans)."""


# The arrays a .bin may hold: encoded images (uint8) and pair labels (bool); never objects.
_BIN_DTYPES = (np.dtype(np.uint8), np.dtype(np.bool_))


def _bin_dtype(spec, align=False, copy=False) -> np.dtype:
    """numpy.dtype as a pickle calls it, for the .bin's own types only."""
    dtype = np.dtype(spec) if isinstance(spec, str) else None
    if dtype not in _BIN_DTYPES:
        raise BinFormatError(f"an array of type {spec!r}: a verification .bin holds uint8 images and booleans")
    return np.dtype(spec, align=bool(align), copy=bool(copy))


def _bin_array_from_buffer(buffer, dtype, shape, order="C") -> np.ndarray:
    """numpy's _frombuffer (protocol 5 pickles of arrays), for bytes of the .bin's types only."""
    if not (isinstance(buffer, (bytes, bytearray, memoryview, pickle.PickleBuffer)) and dtype in _BIN_DTYPES
            and isinstance(shape, tuple) and all(isinstance(n, int) and n >= 0 for n in shape)):
        raise BinFormatError("an array that is not bytes of a uint8 or boolean array")
    array = np.frombuffer(bytes(buffer), dtype=dtype)
    if array.size != int(np.prod(shape)):
        raise BinFormatError(f"an array of {array.size} elements given the shape {shape}")
    return array.reshape(shape, order="F" if order == "F" else "C")


class _NDArrayName:
    """What the name numpy.ndarray stands for in a .bin: only the class argument of _bin_empty_array (never
    called: an ndarray built from a pickle's own arguments could be of any size and type)."""


def _bin_empty_array(cls, shape, typecode) -> np.ndarray:
    """numpy's _reconstruct (protocol 0-4 pickles of arrays): an empty ndarray whose state (shape, dtype from
    _bin_dtype, raw bytes) the pickle then sets."""
    if cls is not _NDArrayName:
        raise BinFormatError(f"an array of class {getattr(cls, '__name__', cls)!r}")
    return np.ndarray.__new__(np.ndarray, (0,), np.uint8)


def _bin_scalar(dtype, raw) -> np.generic:
    """numpy's scalar (a numpy boolean in the pair labels)."""
    if dtype not in _BIN_DTYPES or not isinstance(raw, bytes) or len(raw) != dtype.itemsize:
        raise BinFormatError("a numpy scalar that is not a boolean or uint8")
    return np.frombuffer(raw, dtype=dtype)[0]


def _latin1_bytes(text, encoding="latin1") -> bytes:
    """_codecs.encode as Python 3 pickles bytes in protocols 0-2: text encoded as latin-1, nothing else."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise BinFormatError(f"_codecs.encode with {type(text).__name__} and {encoding!r}")
    return text.encode("latin1")


class _DataOnlyUnpickler(pickle.Unpickler):
    """What the field's .bin writers pickle, and nothing that runs code: lists, tuples, bytes, strings and
    booleans need no global; numpy arrays of encoded images (cv2.imencode's, insightface's
    build_eval_pack.py) and numpy booleans are rebuilt by the checked stand-ins above, under numpy 1's and
    numpy 2's names; bytes of Python-3 protocol-2 pickles by _latin1_bytes. Any other global is refused."""
    ALLOWED = {
        **{(f"numpy.{core}.numeric", "_frombuffer"): _bin_array_from_buffer for core in ("core", "_core")},
        **{(f"numpy.{core}.multiarray", "_reconstruct"): _bin_empty_array for core in ("core", "_core")},
        **{(f"numpy.{core}.multiarray", "scalar"): _bin_scalar for core in ("core", "_core")},
        ("numpy", "ndarray"): _NDArrayName,
        ("numpy", "dtype"): _bin_dtype,
        ("_codecs", "encode"): _latin1_bytes,
    }

    def find_class(self, module, name):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise BinFormatError(f"refusing to load {module}.{name}: a verification .bin holds only "
                                 "a list of encoded images and a list of booleans") from None


def _encoded_bytes(item) -> "bytes | None":
    """An encoded image as bytes: bytes as pickled, or the 1-D uint8 array cv2.imencode returns."""
    if isinstance(item, (bytes, bytearray)):
        return bytes(item)
    if isinstance(item, np.ndarray) and item.dtype == np.uint8 and item.ndim in (1, 2) and item.size:
        return item.tobytes()
    return None


def load_bin(path: str, image_size: int = FACE_SIZE) -> "tuple[np.ndarray, np.ndarray]":
    """(images float32 (2P, 3, H, W) RGB 0..255, issame bool (P,)) from a .bin pair set.

    Images are decoded by data.faces.decode_face (RGB; JPEG warnings ignored, as OpenCV
    always did for these sets), resized bilinearly when not image_size square.
    """
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
    bins = [_encoded_bytes(item) for item in bins]
    if not all(item is not None for item in bins):
        raise BinFormatError(f"{path}: the image list holds something other than encoded images (bytes, or uint8 "
                             "arrays as cv2.imencode returns)")
    if not all(isinstance(s, (bool, np.bool_)) for s in issame) or len(bins) != 2 * len(issame):
        raise BinFormatError(f"{path}: expected {2 * len(issame)} images for {len(issame)} booleans, got {len(bins)}")
    images = np.empty((len(bins), 3, image_size, image_size), dtype=np.float32)
    for i, encoded in enumerate(bins):
        try:      # other sizes are resized, as InsightFace's loader does
            face = decode_face(encoded, f"{path}: image {i} (pair {i // 2})", image_size, resize=True,
                               strict=False, interpolation=cv2.INTER_LINEAR)
        except ImageError as error:
            raise BinFormatError(str(error)) from None
        images[i] = face.transpose(2, 0, 1)
    return images, np.asarray(issame, dtype=bool)


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


def ten_fold_accuracy(embeddings: np.ndarray, issame: np.ndarray, folds: int = 10) -> VerificationResult:
    """Threshold on squared distance chosen on folds-1 folds, accuracy on the held-out fold."""
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


class Verifier:
    """The configured .bin sets, loaded once, evaluated against a backbone's current parameters."""

    def __init__(self, paths, symbol: mx.sym.Symbol, ctx: mx.Context, batch_size: int = 64,
                 image_size: int = FACE_SIZE):
        self.sets = {os.path.splitext(os.path.basename(p))[0]: load_bin(p, image_size) for p in paths}
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
