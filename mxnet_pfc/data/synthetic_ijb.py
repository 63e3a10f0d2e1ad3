"""A small synthetic test set in InsightFace's IJB layout, for the tests of mxnet_pfc.ijb.

Faces come from the synthetic renderer (data/synthetic_set.py), so a model trained
on the synthetic training set reads them. The renderer says where each
render's eyes, nose tip and mouth corners are (render_with_landmarks); the
generator places the render in a larger "loose
crop" by a random similarity (offset, scale, rotation), and writes the five
points moved by that same similarity, a detector score, several media per
template, 1:1 pairs, two galleries with disjoint subjects and mixed probes.
"""
from __future__ import annotations

import os

import cv2
import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.data.synthetic_set import draw_identities, render_with_landmarks

LOOSE = 160            # side of a loose crop, pixels


def loose_crop(image: np.ndarray, rng: np.random.Generator) -> "tuple[np.ndarray, np.ndarray]":
    """(LOOSE x LOOSE crop holding the face moved by a random similarity, that similarity's 2x3 matrix)."""
    scale = rng.uniform(0.9, 1.3)
    angle = rng.uniform(-0.35, 0.35)
    c, s = scale * np.cos(angle), scale * np.sin(angle)
    centre = np.array([LOOSE / 2, LOOSE / 2]) + rng.uniform(-10, 10, size=2)
    linear = np.array([[c, -s], [s, c]])
    shift = centre - linear @ np.array([FACE_SIZE / 2, FACE_SIZE / 2])
    matrix = np.hstack([linear, shift[:, None]])
    background = tuple(int(x) for x in rng.integers(0, 256, size=3))
    crop = cv2.warpAffine(image, matrix, (LOOSE, LOOSE), flags=cv2.INTER_LINEAR, borderValue=background)
    return crop, matrix


def write_ijb(root: str, target: str = "IJBC", subjects: int = 24, templates_per_subject: int = 3,
              seed: int = 0) -> dict:
    """Write the set under root; returns what a test needs to check it (ids, matrices, landmarks, renders)."""
    rng = np.random.default_rng(seed)
    prefix = target.lower()
    galleries = ("G1", "G2") if prefix == "ijbc" else ("S1", "S2")
    os.makedirs(os.path.join(root, "meta"), exist_ok=True)
    os.makedirs(os.path.join(root, "loose_crop"), exist_ok=True)
    ids = draw_identities(rng, subjects)
    face_lines, point_lines, members = [], [], {}
    truth = {"renders": [], "matrices": [], "landmarks": [], "names": []}
    template, media = 1, 1
    subject_of = {}
    for subject in range(subjects):
        for _ in range(templates_per_subject):
            subject_of[template] = subject
            for _ in range(rng.integers(1, 4)):                   # media per template
                frames = int(rng.integers(1, 3))                   # images per media (frames of a video)
                rows = np.full(frames, subject)
                images, points = render_with_landmarks({k: v[rows] for k, v in ids.items()}, rng)
                for image, five in zip(images, points):
                    crop, matrix = loose_crop(image, rng)
                    moved = five @ matrix[:, :2].T + matrix[:, 2]
                    name = f"{len(face_lines) + 1}.jpg"
                    ok, encoded = cv2.imencode(".jpg", crop[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
                    assert ok
                    with open(os.path.join(root, "loose_crop", name), "wb") as f:
                        f.write(encoded.tobytes())
                    face_lines.append(f"{name} {template} {media}")
                    point_lines.append(f"{name} " + " ".join(f"{x:.3f}" for x in moved.ravel())
                                       + f" {rng.uniform(0.6, 1.0):.4f}")
                    members.setdefault(template, []).append(name)
                    for key, value in zip(("renders", "matrices", "landmarks", "names"), (image, matrix, five, name)):
                        truth[key].append(value)
                media += 1
            template += 1
    _write(root, f"{prefix}_face_tid_mid.txt", face_lines)
    _write(root, f"{prefix}_name_5pts_score.txt", point_lines)
    # 1:1 pairs: every same-subject pair of templates, and as many different-subject pairs
    all_templates = sorted(subject_of)
    same = [(a, b) for i, a in enumerate(all_templates) for b in all_templates[i + 1:]
            if subject_of[a] == subject_of[b]]
    different = []
    while len(different) < 4 * len(same):
        a, b = rng.choice(all_templates, size=2, replace=False)
        if subject_of[a] != subject_of[b]:
            different.append((int(a), int(b)))
    _write(root, f"{prefix}_template_pair_label.txt",
           [f"{a} {b} 1" for a, b in same] + [f"{a} {b} 0" for a, b in different])
    # 1:N: each subject's first template enrols it in G1 (even subjects) or G2 (odd); the others are probes
    header = "TEMPLATE_ID,SUBJECT_ID,FILENAME"
    rows = {g: [header] for g in galleries}
    probes = [header]
    for t in all_templates:
        subject = subject_of[t]
        first = t == min(x for x in all_templates if subject_of[x] == subject)
        target_rows = rows[galleries[subject % 2]] if first else probes
        target_rows += [f"{t},{subject},{name}" for name in members[t]]
    for g in galleries:
        _write(root, f"{prefix}_1N_gallery_{g}.csv", rows[g])
    _write(root, f"{prefix}_1N_probe_mixed.csv", probes)
    truth["subject_of"] = subject_of
    return truth


def _write(root: str, name: str, lines: "list[str]") -> None:
    with open(os.path.join(root, "meta", name), "w") as f:
        f.write("\n".join(lines) + "\n")
