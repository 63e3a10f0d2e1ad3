"""Label noise found with sub-centers: the rule of sub-center ArcFace's cleaning step, for one class.

Sub-center ArcFace (Deng et al., ECCV 2020) trains K centers per class; the clean
faces of a class gather at one of them (the dominant one), its noisy images at
the others. The cleaning step (insightface recognition/subcenter_arcface,
drop.py) then keeps, for each class, the images within a threshold angle of its
dominant sub-center (75 degrees in the paper's recipe), drops the others and
the non-dominant sub-centers, and leaves out a class left without images.
Here, for one class at a time (the rank that owns a class's centers runs it on
that class's images): every image is assigned its nearest sub-center; the
dominant one is the sub-center most images are nearest to (the first among
equals, as numpy's argmax); an image is kept when its cosine to the dominant
sub-center exceeds cos(threshold). Numpy only: no MXNet, no collectives.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mxnet_pfc.runtime.vectors import unit_rows

DEFAULT_THRESHOLD = 75.0        # degrees: the paper's and drop.py's


@dataclass(frozen=True)
class ClassVerdict:
    """What the rule says of one class's images."""
    dominant: int           # the dominant sub-center, 0 .. K - 1
    angles: np.ndarray      # each image's angle to it, in degrees
    kept: np.ndarray        # bool per image: within the threshold


def judge_class(embeddings: np.ndarray, subcenters: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> ClassVerdict:
    """The verdict on one class: `embeddings` (n, D) of its images, `subcenters` (K, D) its centers."""
    if not 0.0 < threshold <= 180.0:
        raise ValueError(f"threshold {threshold!r}: an angle in degrees, in (0, 180]")
    x, w = unit_rows(embeddings), unit_rows(subcenters)
    cosines = x @ w.T                                   # (n, K)
    nearest = np.argmax(cosines, axis=1) if len(x) else np.zeros(0, dtype=np.int64)
    dominant = int(np.argmax(np.bincount(nearest, minlength=len(w))))
    to_dominant = np.clip(cosines[:, dominant], -1.0, 1.0) if len(x) else np.zeros(0)
    return ClassVerdict(dominant, np.degrees(np.arccos(to_dominant)),
                        to_dominant > np.cos(np.radians(threshold)))
