"""Reading the IJB-B / IJB-C test data in the layout InsightFace publishes it (docs/DESIGN.md 3.4).

ROOT/meta/<target>_face_tid_mid.txt        image name, template id, media id
ROOT/meta/<target>_name_5pts_score.txt     image name, 5 points (x y x y ...), detector score
ROOT/meta/<target>_template_pair_label.txt template 1, template 2, label (1 same subject)
ROOT/meta/<target>_1N_gallery_G1.csv, _G2  (IJB-B: _S1, _S2) and <target>_1N_probe_mixed.csv:
                                           CSV with a header, TEMPLATE_ID and SUBJECT_ID columns
ROOT/loose_crop/<image name>               the images
<target> is ijbc or ijbb (lower case, as published). Every problem is an
IjbDataError naming the file and, for a bad line, its line number: a run
over 470,000 images should stop before embedding, not after.

The meta files come with the set, from others, so their image names are
checked, not followed: a name is a relative path under ROOT/loose_crop (not
absolute, no '..'), and only a regular file that resolves under that folder
(symlinks followed) is read, of at most faces.MAX_FRAME_PIXELS pixels.
"""
from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass

import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE, MAX_FRAME_PIXELS, ImageError, decode_image, inside, read_file
from mxnet_pfc.eval.align import align, landmark_problem
from mxnet_pfc.runtime.errors import PfcError, quoted
from mxnet_pfc.runtime.files import opened_regular

GALLERIES = {"ijbc": ("G1", "G2"), "ijbb": ("S1", "S2")}


class IjbDataError(PfcError, ValueError):
    """A missing or malformed IJB meta file or image; the message names file and line."""


MAX_META_BYTES = 4 << 30      # IJB-C's largest list (15.7M template pairs) is ~0.4 GB


def meta_path(root: str, target: str, suffix: str) -> str:
    return os.path.join(root, "meta", f"{target.lower()}_{suffix}")


def _text(path: str) -> str:
    """The file's text; a file that is not UTF-8 text (a binary file, an image) named, with the offending byte."""
    try:
        with opened_regular(path, MAX_META_BYTES, "an IJB meta file", IjbDataError) as (f, size):
            raw = f.read(size + 1)          # a FIFO or /dev/zero in meta/ is refused, not read forever
    except OSError as error:
        raise IjbDataError(f"{path}: cannot be read: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise IjbDataError(f"{path}: not a text file (byte {error.start} is not UTF-8 text)") from None
    if "\0" in text:
        raise IjbDataError(f"{path}: not a text file (byte {text.index(chr(0))} is a NUL)")
    return text


def _lines(path: str):
    """(line number, fields) of each non-blank line, split on white space."""
    for number, line in enumerate(_text(path).splitlines(), 1):
        if line.strip():
            yield number, line.split()


def _numbers(path: str, number: int, fields: "list[str]", kind, count: int, what: str) -> list:
    if len(fields) != count:
        raise IjbDataError(f"{path}:{number}: expected {count} fields ({what}), got {len(fields)}")
    try:
        return [kind(f) for f in fields]
    except ValueError:
        raise IjbDataError(f"{path}:{number}: expected {what}, got {quoted(' '.join(fields))}") from None


@dataclass
class Faces:
    """The images of the set, in the order of the meta files, with their template, media, points and score."""
    names: "list[str]"
    templates: np.ndarray     # int64 (N,)
    medias: np.ndarray        # int64 (N,)
    landmarks: np.ndarray     # float64 (N, 5, 2)
    scores: np.ndarray        # float64 (N,) detector (faceness) score
    where: "list[str]"        # "file:line" of each image's landmarks, for error messages


def read_faces(root: str, target: str) -> Faces:
    """Both per-image files, checked to list the same images in the same order, landmarks usable."""
    tid_path, pts_path = meta_path(root, target, "face_tid_mid.txt"), meta_path(root, target, "name_5pts_score.txt")
    names, templates, medias = [], [], []
    for number, fields in _lines(tid_path):
        if len(fields) != 3:
            raise IjbDataError(f"{tid_path}:{number}: expected 3 fields (image, template id, media id), "
                               f"got {len(fields)}")
        template, media = _numbers(tid_path, number, fields[1:], int, 2, "integer template and media ids")
        if os.path.isabs(fields[0]) or ".." in fields[0].split("/"):
            raise IjbDataError(f"{tid_path}:{number}: image name {fields[0]!r} leads out of "
                               f"{os.path.join(root, 'loose_crop')}: image names are paths under it")
        names.append(fields[0])
        templates.append(template)
        medias.append(media)
    landmarks, scores, where = [], [], []
    for index, (number, fields) in enumerate(_lines(pts_path)):
        values = _numbers(pts_path, number, fields[1:], float, 11, "10 landmark coordinates and a score")
        if index >= len(names) or fields[0] != names[index]:
            listed = names[index] if index < len(names) else "nothing (the list is shorter)"
            raise IjbDataError(f"{pts_path}:{number}: image {fields[0]}, but {tid_path} lists {listed} "
                               f"as image {index + 1}: the two files must list the same images in order")
        points = np.array(values[:10]).reshape(5, 2)
        problem = landmark_problem(points)
        if problem:
            raise IjbDataError(f"{pts_path}:{number}: {fields[0]}: {problem}")
        if not (np.isfinite(values[10]) and values[10] >= 0):     # it weights the image's feature (ijb.py)
            raise IjbDataError(f"{pts_path}:{number}: {fields[0]}: detector score {fields[11]}: expected a "
                               "finite number of at least 0")
        landmarks.append(points)
        scores.append(values[10])
        where.append(f"{pts_path}:{number}")
    if len(landmarks) != len(names):
        raise IjbDataError(f"{pts_path}: lists {len(landmarks)} images, {tid_path} lists {len(names)}")
    if not names:
        raise IjbDataError(f"{tid_path}: lists no images")
    _check_images_exist(os.path.join(root, "loose_crop"), names, where)
    return Faces(names, np.array(templates, dtype=np.int64), np.array(medias, dtype=np.int64),
                 np.array(landmarks).reshape(-1, 5, 2), np.array(scores), where)


def _check_images_exist(folder: str, names: "list[str]", where: "list[str]") -> None:
    """Every listed image is a file under the folder, checked before any is embedded (one listing of the
    folder; a symlink is resolved, and one that leads out of the folder is named)."""
    try:
        present = {entry.name: entry.is_symlink() for entry in os.scandir(folder)}
    except OSError as error:
        raise IjbDataError(f"{folder}: the images' folder cannot be read ({error.strerror})") from None
    real_folder = os.path.realpath(folder)
    for name, listed in zip(names, where):
        path = os.path.join(folder, name)
        if present.get(name, True) and not inside(real_folder, path):     # names may hold a sub-folder
            raise IjbDataError(f"{path} (listed at {listed}) leads to {os.path.realpath(path)}, outside {folder}: "
                               "only images under it are read")
        if name not in present and not os.path.isfile(path):
            raise IjbDataError(f"{path} (listed at {listed}): no such file")


def read_pairs(root: str, target: str, known_templates) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
    """(template 1, template 2, label 0/1) of each 1:1 pair; templates must be in the face list."""
    path = meta_path(root, target, "template_pair_label.txt")
    known = set(int(t) for t in known_templates)
    rows = []
    for number, fields in _lines(path):
        first, second, label = _numbers(path, number, fields, int, 3, "two integer template ids and a 0/1 label")
        if label not in (0, 1):
            raise IjbDataError(f"{path}:{number}: label {label}, expected 0 or 1")
        for template in (first, second):
            if template not in known:
                raise IjbDataError(f"{path}:{number}: template {template} has no image in the face list")
        rows.append((first, second, label))
    if not rows:
        raise IjbDataError(f"{path}: lists no pairs")
    labels = {label for _, _, label in rows}
    if labels != {0, 1}:
        raise IjbDataError(f"{path}: every pair is labelled {labels.pop()}: TAR at FAR needs both same-subject (1) "
                           "and different-subject (0) pairs")
    pairs = np.array(rows, dtype=np.int64)
    return pairs[:, 0], pairs[:, 1], pairs[:, 2]


def read_subjects(path: str, known_templates) -> "tuple[np.ndarray, np.ndarray]":
    """(templates, subjects) of a 1:N gallery or probe CSV, one entry per template (rows are per image)."""
    known = set(int(t) for t in known_templates)
    rows = list(csv.reader(io.StringIO(_text(path), newline="")))
    if not rows:
        raise IjbDataError(f"{path}: empty, expected a header with TEMPLATE_ID and SUBJECT_ID")
    header = [name.strip().upper() for name in rows[0]]
    if "TEMPLATE_ID" not in header or "SUBJECT_ID" not in header:
        raise IjbDataError(f"{path}:1: the header {quoted(rows[0])} has no TEMPLATE_ID and SUBJECT_ID columns")
    t_col, s_col = header.index("TEMPLATE_ID"), header.index("SUBJECT_ID")
    subject_of = {}
    for number, row in enumerate(rows[1:], 2):
        if not row:
            continue
        if len(row) <= max(t_col, s_col):
            raise IjbDataError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
        try:
            template, subject = int(row[t_col]), int(row[s_col])
        except ValueError:
            raise IjbDataError(f"{path}:{number}: TEMPLATE_ID and SUBJECT_ID must be integers, got "
                               f"{quoted(row[t_col])}, {quoted(row[s_col])}") from None
        if template not in known:
            raise IjbDataError(f"{path}:{number}: template {template} has no image in the face list")
        if subject_of.setdefault(template, subject) != subject:
            raise IjbDataError(f"{path}:{number}: template {template} is given subjects "
                               f"{subject_of[template]} and {subject}")
    if not subject_of:
        raise IjbDataError(f"{path}: lists no templates")
    templates = np.array(sorted(subject_of), dtype=np.int64)
    return templates, np.array([subject_of[t] for t in templates], dtype=np.int64)


def one_to_n_paths(root: str, target: str) -> "dict[str, str]":
    """{gallery name or 'probe': path}; {} when none of the 1:N files is there, an error when only some are."""
    galleries = GALLERIES.get(target.lower(), ("G1", "G2"))
    paths = {g: meta_path(root, target, f"1N_gallery_{g}.csv") for g in galleries}
    paths["probe"] = meta_path(root, target, "1N_probe_mixed.csv")
    present = [p for p in paths.values() if os.path.exists(p)]
    if present and len(present) != len(paths):
        missing = [p for p in paths.values() if not os.path.exists(p)]
        raise IjbDataError(f"{missing[0]}: missing (the other 1:N files are there)")
    return paths if present else {}


def check_mates(one_to_n: dict, paths: "dict[str, str]") -> None:
    """Each gallery has probes whose subject is in it and probes whose subject is not: open-set TPIR at FPIR
    (and the CMC) need both."""
    probe_subjects = one_to_n["probe"][1] if one_to_n else None
    for name, (_, subjects) in one_to_n.items():
        mated = np.isin(probe_subjects, subjects)
        if name != "probe" and (mated.all() or not mated.any()):
            raise IjbDataError(f"{paths['probe']}: {'every' if mated.all() else 'no'} probe's subject is in gallery "
                               f"{name} ({paths[name]}): TPIR at FPIR needs probes of both kinds")


def aligned_face(root: str, faces: Faces, index: int, size: int = FACE_SIZE) -> np.ndarray:
    """RGB uint8 (size, size, 3) of image `index`, aligned by its five points."""
    folder = os.path.join(root, "loose_crop")
    path = os.path.join(folder, faces.names[index])
    source = f"{path} (listed at {faces.where[index]})"
    try:
        # published JPEGs: decoded as OpenCV does; a loose crop may be larger than a face (MAX_FRAME_PIXELS)
        image = decode_image(read_file(path, within=os.path.realpath(folder)), source, strict=False,
                             max_pixels=MAX_FRAME_PIXELS)
    except ImageError as error:
        message = str(error)
        if not message.startswith(source):     # read_file names the path only
            message = message.replace(path, source, 1)
        raise IjbDataError(message) from None
    return align(image, faces.landmarks[index], size)
