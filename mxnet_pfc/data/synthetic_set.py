"""A synthetic face-like data set: identities are random draws of a parametric face.

Each identity is a parameter vector (colours of skin, hair, eyes and mouth; face
shape; positions and sizes of eyes, nose and mouth; a skin texture). Each image
of it adds nuisance the model must learn to ignore: background, shift, scale,
rotation, lighting (brightness and a gain per colour channel), colour cast and
pixel noise. The nuisance is strong enough that an untrained network does
little better than chance on held-out pairs. A model that learns to read
the parameters generalises to identities it never saw, which is what the
held-out verification .bin measures.

generate() writes train.rec, train.idx, property (the InsightFace layout) and
val.bin (pairs of held-out identities, the verification format); the trainer
calls ensure(), and `python -m mxnet_pfc.data.synthetic` (data/synthetic.py)
is the command.
"""
from __future__ import annotations

import logging
import os
import pickle
import time

import cv2
import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.data.records import DataError, RecordWriter
from mxnet_pfc.runtime.files import atomic_path

log = logging.getLogger(__name__)

COMPLETE = "COMPLETE"
OWNER = ".generated-by-mxnet-pfc"     # written first into a folder the generator makes or finds empty
VERSION = 4           # of the image family: a set made by another version is made again
RENDER_SIZE = 56      # shapes are drawn at half resolution, then resized (4x less work)
# identity parameters: name -> (low, high) of a uniform draw
PARAMETERS = {
    "skin": (0.15, 1.0, 3), "hair": (0.0, 0.8, 3), "eye": (0.0, 0.6, 3), "mouth": (0.2, 1.0, 3),
    "face_w": (0.45, 0.72, 1), "face_h": (0.62, 0.88, 1), "hairline": (-0.75, -0.2, 1),
    "eye_y": (-0.3, 0.05, 1), "eye_dx": (0.18, 0.4, 1), "eye_r": (0.07, 0.18, 1),
    "nose": (0.1, 0.35, 1), "mouth_y": (0.32, 0.6, 1), "mouth_w": (0.15, 0.42, 1), "mouth_h": (0.05, 0.13, 1),
    "stripe_freq": (2.0, 9.0, 1), "stripe_angle": (0.0, np.pi, 1), "stripe_amp": (0.1, 0.4, 1),
}


def draw_identities(rng: np.random.Generator, count: int) -> "dict[str, np.ndarray]":
    return {name: rng.uniform(low, high, size=(count, width)) for name, (low, high, width) in PARAMETERS.items()}


def _soft(inside: np.ndarray, sharpness: float = 40.0) -> np.ndarray:
    """A mask with anti-aliased edges from a signed 'inside' value (> 0 inside)."""
    return 0.5 + 0.5 * np.tanh(np.clip(inside, -1, 1) * (sharpness / 2))


def render(ids: "dict[str, np.ndarray]", rng: np.random.Generator) -> np.ndarray:
    """One image per row of `ids`: uint8 (M, FACE_SIZE, FACE_SIZE, 3), with random nuisance."""
    return render_with_landmarks(ids, rng)[0]


def render_with_landmarks(ids: "dict[str, np.ndarray]", rng: np.random.Generator) -> "tuple[np.ndarray, np.ndarray]":
    """(render(ids, rng), landmarks (M, 5, 2)): where the eyes, the nose tip and the mouth corners of each
    image are, in its pixels (x, y), as the renderer placed them (the IJB test set, data/synthetic_ijb.py)."""
    m = len(ids["skin"])
    points = _landmarks(ids)
    ids = {name: value.astype(np.float32) for name, value in ids.items()}
    def draw(low, high, shape):
        return rng.uniform(low, high, size=shape).astype(np.float32)
    grid = ((np.arange(RENDER_SIZE, dtype=np.float32) + 0.5) / RENDER_SIZE * 2 - 1)
    gy, gx = np.meshgrid(grid, grid, indexing="ij")
    # nuisance: shift, scale, rotation -> face coordinates (u, v) of every pixel
    shift = draw(-0.08, 0.08, (m, 2, 1, 1))
    scale = draw(0.9, 1.1, (m, 1, 1))
    angle = draw(-0.17, 0.17, (m, 1, 1))
    x, y = gx[None] - shift[:, 0], gy[None] - shift[:, 1]
    u = (np.cos(angle) * x + np.sin(angle) * y) / scale
    v = (-np.sin(angle) * x + np.cos(angle) * y) / scale

    p = {name: value[:, :, None, None] if value.shape[1] == 3 else value[:, 0, None, None]
         for name, value in ids.items()}
    face = _soft(1 - (u / p["face_w"]) ** 2 - (v / p["face_h"]) ** 2)
    hair = face * _soft(p["hairline"] - v)
    eyes = sum(_soft(1 - ((u - side * p["eye_dx"]) ** 2 + (v - p["eye_y"]) ** 2) / p["eye_r"] ** 2) for side in (-1, 1))
    nose = _soft(1 - (u / 0.03) ** 2 - ((v - p["eye_y"] - p["nose"] / 2 - 0.05) / (p["nose"] / 2)) ** 2)
    mouth = _soft(1 - (u / p["mouth_w"]) ** 2 - ((v - p["mouth_y"]) / p["mouth_h"]) ** 2)
    along = np.cos(p["stripe_angle"]) * u + np.sin(p["stripe_angle"]) * v
    stripes = p["stripe_amp"] * np.sin(p["stripe_freq"] * np.pi * along)

    def paint(base, mask, colour):
        return base * (1 - mask[:, None]) + colour * mask[:, None]

    # nuisance: a background of random colour and gradient direction per image
    background, slope = draw(0.0, 1.0, (m, 3, 1, 1)), draw(-0.3, 0.3, (m, 2, 1, 1))
    image = background * (1 + slope[:, :1] * gx[None, None] + slope[:, 1:] * gy[None, None])
    image = paint(image, face, p["skin"] * (1 + stripes[:, None]))
    image = paint(image, hair, p["hair"])
    image = paint(image, np.clip(eyes, 0, 1), p["eye"])
    image = paint(image, nose, p["skin"] * 0.7)
    image = paint(image, mouth, p["mouth"])
    # nuisance: lighting (brightness and colour temperature: a gain per channel), colour cast, noise
    image = image * draw(0.8, 1.2, (m, 1, 1, 1)) * draw(0.85, 1.15, (m, 3, 1, 1)) + draw(-0.05, 0.05, (m, 3, 1, 1))
    image += rng.standard_normal(size=image.shape, dtype=np.float32) * 0.04
    image = np.stack([cv2.resize(one, (FACE_SIZE, FACE_SIZE), interpolation=cv2.INTER_LINEAR)
                      for one in image.transpose(0, 2, 3, 1)])
    # the five points moved as the face was: (x, y) = scale R^-1 (u, v) + shift on the grid, then in pixels
    cos, sin, size = np.cos(angle)[:, 0, 0, None], np.sin(angle)[:, 0, 0, None], scale[:, 0, 0, None]
    point_u, point_v = points[..., 0], points[..., 1]
    on_grid = np.stack([size * (cos * point_u - sin * point_v) + shift[:, 0, 0, 0, None],
                        size * (sin * point_u + cos * point_v) + shift[:, 1, 0, 0, None]], axis=2)
    return (np.clip(image, 0, 1) * 255 + 0.5).astype(np.uint8), (on_grid + 1) * (FACE_SIZE / 2) - 0.5


def _landmarks(ids: "dict[str, np.ndarray]") -> np.ndarray:
    """(M, 5, 2) face coordinates (u, v) of the eyes, the nose tip and the mouth corners of render's shapes.

    On screen x grows to the right, so the image's left eye has u < 0; the nose tip is the lower end of
    the nose ellipse (centre eye_y + nose / 2 + 0.05, half height nose / 2).
    """
    eye_dx, eye_y, mouth_w, mouth_y = (ids[name][:, 0] for name in ("eye_dx", "eye_y", "mouth_w", "mouth_y"))
    zero = np.zeros(len(eye_dx))
    u = np.stack([-eye_dx, eye_dx, zero, -mouth_w, mouth_w], axis=1)
    v = np.stack([eye_y, eye_y, eye_y + ids["nose"][:, 0] + 0.05, mouth_y, mouth_y], axis=1)
    return np.stack([u, v], axis=2)


def encode(image_rgb: np.ndarray) -> bytes:
    ok, buffer = cv2.imencode(".jpg", image_rgb[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 92])
    assert ok
    return buffer.tobytes()


def _select(ids: "dict[str, np.ndarray]", rows: np.ndarray) -> "dict[str, np.ndarray]":
    return {name: value[rows] for name, value in ids.items()}


def _rendered(ids: "dict[str, np.ndarray]", rows: np.ndarray, rng: np.random.Generator, desc: str, chunk: int = 256):
    """One image of identity rows[i] for each i, in order, rendered `chunk` at a time (bounded memory)."""
    for start in tqdm(range(0, len(rows), chunk), desc=desc, unit="chunk", leave=False):
        yield from render(_select(ids, rows[start:start + chunk]), rng)


def write_training_set(folder: str, identities: int, images_per_identity: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    ids = draw_identities(rng, identities)
    labels = np.repeat(np.arange(identities), images_per_identity)
    writer = RecordWriter(folder, len(labels), identities)
    for label, image in zip(labels, _rendered(ids, labels, rng, "train.rec")):
        writer.add(int(label), encode(image))
    writer.close((FACE_SIZE, FACE_SIZE))


def write_verification_set(path: str, identities: int, pairs: int, seed: int) -> None:
    """pairs/2 same-identity and pairs/2 different-identity pairs of unseen identities."""
    rng = np.random.default_rng(seed)
    ids = draw_identities(rng, identities)
    half = pairs // 2
    same = rng.integers(0, identities, size=half)
    first = rng.integers(0, identities, size=half)
    second = (first + rng.integers(1, identities, size=half)) % identities    # never equal to first
    left = np.concatenate([same, first])
    right = np.concatenate([same, second])
    issame = [True] * half + [False] * half
    order = rng.permutation(len(issame))
    left, right, issame = left[order], right[order], [issame[i] for i in order]
    rows = np.stack([left, right], axis=1).ravel()              # pair i -> images 2i, 2i+1
    bins = [encode(image) for image in _rendered(ids, rows, rng, "val.bin")]
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        pickle.dump((bins, issame), f, protocol=pickle.HIGHEST_PROTOCOL)


def generate(folder: str, identities: int = 500, images_per_identity: int = 32, val_identities: int = 250,
             val_pairs: int = 1000, seed: int = 0) -> None:
    """The training set and the held-out verification set (different seeds: disjoint identities).

    COMPLETE is written last: a folder without it is unfinished. Only a folder
    that is missing, empty, or made by this generator (OWNER) is written to:
    anything else may be a user's own set, and generating over it would destroy it.
    """
    claim_folder(folder)
    stale = os.path.join(folder, COMPLETE)
    if os.path.exists(stale):
        os.remove(stale)
    write_training_set(folder, identities, images_per_identity, seed)
    write_verification_set(os.path.join(folder, "val.bin"), val_identities, val_pairs, seed + 1_000_003)
    with open(os.path.join(folder, COMPLETE), "w") as f:
        f.write(_stamp(identities, images_per_identity, val_pairs, seed))


def check_claimable(folder: str) -> None:
    """Raise DataError if `folder` holds files the generator did not write (read-only: every rank may ask)."""
    present = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    if present and OWNER not in present and COMPLETE not in present:     # COMPLETE: sets made before OWNER existed
        shown = ", ".join(present[:5]) + (" ..." if len(present) > 5 else "")
        raise DataError(f"{folder}: refusing to generate a synthetic set here: the folder holds files this tool did "
                        f"not write ({shown}). Generation writes only into an empty folder or one it made; "
                        f"choose another folder for it")


def claim_folder(folder: str) -> None:
    """Make `folder` the generator's (OWNER), or raise DataError if it holds files the generator did not write."""
    check_claimable(folder)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, OWNER), "w") as f:
        f.write("This folder holds a synthetic set written by mxnet_pfc.data.synthetic; it may be rewritten.\n")


def _stamp(identities: int, images_per_identity: int, val_pairs: int, seed: int) -> str:
    return (f"version={VERSION} identities={identities} images_per_identity={images_per_identity} "
            f"val_pairs={val_pairs} seed={seed}\n")


def is_complete(folder: str, identities: int, images_per_identity: int, val_pairs: int = 1000, seed: int = 0) -> bool:
    """True when `folder` holds a finished set generated with these parameters."""
    try:
        return open(os.path.join(folder, COMPLETE)).read() == _stamp(identities, images_per_identity, val_pairs, seed)
    except OSError:
        return False


def ensure(folder: str, identities: int, images_per_identity: int, val_pairs: int, local_rank: int,
           wait_seconds: float = 1800) -> None:
    """Generate the set once per host (local rank 0); the other ranks of the host wait for it.

    Every rank first checks that the folder may be written (never over a set
    this tool did not write), so a refusal reaches all of them. The wait is
    on files, not a collective (no stall warnings). A failed generation
    leaves FAILED with its reason, so the waiting ranks stop at once.
    """
    failed = os.path.join(folder, "FAILED")
    wanted = (folder, identities, images_per_identity, val_pairs)
    if is_complete(*wanted):
        return
    check_claimable(folder)
    if local_rank == 0:
        log.info(f"generating the synthetic set in {folder} ({identities} identities x {images_per_identity} "
                 f"images, held-out val.bin); done once")
        started = time.time()
        claim_folder(folder)
        if os.path.exists(failed):
            os.remove(failed)
        try:
            generate(folder, identities, images_per_identity, val_identities=max(2, val_pairs // 4),
                     val_pairs=val_pairs)
        except Exception as error:
            with open(failed, "w") as f:
                f.write(f"{type(error).__name__}: {error}\n")
            raise
        log.info(f"synthetic set written in {time.time() - started:.0f} s")
        return
    deadline = time.time() + wait_seconds
    while not is_complete(*wanted):
        if os.path.exists(failed):
            raise DataError(f"{folder}: generating the synthetic set failed on local rank 0: "
                            f"{open(failed).read().strip()}")
        if time.time() > deadline:
            raise DataError(f"{folder}: the synthetic set did not appear within {wait_seconds:.0f} s")
        time.sleep(1)
