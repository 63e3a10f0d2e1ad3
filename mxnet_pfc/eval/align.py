"""Five-point face alignment to the ArcFace 112x112 template (docs/DESIGN.md section 3.4).

The IJB sets (and most detectors) give five points per face: left eye, right
eye, nose tip, left and right mouth corner, in image pixels. The face is
aligned by the similarity transform (rotation, uniform scale, shift; no
reflection) that maps those points onto ARCFACE_TEMPLATE in the least-squares
sense (Umeyama 1991), then warped with cv2.warpAffine, as InsightFace's IJB
scripts do with skimage's SimilarityTransform.
"""
from __future__ import annotations

import cv2
import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.runtime.errors import PfcError

# where the five points sit in a 112x112 ArcFace crop (x, y): the template's own frame, whatever the face size
ARCFACE_TEMPLATE_SIZE = 112
ARCFACE_TEMPLATE = np.array([[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366],
                             [41.5493, 92.3655], [70.7299, 92.2041]], dtype=np.float64)
MIN_SPREAD = 1e-2      # smaller / larger singular value of the centred points below this: (nearly) collinear
MIN_SIZE = 1e-3        # larger singular value below this (pixels): the points coincide


class LandmarkError(PfcError, ValueError):
    """Five points that do not define a similarity transform."""


def landmark_problem(points: np.ndarray) -> str:
    """Why five (x, y) points define no transform, or '' when they do."""
    points = np.asarray(points, dtype=np.float64)
    if points.shape != (5, 2):
        return f"expected 5 points (x, y), got shape {points.shape}"
    if not np.all(np.isfinite(points)):
        return "a landmark coordinate is not a finite number"
    spread = np.linalg.svd(points - points.mean(axis=0), compute_uv=False)
    if spread[0] < MIN_SIZE:
        return "the five landmarks coincide"
    if spread[1] < MIN_SPREAD * spread[0]:
        return "the five landmarks lie on a line"
    return ""


def similarity_transform(src: np.ndarray, dst: np.ndarray = ARCFACE_TEMPLATE) -> np.ndarray:
    """The 2x3 matrix M of the similarity (no reflection) taking src to dst in least squares.

    dst ~ M @ [x, y, 1]. LandmarkError when src is degenerate (see landmark_problem).
    """
    src, dst = np.asarray(src, dtype=np.float64), np.asarray(dst, dtype=np.float64)
    problem = landmark_problem(src)
    if problem:
        raise LandmarkError(problem)
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    covariance = dst_c.T @ src_c / len(src)
    u, singular, vt = np.linalg.svd(covariance)
    # a reflection would fit mirrored points better; a face is never mirrored, so force det(R) = +1
    d = np.array([1.0, np.sign(np.linalg.det(u) * np.linalg.det(vt)) or 1.0])
    rotation = u @ np.diag(d) @ vt
    scale = float(np.sum(singular * d) / np.mean(np.sum(src_c ** 2, axis=1)))
    shift = dst_mean - scale * rotation @ src_mean
    return np.hstack([scale * rotation, shift[:, None]])


def warp(image: np.ndarray, matrix: np.ndarray, size: int = FACE_SIZE) -> np.ndarray:
    """The size x size crop of `image` under the 2x3 `matrix` (bilinear, black outside)."""
    return cv2.warpAffine(image, matrix, (size, size), flags=cv2.INTER_LINEAR, borderValue=0.0)


def align(image: np.ndarray, points: np.ndarray, size: int = FACE_SIZE) -> np.ndarray:
    """The aligned size x size face of `image` whose five landmarks are `points`."""
    template = ARCFACE_TEMPLATE * (size / ARCFACE_TEMPLATE_SIZE)
    return warp(image, similarity_transform(points, template), size)
