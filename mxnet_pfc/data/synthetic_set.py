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

import json
import logging
import os
import pickle
import time
from dataclasses import dataclass

import cv2
import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.data.records import DataError, RecordWriter
from mxnet_pfc.runtime.files import RecordFileError, atomic_path, read_record_bytes

log = logging.getLogger(__name__)

COMPLETE = "COMPLETE"
PLANTED = "planted.json"              # the ground truth of a planted set (Planted)
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


@dataclass(frozen=True)
class Planted:
    """What a synthetic set is made with on purpose, for the tests of data cleaning and of overlap between
    sets; planted.json beside the set records every case, as the ground truth. Defaults: a clean set."""
    label_noise: float = 0.0      # the share of training images labelled as another identity
    split_identities: int = 0     # identities whose images are split over two labels (the second ones numbered
                                  # after every identity's own)
    shared: int = 0               # identities drawn as those of another synthetic set ...
    shared_seed: int = 0          # ... the one made with this seed
    shared_identities: int = 0    # and this many identities (its COMPLETE stamp states both: shared_from)

    def stamp(self) -> str:
        """What COMPLETE adds for a planted set ('' for a clean one: the stamps of clean sets are unchanged)."""
        if self == Planted():
            return ""
        return (f" label_noise={self.label_noise!r} split_identities={self.split_identities} shared={self.shared} "
                f"shared_seed={self.shared_seed} shared_identities={self.shared_identities}")

    def check(self, identities: int, images_per_identity: int) -> None:
        problems = []
        if not 0.0 <= self.label_noise < 1.0:
            problems.append(f"label noise {self.label_noise!r} is not a share in [0, 1)")
        if not 0 <= self.split_identities <= identities:
            problems.append(f"{self.split_identities} split identities of {identities}")
        if self.split_identities and images_per_identity < 2:
            problems.append("a split identity needs at least 2 images")
        if not 0 <= self.shared <= min(identities, self.shared_identities):
            problems.append(f"{self.shared} shared identities, but this set has {identities} and the other "
                            f"{self.shared_identities}")
        if problems:
            raise DataError("synthetic set: " + "; ".join(problems))


def shared_from(folder: str, count: int) -> Planted:
    """Planted(shared=count) with the seed and identity count of the synthetic set in `folder` (its stamp)."""
    try:
        stamp = read_record_bytes(os.path.join(folder, COMPLETE), 4096).decode("ascii")
        fields = dict(item.split("=", 1) for item in stamp.split())
        return Planted(shared=count, shared_seed=int(fields["seed"]), shared_identities=int(fields["identities"]))
    except (OSError, RecordFileError, UnicodeDecodeError, ValueError, KeyError):
        raise DataError(f"{folder}: not a finished synthetic set (no readable {COMPLETE} stamp) to share "
                        "identities with") from None


def plant(identities: int, images_per_identity: int, seed: int, planted: Planted):
    """(identity parameters, each image's identity, each image's label, planted.json's content).

    The plan draws from its own stream, so the identities of a clean set are those of the same seed
    planted. Every label keeps an image of its own identity (noise never takes a label's first image)."""
    ids = draw_identities(np.random.default_rng(seed), identities)
    draws = np.random.default_rng([seed, 0x5EED])
    shared_pairs = []
    if planted.shared:
        other = draw_identities(np.random.default_rng(planted.shared_seed), planted.shared_identities)
        here = np.sort(draws.choice(identities, planted.shared, replace=False))
        there = draws.choice(planted.shared_identities, planted.shared, replace=False)
        for name in ids:
            ids[name][here] = other[name][there]
        shared_pairs = [[int(a), int(b)] for a, b in zip(here, there)]
    identity = np.repeat(np.arange(identities), images_per_identity)
    label = identity.copy()
    keep = set(range(0, len(identity), images_per_identity))          # each identity's first image
    split = np.sort(draws.choice(identities, planted.split_identities, replace=False))
    for j, who in enumerate(split):
        own = np.flatnonzero(identity == who)
        label[own[len(own) // 2:]] = identities + j
        keep.add(int(own[len(own) // 2]))
    owner = np.concatenate([np.arange(identities), split])             # label -> its identity
    candidates = np.array(sorted(set(range(len(identity))) - keep), dtype=np.int64)
    noisy = np.sort(draws.choice(candidates, min(len(candidates), round(planted.label_noise * len(identity))),
                                 replace=False))
    for i in noisy:
        wrong = np.flatnonzero(owner != identity[i])
        label[i] = draws.choice(wrong)
    truth = {"noise": [], "split": [{"identity": int(who), "labels": [int(who), identities + j]}
                                    for j, who in enumerate(split)],
             "shared": {"seed": planted.shared_seed, "identities": planted.shared_identities, "pairs": shared_pairs}}
    return ids, identity, label, noisy, truth


def write_training_set(folder: str, identities: int, images_per_identity: int, seed: int,
                       planted: Planted = Planted()) -> None:
    """train.rec, .idx and property; for a planted set planted.json too: each mislabelled image by its
    record key (its identity and the label it carries), each split identity's two labels, each shared
    identity as (label here, label in the other set)."""
    planted.check(identities, images_per_identity)
    ids, identity, label, noisy, truth = plant(identities, images_per_identity, seed, planted)
    rng = np.random.default_rng(seed)
    draw_identities(rng, identities)           # the image stream follows the identities' draws, as it always has
    order = np.argsort(label, kind="stable")   # the writer takes images label by label
    num_labels = identities + planted.split_identities
    writer = RecordWriter(folder, len(label), num_labels)
    noisy_set = set(noisy.tolist())
    for key, (position, image) in enumerate(zip(order, _rendered(ids, identity[order], rng, "train.rec")), 1):
        writer.add(int(label[position]), encode(image))
        if position in noisy_set:
            truth["noise"].append({"key": key, "identity": int(identity[position]), "label": int(label[position])})
    extra = {PLANTED: json.dumps(truth).encode()} if planted != Planted() else None
    writer.close((FACE_SIZE, FACE_SIZE), extra)


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
             val_pairs: int = 1000, seed: int = 0, planted: Planted = Planted()) -> None:
    """The training set and the held-out verification set (different seeds: disjoint identities).

    COMPLETE is written last: a folder without it is unfinished. Only a folder
    that is missing, empty, or made by this generator (OWNER) is written to:
    anything else may be a user's own set, and generating over it would destroy it.
    """
    claim_folder(folder)
    stale = os.path.join(folder, COMPLETE)
    if os.path.exists(stale):
        os.remove(stale)
    if os.path.exists(os.path.join(folder, PLANTED)):
        os.remove(os.path.join(folder, PLANTED))
    write_training_set(folder, identities, images_per_identity, seed, planted)
    write_verification_set(os.path.join(folder, "val.bin"), val_identities, val_pairs, seed + 1_000_003)
    with open(os.path.join(folder, COMPLETE), "w") as f:
        f.write(_stamp(identities, images_per_identity, val_pairs, seed, planted))


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


def _stamp(identities: int, images_per_identity: int, val_pairs: int, seed: int, planted: Planted = Planted()) -> str:
    return (f"version={VERSION} identities={identities} images_per_identity={images_per_identity} "
            f"val_pairs={val_pairs} seed={seed}{planted.stamp()}\n")


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
