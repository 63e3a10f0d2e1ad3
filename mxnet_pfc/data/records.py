"""The InsightFace RecordIO layout (docs/DESIGN.md section 3.1): writing and reading its index.

Record 0 is a header with label (first_identity_record, end). Records
1 .. first_identity_record-1 are images (label = class id, payload = encoded
image); records first_identity_record .. end-1 describe one identity each
(label = (first_image, end_image)). Sets without the header are plain image lists.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE, ImageError, decode_face
from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.files import read_regular_file

# RecordIO labels are float32, which names every integer up to 2^24 exactly (not beyond): class ids 0 .. MAX_CLASSES - 1
MAX_CLASSES = 2 ** (np.finfo(np.float32).nmant + 1)


class DataError(PfcError, ValueError):
    """A data set that cannot be read as described: names the file and the problem."""


@dataclass(frozen=True)
class RecordSet:
    rec_path: str
    idx_path: str
    image_records: np.ndarray      # record indices of images, in file order
    num_identities: int | None     # from the header's identity records; None without a header


def read_property(folder: str) -> "tuple[int, int, int]":
    """(num_classes, height, width) from the `property` file."""
    path = os.path.join(folder, "property")
    try:
        text = read_regular_file(path, 4096, "a property file", DataError).decode("utf-8", "replace")
        fields = [int(v) for v in text.strip().split(",")]
        num_classes, height, width = fields
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: expected 'num_classes,112,112' ({error})") from None
    check_class_count(num_classes, path)
    return num_classes, height, width


def check_class_count(num_classes: int, source: str) -> None:
    """Refuse no classes, and more than float32 labels can name exactly (RecordIO labels are float32)."""
    if num_classes < 1:
        raise DataError(f"{source}: states {num_classes} identities: a training set has at least one")
    if num_classes > MAX_CLASSES:
        raise DataError(f"{source}: states {num_classes:,} identities, but RecordIO labels are float32 and "
                        f"name class ids exactly only up to 2^24 = {MAX_CLASSES:,}: this set cannot "
                        "be read correctly (split it, or train from an image folder with --images)")


def open_records(rec_path: str, idx_path: str | None = None) -> "tuple[mx.recordio.MXIndexedRecordIO, RecordSet]":
    """Open train.rec/train.idx and find the image records, with or without the header."""
    idx_path = idx_path or os.path.splitext(rec_path)[0] + ".idx"
    for path in (rec_path, idx_path):
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file")
    with open(idx_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        last = b"\n"
        if f.tell():
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            raise DataError(f"{idx_path}: the last line is cut off (no newline at the end): the index is truncated")
    try:
        reader = mx.recordio.MXIndexedRecordIO(idx_path, rec_path, "r")
    except (IndexError, ValueError) as error:
        raise DataError(f"{idx_path}: a line is not 'record<TAB>byte offset' ({error}): the index is damaged") from None
    if not reader.keys:
        raise DataError(f"{idx_path}: empty index")
    check_offsets(reader, rec_path, idx_path)
    first = min(reader.keys)
    raw = read_record(reader, first, rec_path)
    try:
        header, _ = mx.recordio.unpack(raw)
    except (ValueError, TypeError, struct.error) as error:
        raise DataError(f"{rec_path}: record {first} (byte {reader.idx[first]}) has a header that does not "
                        f"unpack: {error}") from None
    if header.flag > 0 and first == 0:
        label = np.asarray(header.label, dtype=np.float64).ravel()
        if label.size < 2 or not np.isfinite(label[:2]).all():
            raise DataError(f"{rec_path}: header record has label {label.tolist()}, "
                            "expected (first_identity_record, end)")
        first_identity, end = (int(v) for v in label[:2])
        if not 1 <= first_identity <= end:
            raise DataError(f"{rec_path}: header record has label ({first_identity}, {end}), "
                            "expected 1 <= first_identity_record <= end")
        # The header's numbers are claims: checked against the index (itself checked against the
        # .rec's size above) before anything is allocated by them.
        if len(reader.keys) < end:
            raise DataError(f"{rec_path}: the header record claims {end:,} records ({first_identity - 1:,} images, "
                            f"{end - first_identity:,} identities), but {idx_path} lists {len(reader.keys):,}: "
                            "the header is damaged or the index is truncated")
        identities = end - first_identity
        check_class_count(identities, f"{rec_path} (header record)")
        images = np.arange(1, first_identity, dtype=np.int64)
    else:
        images = np.array(sorted(reader.keys), dtype=np.int64)
        identities = None
    return reader, RecordSet(rec_path, idx_path, images, identities)


RECORD_MAGIC = 0xCED7230A      # dmlc RecordIO: every record starts with it, then a 32-bit length word


def check_offsets(reader: mx.recordio.MXIndexedRecordIO, rec_path: str, idx_path: str) -> None:
    """Refuse a .rec shorter than its index says (a cut copy), before training starts.

    Cheap: the offsets are in memory, and only the last record's 8-byte head is read.
    """
    size = os.path.getsize(rec_path)
    keys = np.fromiter(reader.idx.keys(), dtype=np.int64, count=len(reader.idx))
    offsets = np.fromiter(reader.idx.values(), dtype=np.int64, count=len(reader.idx))
    negative = offsets < 0
    if negative.any():
        first = int(np.flatnonzero(negative)[0])
        raise DataError(f"{idx_path}: record {keys[first]} has byte offset {offsets[first]}, before the start of "
                        f"{rec_path}: the index is damaged")
    order = np.argsort(offsets, kind="stable")
    shared = np.flatnonzero(np.diff(offsets[order]) == 0)
    if shared.size:
        a, b = int(order[shared[0]]), int(order[shared[0] + 1])
        raise DataError(f"{idx_path}: records {keys[a]} and {keys[b]} both start at byte {offsets[a]}: the index is "
                        "damaged (each record has its own place in the .rec)")
    beyond = offsets + 8 > size
    if beyond.any():
        first = int(np.flatnonzero(beyond)[offsets[beyond].argmin()])
        raise DataError(f"{rec_path}: is {size} bytes, but {idx_path} places {int(beyond.sum())} of its "
                        f"{len(offsets)} records at or beyond that (first: record {keys[first]} at byte "
                        f"{offsets[first]}): the .rec is truncated")
    last = int(offsets.argmax())
    key, offset = int(keys[last]), int(offsets[last])
    with open(rec_path, "rb") as f:
        f.seek(offset)
        magic, length_word = np.frombuffer(f.read(8), dtype="<u4")
    end = offset + 8 + (int(length_word) & ((1 << 29) - 1))
    if magic != RECORD_MAGIC or end > size:
        raise DataError(f"{rec_path}: the last record ({key}, at byte {offset}) "
                        + ("does not start with the RecordIO magic number" if magic != RECORD_MAGIC
                           else f"ends at byte {end}, past the end of the file ({size} bytes)")
                        + ": the .rec is truncated or does not match its index")


def read_record(reader: mx.recordio.MXIndexedRecordIO, key: int, rec_path: str) -> bytes:
    """The raw record `key`; a damaged one is named with its byte offset."""
    try:
        raw = reader.read_idx(key)
    except mx.base.MXNetError as error:
        raise DataError(f"{rec_path}: record {key} (byte {reader.idx.get(key)}) cannot be read: "
                        f"{str(error).strip().splitlines()[-1]}") from None
    if raw is None:
        raise DataError(f"{rec_path}: record {key} (byte {reader.idx.get(key)}) is past the end of the file")
    return raw


def unpack_image_record(raw: bytes, key: int, offset: int, rec_path: str) -> "tuple[bytes, float, str]":
    """(encoded image, class id, where) of an image record; a header that does not unpack is a DataError."""
    where = f"{rec_path}: record {key} (byte {offset})"
    try:
        header, payload = mx.recordio.unpack(raw)
        label = image_label(header)
    except (ValueError, TypeError, struct.error) as error:      # too short, or a malformed array label
        raise DataError(f"{where} has a header that does not unpack: {error}") from None
    return payload, label, where


def decode_image_record(raw: bytes, key: int, offset: int, rec_path: str, num_classes: int,
                        image_size: "tuple[int, int]") -> "tuple[np.ndarray, float]":
    """(RGB image, class id) of an image record (see decode_item); anything wrong is a DataError naming its position."""
    return decode_item(*unpack_image_record(raw, key, offset, rec_path), num_classes, image_size)


def decode_item(payload: bytes, label: float, where: str, num_classes: int,
                image_size: "tuple[int, int]") -> "tuple[np.ndarray, float]":
    """(RGB image, class id) of one training item, checked as training checks it: a class id in
    [0, num_classes), a face decoded strictly at image_size (faces.decode_face, no resize).

    The one check of an item, for the training iterator (any source) and the check command.
    """
    if not (0 <= label < num_classes and label == int(label)):
        raise DataError(f"{where} has label {label}, outside the classes [0, {num_classes})")
    try:
        image = decode_face(payload, where, image_size)
    except ImageError as error:
        raise DataError(str(error)) from None
    return image, label


def check_identity_count(records: RecordSet, num_classes: int) -> None:
    """Refuse a set whose header lists more identities than the run's classes."""
    if records.num_identities is not None and records.num_identities > num_classes:
        raise DataError(f"{records.rec_path}: the header lists {records.num_identities} identities, "
                        f"more than num_classes = {num_classes}")


def image_label(header: mx.recordio.IRHeader) -> float:
    """An image record's class id: its label, or the first element of an array label."""
    label = header.label
    return float(label if np.isscalar(label) else np.asarray(label).ravel()[0])


class RecordWriter:
    """Writes the header, images identity by identity, then the identity records.

    The counts are known up front so that the header is physically the first
    record, as in the sets users have. Images must arrive with class ids
    0, 1, 2 ... in order. Files appear only on close(): each is written under a
    name of this process (NAME.tmpPID) and renamed; abort() removes them.
    """

    def __init__(self, folder: str, num_images: int, num_identities: int, prefix: str = "train"):
        check_class_count(num_identities, os.path.join(folder, prefix + ".rec"))
        os.makedirs(folder, exist_ok=True)
        self.folder = folder
        self.rec_path = os.path.join(folder, prefix + ".rec")
        self.idx_path = os.path.join(folder, prefix + ".idx")
        self._tag = f".tmp{os.getpid()}"
        self._tmps = [self.rec_path + self._tag, self.idx_path + self._tag]     # renamed in this order
        self._writer = mx.recordio.MXIndexedRecordIO(self._tmps[1], self._tmps[0], "w")
        self._num_images, self._num_identities = num_images, num_identities
        first_identity = num_images + 1
        header = mx.recordio.IRHeader(0, [float(first_identity), float(first_identity + num_identities)], 0, 0)
        self._writer.write_idx(0, mx.recordio.pack(header, b""))
        self._next = 1
        self._ranges: list[tuple[int, int]] = []     # (first_image, end_image) per identity

    def add(self, class_id: int, encoded: bytes) -> None:
        if not 0 <= class_id < MAX_CLASSES:
            raise DataError(f"class id {class_id:,}: RecordIO labels are float32, exact only for class ids "
                            f"below 2^24 = {MAX_CLASSES:,}; a set with more identities cannot be written")
        if class_id == len(self._ranges):
            self._ranges.append((self._next, self._next))
        elif class_id != len(self._ranges) - 1:
            raise ValueError(f"images must come identity by identity: got class {class_id} "
                             f"after {len(self._ranges) - 1}")
        if self._next > self._num_images:
            raise ValueError(f"more than the {self._num_images} images announced")
        header = mx.recordio.IRHeader(0, float(class_id), self._next, 0)
        self._writer.write_idx(self._next, mx.recordio.pack(header, encoded))
        self._ranges[-1] = (self._ranges[-1][0], self._next + 1)
        self._next += 1

    def close(self, image_size: "tuple[int, int]" = (FACE_SIZE, FACE_SIZE),
              extra: "dict[str, bytes] | None" = None) -> None:
        """Identity records, `property` and the `extra` files ({name: bytes}); then all appear at once."""
        if self._next != self._num_images + 1 or len(self._ranges) != self._num_identities:
            raise ValueError(f"announced {self._num_images} images of {self._num_identities} identities, "
                             f"got {self._next - 1} of {len(self._ranges)}")
        for offset, (start, end) in enumerate(self._ranges):
            header = mx.recordio.IRHeader(0, [float(start), float(end)], self._next + offset, 0)
            self._writer.write_idx(self._next + offset, mx.recordio.pack(header, b""))
        self._writer.close()
        files = {"property": f"{len(self._ranges)},{image_size[0]},{image_size[1]}\n".encode(), **(extra or {})}
        for name, data in files.items():
            self._tmps.append(os.path.join(self.folder, name) + self._tag)
            with open(self._tmps[-1], "wb") as f:
                f.write(data)
        for tmp in self._tmps:
            os.replace(tmp, tmp[:-len(self._tag)])

    def abort(self) -> None:
        """Close and remove what was written: nothing of this writer remains."""
        self._writer.close()
        for tmp in self._tmps:
            if os.path.exists(tmp):
                os.remove(tmp)
