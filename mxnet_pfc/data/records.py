"""The InsightFace RecordIO layout (docs/DESIGN.md section 3.1): writing and reading its index.

Record 0 is a header with label (first_identity_record, end). Records
1 .. first_identity_record-1 are images (label = class id, payload = encoded
image); records first_identity_record .. end-1 describe one identity each
(label = (first_image, end_image)). Sets without the header are plain image lists.
"""
from __future__ import annotations

import os
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from mxnet_pfc.data.errors import DataError  # noqa: F401  (raised here; imported from here by many)
from mxnet_pfc.data.faces import FACE_SIZE, ImageError, decode_face
from mxnet_pfc.runtime.files import read_regular_file

# RecordIO labels are float32, which names every integer up to 2^24 exactly (not beyond): class ids 0 .. MAX_CLASSES - 1
MAX_CLASSES = 2 ** (np.finfo(np.float32).nmant + 1)


@dataclass(frozen=True)
class RecordSet:
    rec_path: str
    idx_path: str
    image_records: np.ndarray      # record numbers of images, in file order (uint32: 4 bytes an image)
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


def open_records(rec_path: str, idx_path: str | None = None) -> "tuple[RecordFile, RecordSet]":
    """Open train.rec/train.idx and find the image records, with or without the header."""
    idx_path = idx_path or os.path.splitext(rec_path)[0] + ".idx"
    for path in (rec_path, idx_path):
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file")
    reader = RecordFile(rec_path, idx_path, *read_index(idx_path))
    try:
        return reader, find_images(reader)
    except BaseException:
        reader.close()
        raise


def read_index(idx_path: str) -> "tuple[np.ndarray, np.ndarray]":
    """(record numbers, byte offsets) of a .idx file ('record<TAB>byte offset' lines), as int64 arrays in file
    order: parsed by NumPy's reader, with no Python object per line (MXNet's reader made a dict)."""
    with open(idx_path, "rb") as f:
        f.seek(0, os.SEEK_END)
        last = b"\n"
        if f.tell():
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
        if last != b"\n":
            raise DataError(f"{idx_path}: the last line is cut off (no newline at the end): the index is truncated")
        f.seek(0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)           # an empty file: refused below
                table = np.loadtxt(f, dtype=np.int64, delimiter="\t", comments=None, ndmin=2)
        except ValueError as error:
            raise DataError(f"{idx_path}: a line is not 'record<TAB>byte offset' ({error}): "
                            "the index is damaged") from None
    if not table.size:
        raise DataError(f"{idx_path}: empty index")
    if table.shape[1] != 2:
        raise DataError(f"{idx_path}: a line is not 'record<TAB>byte offset' ({table.shape[1]} columns): "
                        "the index is damaged")
    return table[:, 0], table[:, 1].copy()      # the numbers as a view: dropped when they are 0 .. n-1


def find_images(reader: "RecordFile") -> RecordSet:
    """The image records of an open set: 1 .. first_identity_record-1 after a header, else every record."""
    rec_path, idx_path = reader.rec_path, reader.idx_path
    check_offsets(reader, rec_path, idx_path)
    first = reader.first_key
    raw = read_record(reader, first, rec_path)
    try:
        header, _ = mx.recordio.unpack(raw)
    except (ValueError, TypeError, struct.error) as error:
        raise DataError(f"{rec_path}: record {first} (byte {reader.offset(first)}) has a header that does not "
                        f"unpack: {error}") from None
    # record numbers fit 32 bits in every set there is: 4 bytes an image
    number_type = np.uint32 if 0 <= reader.first_key and reader.last_key < 2 ** 32 else np.int64
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
        if reader.lines < end:
            raise DataError(f"{rec_path}: the header record claims {end:,} records ({first_identity - 1:,} images, "
                            f"{end - first_identity:,} identities), but {idx_path} lists {reader.lines:,}: "
                            "the header is damaged or the index is truncated")
        identities = end - first_identity
        check_class_count(identities, f"{rec_path} (header record)")
        images = np.arange(1, first_identity, dtype=number_type)
    else:
        images = reader.sorted_keys().astype(number_type)
        identities = None
    return RecordSet(rec_path, idx_path, images, identities)


RECORD_MAGIC = 0xCED7230A      # dmlc RecordIO: every record starts with it, then a 32-bit length word
LENGTH_BITS = 29               # the length word: 3 bits of continuation flag, 29 of length
WHOLE, FIRST, MIDDLE, LAST = range(4)     # the flag: a record in one part, or the parts of a split one
_IMAGE_HEADER = struct.Struct("<IfQQ")      # MXNet's IRHeader: flag (array label length), label, id, id2


class RecordFile:
    """A .rec read at the byte offsets its .idx gives; the index held as NumPy arrays, not a dict.

    The offsets of record numbers first .. first+n-1 (what every writer makes: 0 .. n-1) are one
    int64 array, 8 bytes a record; other numbering adds the sorted numbers (16). A read is a few
    os.pread calls on one descriptor, so any number of threads read at once. A record the dmlc
    writer split (its payload held the magic number) is joined as dmlc's reader joins it.
    `idx` is a read-only mapping record number -> byte offset, as MXNet's reader had.
    """

    def __init__(self, rec_path: str, idx_path: str, keys: np.ndarray, offsets: np.ndarray):
        self._fd = -1
        self.rec_path, self.idx_path, self.lines = rec_path, idx_path, len(keys)
        if len(keys) and (keys == np.arange(keys[0], keys[0] + len(keys))).all():
            self._keys, self.offsets = None, offsets           # record number k is at offsets[k - first_key]
            self.first_key, self.last_key = int(keys[0]), int(keys[-1])
        else:
            order = np.argsort(keys, kind="stable")
            self._keys, self.offsets = keys[order], offsets[order]
            twice = np.flatnonzero(np.diff(self._keys) == 0)
            if twice.size:
                raise DataError(f"{idx_path}: record {self._keys[twice[0]]} is listed twice: the index is damaged")
            self.first_key, self.last_key = int(self._keys[0]), int(self._keys[-1])
        self._fd = os.open(rec_path, os.O_RDONLY | os.O_CLOEXEC)

    def key_at(self, i: int) -> int:
        """The record number of offsets[i]."""
        return self.first_key + int(i) if self._keys is None else int(self._keys[i])

    def sorted_keys(self) -> np.ndarray:
        """Every record number, ascending (one per offset)."""
        if self._keys is None:
            return np.arange(self.first_key, self.last_key + 1, dtype=np.int64)
        return self._keys

    def offset(self, key: int) -> int:
        """The byte offset of record `key`; KeyError if the index does not list it."""
        key = int(key)
        if self._keys is None:
            if not self.first_key <= key <= self.last_key:
                raise KeyError(key)
            return int(self.offsets[key - self.first_key])
        at = int(np.searchsorted(self._keys, key))
        if at == len(self._keys) or self._keys[at] != key:
            raise KeyError(key)
        return int(self.offsets[at])

    @property
    def idx(self) -> "RecordOffsets":
        return RecordOffsets(self)

    def read(self, key: int) -> bytes:
        """The payload of record `key`; DataError naming it (and its byte offset) when it cannot be read."""
        try:
            offset = self.offset(key)
        except KeyError:
            raise DataError(f"{self.rec_path}: record {key} is not in {self.idx_path}: the index is damaged") from None
        where = f"{self.rec_path}: record {key} (byte {offset})"
        parts, at = [], offset
        while True:
            head = os.pread(self._fd, 8, at)
            if not head and at == offset:
                raise DataError(f"{where} is past the end of the file")
            if len(head) < 8:
                raise DataError(f"{where} cannot be read: the file ends inside its RecordIO header (byte {at})")
            magic, word = struct.unpack("<II", head)
            flag, length = word >> LENGTH_BITS, word & ((1 << LENGTH_BITS) - 1)
            if magic != RECORD_MAGIC or flag > LAST:
                raise DataError(f"{where} cannot be read: no RecordIO record header at byte {at} "
                                "(the .rec is damaged or does not match its index)")
            payload = os.pread(self._fd, length, at + 8)
            if len(payload) < length:
                raise DataError(f"{where} cannot be read: the file ends inside it (a part of {length} bytes at "
                                f"byte {at})")
            parts.append(payload)
            if flag in (WHOLE, LAST):
                return RECORD_MAGIC.to_bytes(4, "little").join(parts)
            at += 8 + (length + 3) // 4 * 4            # parts are padded to 4 bytes

    read_idx = read           # MXNet's name

    def read_label(self, key: int) -> float:
        """The class id of image record `key` (image_label), reading its first bytes only: a pass over the
        labels of millions of records reads 40 bytes of each, not its image. A record whose first part is
        too short to hold the header (split by the writer there) is read whole."""
        try:
            offset = self.offset(key)
        except KeyError:
            raise DataError(f"{self.rec_path}: record {key} is not in {self.idx_path}: the index is damaged") from None
        head = os.pread(self._fd, 8 + _IMAGE_HEADER.size + 4, offset)
        if len(head) >= 8:
            magic, word = struct.unpack("<II", head[:8])
            if magic == RECORD_MAGIC and word & ((1 << LENGTH_BITS) - 1) >= _IMAGE_HEADER.size + 4:
                flag, label, _, _ = _IMAGE_HEADER.unpack_from(head, 8)
                if flag > 0:           # an array label: its first element, after the header
                    label = struct.unpack_from("<f", head, 8 + _IMAGE_HEADER.size)[0]
                return float(label)
        raw = self.read(key)            # names what is wrong with it, or joins a split record
        return unpack_image_record(raw, key, offset, self.rec_path)[1]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self):
        self.close()


class RecordOffsets(Mapping):
    """Record number -> byte offset of a RecordFile, read from its arrays."""

    def __init__(self, reader: RecordFile):
        self._reader = reader

    def __getitem__(self, key) -> int:
        return self._reader.offset(key)

    def __iter__(self):
        return (int(key) for key in self._reader.sorted_keys())

    def __len__(self) -> int:
        return len(self._reader.offsets)


def check_offsets(reader: RecordFile, rec_path: str, idx_path: str) -> None:
    """Refuse an index with a negative or shared offset, and a .rec shorter than its index says (a cut
    copy), before training starts.

    Cheap: the offsets are in memory (in the usual file order a record starts after the one before,
    so one pass shows none is shared), and only the last record's 8-byte head is read.
    """
    size = os.path.getsize(rec_path)
    offsets, key = reader.offsets, reader.key_at
    negative = offsets < 0
    if negative.any():
        first = int(np.flatnonzero(negative)[0])
        raise DataError(f"{idx_path}: record {key(first)} has byte offset {offsets[first]}, before the start of "
                        f"{rec_path}: the index is damaged")
    if not (offsets[1:] > offsets[:-1]).all():
        order = np.argsort(offsets, kind="stable")
        shared = np.flatnonzero(np.diff(offsets[order]) == 0)
        if shared.size:
            a, b = int(order[shared[0]]), int(order[shared[0] + 1])
            raise DataError(f"{idx_path}: records {key(a)} and {key(b)} both start at byte {offsets[a]}: the index "
                            "is damaged (each record has its own place in the .rec)")
    beyond = offsets + 8 > size
    if beyond.any():
        first = int(np.flatnonzero(beyond)[offsets[beyond].argmin()])
        raise DataError(f"{rec_path}: is {size} bytes, but {idx_path} places {int(beyond.sum())} of its "
                        f"{len(offsets)} records at or beyond that (first: record {key(first)} at byte "
                        f"{offsets[first]}): the .rec is truncated")
    last = int(offsets.argmax())
    last_key, offset = key(last), int(offsets[last])
    with open(rec_path, "rb") as f:
        f.seek(offset)
        magic, length_word = np.frombuffer(f.read(8), dtype="<u4")
    end = offset + 8 + (int(length_word) & ((1 << LENGTH_BITS) - 1))
    if magic != RECORD_MAGIC or end > size:
        raise DataError(f"{rec_path}: the last record ({last_key}, at byte {offset}) "
                        + ("does not start with the RecordIO magic number" if magic != RECORD_MAGIC
                           else f"ends at byte {end}, past the end of the file ({size} bytes)")
                        + ": the .rec is truncated or does not match its index")


def read_record(reader: RecordFile, key: int, rec_path: str) -> bytes:
    """The raw record `key`; a damaged one is named with its byte offset (a DataError)."""
    return reader.read(key)


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
