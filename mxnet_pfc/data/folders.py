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

The index is a file in OUTPUT, which others may write, so it is checked, not
believed: every name in it must be one plain path component (no '/', '..' or
absolute path), the identities the folders ROOT holds now, the file names
image names; an index that fails is named and ROOT listed again. Each read
then takes a regular file under ROOT only (symlinks resolved), of at most
faces.MAX_IMAGE_BYTES: a file swapped after the listing cannot lead elsewhere.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import dataclass

import numpy as np

from mxnet_pfc.data.faces import ImageError, inside, read_file
from mxnet_pfc.data.records import DataError
from mxnet_pfc.runtime.errors import quoted
from mxnet_pfc.runtime.files import file_kind, opened_regular, printable, write_json
from mxnet_pfc.runtime.run_folder import RunFolder

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")
INDEX_VERSION = 1
MAX_INDEX_BYTES = 64 << 30     # the listing of 42M images is a few GB of JSON


@dataclass(frozen=True)
class FolderIndex:
    """The images of ROOT in class order: a source for iterators.ShardedIter.

    Image i is ROOT/identities[labels[i]]/<its file name>. The file names are held as one
    byte string and their ends (a few bytes an image beside the name itself), not a Python
    string each: a set of 42M images keeps its index in a few hundred MB.
    """
    root: str
    identities: "list[str]"           # class id -> folder name
    names: np.ndarray                 # uint8: every image's file name (os.fsencode), one after the other
    name_ends: np.ndarray             # int64: image i's name ends at name_ends[i] (and starts at name_ends[i - 1])
    labels: np.ndarray                # image i -> class id

    @classmethod
    def of(cls, root: str, listing: "list[tuple[str, list[str]]]") -> "FolderIndex":
        """The index of [(identity folder name, its image file names in order)], in that order."""
        encoded = [os.fsencode(name) for _, files in listing for name in files]
        ends = np.cumsum([len(name) for name in encoded], dtype=np.int64)
        labels = np.repeat(np.arange(len(listing), dtype=np.int32), [len(files) for _, files in listing])
        return cls(root, [name for name, _ in listing], np.frombuffer(b"".join(encoded), dtype=np.uint8), ends, labels)

    @property
    def num_classes(self) -> int:
        return len(self.identities)

    def __len__(self) -> int:
        return len(self.name_ends)

    def name(self, i: int) -> str:
        """Image i's file name."""
        start = int(self.name_ends[i - 1]) if i else 0
        return os.fsdecode(self.names[start:int(self.name_ends[i])].tobytes())

    def path(self, i: int) -> str:
        """Image i's path, relative to root."""
        return os.path.join(self.identities[self.labels[i]], self.name(i))

    @property
    def paths(self) -> "list[str]":
        """Every image's path relative to root, as a list (a Python string each: for small sets)."""
        return [self.path(i) for i in range(len(self))]

    @functools.cached_property
    def real_root(self) -> str:
        return os.path.realpath(self.root)

    def read(self, i: int) -> "tuple[bytes, float, str]":
        path = os.path.join(self.root, self.path(i))
        if not inside(self.real_root, path):
            raise DataError(f"{printable(path)} leads to {printable(os.path.realpath(path))}, outside "
                            f"{printable(self.root)}: only files under the image folder are read")
        try:
            return read_file(path, within=self.real_root), float(self.labels[i]), printable(path)
        except ImageError as error:
            raise DataError(str(error)) from None


SHOWN_SKIPPED = 5        # names shown per reason an entry was left out (all are counted)
OUTSIDE = "not a regular file under it"


def list_identities(root: str, report=None) -> "list[tuple[str, list[str]]]":
    """[(identity folder name, sorted image paths)] for every sub-folder with images.

    Only what lies under ROOT is read: a symlink (folder or image) is followed only when it
    resolves inside ROOT, and an image name must be a regular file (not a FIFO, a device or a
    folder). Hidden entries (.ipynb_checkpoints, .Trash-1000, .DS_Store: a name starting with
    '.') are never identities or images. Every entry left out is counted by reason, and
    `report(line)` (default: a logged warning) gets one line per reason with the first names.
    """
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a folder")
    real_root = os.path.realpath(root)
    identities, skipped = [], {}

    def skip(reason: str, what: str) -> None:
        skipped.setdefault(reason, []).append(printable(what))

    for entry in sorted_entries(root):
        if entry.name.startswith("."):
            skip("hidden", entry.path)
            continue
        if not entry.is_dir():
            continue                       # a file beside the identity folders (lfw.bin ...)
        if entry.is_symlink() and not inside(real_root, entry.path):
            skip(OUTSIDE, f"{printable(entry.path)} (a symlink to {printable(os.path.realpath(entry.path))}, "
                          f"outside {printable(root)})")
            continue
        images, folders = [], 0
        for image in sorted_entries(entry.path):
            if image.name.startswith("."):
                skip("hidden", image.path)
            elif image.is_dir():
                folders += 1
                skip("a folder inside an identity folder (its images are not read)", image.path)
            elif not image.name.lower().endswith(IMAGE_SUFFIXES):
                skip(f"not a {'/'.join(s[1:] for s in IMAGE_SUFFIXES)} image", image.path)
            elif image.is_symlink() and not inside(real_root, image.path):
                skip(OUTSIDE, f"{printable(image.path)} (a symlink to {printable(os.path.realpath(image.path))}, "
                              f"outside {printable(root)})")
            elif not image.is_file():
                skip(OUTSIDE, f"{printable(image.path)} ({file_kind(image.path)})")
            else:
                images.append(image.path)
        if images:
            identities.append((entry.name, images))
        else:
            skip("an identity folder without images" + (" (only sub-folders)" if folders else ""), entry.path)
    for line in describe_skipped(root, skipped):
        (report or log.warning)(line)
    if not identities:
        raise DataError(f"{root}: no identity sub-folders with images ({', '.join(IMAGE_SUFFIXES)})")
    return identities


def describe_skipped(root: str, skipped: "dict[str, list[str]]") -> "list[str]":
    """One line per reason entries of ROOT were left out: how many, and the first SHOWN_SKIPPED names."""
    return [f"{printable(root)}: skipped {len(names)} {'entry' if len(names) == 1 else 'entries'}, {reason}: "
            + ", ".join(names[:SHOWN_SKIPPED]) + (f" and {len(names) - SHOWN_SKIPPED} more"
                                                   if len(names) > SHOWN_SKIPPED else "")
            for reason, names in skipped.items()]


def sorted_entries(folder: str) -> "list[os.DirEntry]":
    with os.scandir(folder) as entries:
        return sorted(entries, key=lambda entry: entry.name)


def identity_folders(root: str) -> "list[tuple[str, int, bool]]":
    """(name, modification time, whether it lies under ROOT) of each sub-folder of ROOT, sorted
    (one stat each, no listing of their files; symlinks resolved)."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a folder (--images wants ROOT/<identity>/<image>)")
    real_root = os.path.realpath(root)
    with os.scandir(root) as entries:
        return sorted((entry.name, entry.stat().st_mtime_ns, not entry.is_symlink() or inside(real_root, entry.path))
                      for entry in entries if entry.is_dir())


def fingerprint(folders: "list[tuple[str, int, bool]]") -> str:
    """A hash of ROOT's identity folder names and their modification times."""
    digest = hashlib.sha256()
    for name, mtime, _ in folders:
        digest.update(f"{name}\0{mtime}\n".encode(errors="surrogateescape"))
    return digest.hexdigest()


def scan(root: str) -> FolderIndex:
    """List ROOT: identity folders with images (sorted), images sorted within each."""
    identities = list_identities(root)
    return FolderIndex.of(root, [(name, [os.path.basename(path) for path in images]) for name, images in identities])


def plain_name(name) -> bool:
    """Whether `name` is one path component (joined to a folder, it stays in that folder)."""
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def index_problem(saved: dict, folders: "set[str]") -> str:
    """'' when a saved index's lists can be used, else its first wrong entry, named."""
    names, files = saved.get("identities"), saved.get("files")
    if not isinstance(names, list) or not isinstance(files, list) or len(names) != len(files):
        return "'identities' and 'files' are not two lists of one length"
    for k, (name, images) in enumerate(zip(names, files)):
        if not plain_name(name) or name not in folders:
            return f"identities[{k}] = {quoted(name)} is not a folder under ROOT"
        if not isinstance(images, list) or not images:
            return f"files[{k}] is not a list of image names"
        for image in images:
            if not plain_name(image) or not image.lower().endswith(IMAGE_SUFFIXES):
                return f"files[{k}] holds {quoted(image)}, not an image name in {quoted(name)}"
    if names != sorted(set(names)):
        return "'identities' are not sorted and unique"
    return ""


def load_index(root: str, output: str, write: bool, set_number: int = 0) -> FolderIndex:
    """ROOT's index from OUTPUT/images-index.json (set S >= 1 of several: images-index-set-S.json) when it
    still matches ROOT, else a new listing (written there when `write`: rank 0 only, atomically, so ranks
    never read half a file)."""
    root = os.path.abspath(root)
    path = RunFolder(output).images_index_of(set_number)
    folders = identity_folders(root)
    current = fingerprint(folders)
    saved = None
    if os.path.exists(path):
        try:      # a cache: anything unreadable (a FIFO, a file nested too deeply) is rebuilt
            with opened_regular(path, MAX_INDEX_BYTES, "an images index", DataError) as (f, _):
                saved = json.load(f)
        except (OSError, ValueError, RecursionError):
            saved = None
    if isinstance(saved, dict) and saved.get("version") == INDEX_VERSION and saved.get("root") == root \
            and saved.get("fingerprint") == current and saved.get("suffixes") == list(IMAGE_SUFFIXES):
        problem = index_problem(saved, {name for name, _, under in folders if under})
        if not problem:
            index = FolderIndex.of(root, list(zip(saved["identities"], saved["files"])))
            log.info(f"images: {len(index)} images of {index.num_classes} identities in {root}, from the index {path}")
            return index
        log.warning(f"images: {path} is not used: {problem}; listing {root} again")
    elif saved:
        log.info(f"images: {root} changed since {path} was written (or it indexes another folder): listing it again")
    index = scan(root)
    log.info(f"images: listed {root}: {len(index)} images of {index.num_classes} identities"
             + (f", index written to {path}" if write else ""))
    if write:
        files = [[] for _ in index.identities]
        for i, label in enumerate(index.labels.tolist()):
            files[label].append(index.name(i))
        os.makedirs(output, exist_ok=True)
        write_json(path, {"version": INDEX_VERSION, "root": root, "fingerprint": current, "suffixes": IMAGE_SUFFIXES,
                          "identities": index.identities, "files": files}, indent=None)
    return index
