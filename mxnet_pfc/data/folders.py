"""Training straight from an image folder ROOT/<identity>/<image>, without packing it.

The layout is the one data.pack reads (and arcface_torch's ImageFolder):
identities are the sorted sub-folder names that hold images, with class ids
0 .. C-1, and images are sorted by name within each. Item i of the list is
served to iterators.ShardedIter, so epoch order, rank slices, mirroring and
the damaged-image policy are those of a RecordIO set; packing the same folder
gives the same items in the same order.

Listing millions of files takes minutes, so the list is kept in
OUTPUT/images-index.json: ROOT (absolute), a fingerprint of ROOT, the identity
folder names and each one's image file names. The fingerprint is a hash of the
identity folder names and of each folder's modification time, which changes
when a file in it is added, removed or renamed (one stat per identity, no
listing); a run whose ROOT has another fingerprint lists it again and says so.
Editing an image in place changes neither; such a file is read as it now is.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from .faces import ImageError, read_file
from .pack import IMAGE_SUFFIXES, list_identities
from .records import DataError

log = logging.getLogger(__name__)

INDEX_NAME = "images-index.json"
INDEX_VERSION = 1


@dataclass(frozen=True)
class FolderIndex:
    """The images of ROOT in class order: a source for iterators.ShardedIter."""
    root: str
    identities: "list[str]"           # class id -> folder name
    paths: "list[str]"                # image i, relative to root
    labels: np.ndarray                # image i -> class id

    @property
    def num_classes(self) -> int:
        return len(self.identities)

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, i: int) -> "tuple[bytes, float, str]":
        path = os.path.join(self.root, self.paths[i])
        try:
            return read_file(path), float(self.labels[i]), path
        except ImageError as error:
            raise DataError(str(error)) from None


def fingerprint(root: str) -> str:
    """A hash of ROOT's identity folder names and their modification times (no listing of their files)."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a folder (--images wants ROOT/<identity>/<image>)")
    digest = hashlib.sha256()
    with os.scandir(root) as entries:
        folders = sorted((entry.name, entry.stat().st_mtime_ns) for entry in entries if entry.is_dir())
    for name, mtime in folders:
        digest.update(f"{name}\0{mtime}\n".encode())
    return digest.hexdigest()


def scan(root: str) -> FolderIndex:
    """List ROOT: identity folders with images (sorted), images sorted within each."""
    identities = list_identities(root)
    paths, labels = [], []
    for class_id, (name, images) in enumerate(identities):
        paths += [os.path.join(name, os.path.basename(path)) for path in images]
        labels += [class_id] * len(images)
    return FolderIndex(root, [name for name, _ in identities], paths, np.array(labels, dtype=np.int64))


def load_index(root: str, output: str, write: bool) -> FolderIndex:
    """ROOT's index from OUTPUT/images-index.json when it still matches ROOT, else a new listing
    (written there when `write`: rank 0 only, atomically, so ranks never read half a file)."""
    root = os.path.abspath(root)
    path = os.path.join(output, INDEX_NAME)
    current = fingerprint(root)
    saved = None
    if os.path.exists(path):
        try:
            saved = json.load(open(path))
        except (OSError, ValueError):
            saved = None
    if saved and saved.get("version") == INDEX_VERSION and saved.get("root") == root \
            and saved.get("fingerprint") == current and saved.get("suffixes") == list(IMAGE_SUFFIXES):
        names, files = saved["identities"], saved["files"]
        paths = [os.path.join(name, f) for name, images in zip(names, files) for f in images]
        labels = np.repeat(np.arange(len(names), dtype=np.int64), [len(images) for images in files])
        log.info(f"images: {len(paths)} images of {len(names)} identities in {root}, from the index {path}")
        return FolderIndex(root, names, paths, labels)
    if saved:
        log.info(f"images: {root} changed since {path} was written (or it indexes another folder): listing it again")
    index = scan(root)
    log.info(f"images: listed {root}: {len(index)} images of {index.num_classes} identities"
             + (f", index written to {path}" if write else ""))
    if write:
        files = [[] for _ in index.identities]
        for relative, label in zip(index.paths, index.labels):
            files[label].append(os.path.basename(relative))
        os.makedirs(output, exist_ok=True)
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"version": INDEX_VERSION, "root": root, "fingerprint": current, "suffixes": IMAGE_SUFFIXES,
                       "identities": index.identities, "files": files}, f)
        os.replace(tmp, path)
    return index
