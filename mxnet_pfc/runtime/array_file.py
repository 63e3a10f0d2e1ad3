"""MXNet's array files (mx.nd.save: .params, optimizer states, center files), checked before MXNet reads them.

MXNet 1.9 believes every count and shape in such a file (src/ndarray/ndarray.cc, NDArray::Load; dmlc-core's
serializer.h): it sizes a vector by the announced number of arrays (about 230 bytes each) before reading
one, allocates an array's bytes from its shape before reading them, sizes a buffer by an old-format
array's first word, and reads a shape of -1 dimensions into a fixed buffer on the stack. So a 24-byte
file can cost gigabytes, or corrupt memory. `problem` walks the same layout without allocating from it
(little-endian; what MXNet 1.x writes is the V2 form):

    uint64 0x112 (kMXAPINDArrayListMagic), uint64 0
    uint64 N, then N arrays, each:
        uint32 magic: 0xF993FAC9 (V2), 0xF993FAC8 (V1), or before those the shape's ndim itself
        V2: int32 storage type (0: dense), int32 ndim, ndim x int64; ndim 0 is an empty array, nothing follows
        V1: int32 ndim, ndim x int64;  older: ndim x uint32
        int32 device type, int32 device id, int32 type flag, then prod(shape) x the type's size bytes
    uint64 M (0, or N), then M names: uint64 length, that many bytes

and refuses what announces more than the file holds, so that loading costs about what the file weighs:
its data, plus at most MAX_ARRAYS arrays' bookkeeping. Sparse arrays and NumPy-shape files (V3) are
refused too: no model, checkpoint or center file holds them.
"""
from __future__ import annotations

import io
import math
import struct

LIST_MAGIC = 0x112
V1_MAGIC, V2_MAGIC, V3_MAGIC = 0xF993FAC8, 0xF993FAC9, 0xF993FACA
# mshadow's type flags that MXNet 1.9 can load (mshadow_sizeof), and their sizes in bytes
TYPE_SIZES = {0: 4, 1: 8, 2: 2, 3: 1, 4: 4, 5: 1, 6: 8, 7: 1, 12: 2}
DEVICE_TYPES = (1, 2, 3, 5)        # cpu, gpu, cpu_pinned, cpu_shared
MAX_NDIM = 32                      # NumPy's limit (asnumpy), far above any network's parameter
# A hundred times the parameter arrays of the largest backbones (iResNet-100's model file holds about 770
# arrays, its optimizer states fewer): bounds MXNet's per-array bookkeeping whatever the file's size.
MAX_ARRAYS = 100_000
SMALLEST_ARRAY = 12                # an empty V2 array: magic, storage type, ndim 0
SMALLEST_NAME = 8                  # an empty name: its length


class _Refused(Exception):
    """What is wrong with the file (a phrase for the caller's message)."""


class _Reader:
    """Reads the layout's fields from a binary file object, never past `size`."""

    def __init__(self, f, size: int):
        self.f, self.size, self.offset = f, size, 0

    def left(self) -> int:
        return self.size - self.offset

    def take(self, count: int, what: str) -> bytes:
        if count > self.left():
            raise _Refused(f"{what} at byte {self.offset:,} needs {count:,} bytes, and {self.left():,} are left")
        data = self.f.read(count)
        if len(data) != count:
            raise _Refused(f"{what} at byte {self.offset:,}: the file ended early (it changed while read?)")
        self.offset += count
        return data

    def skip(self, count: int, what: str) -> None:
        if count > self.left():
            raise _Refused(f"{what} at byte {self.offset:,} is {count:,} bytes, and {self.left():,} are left")
        self.f.seek(count, io.SEEK_CUR)
        self.offset += count

    def number(self, form: str, what: str) -> int:
        return struct.unpack("<" + form, self.take(struct.calcsize(form), what))[0]


def _array(r: _Reader, index: int) -> None:
    """Past array `index`, as NDArray::Load reads it; _Refused if it announces more than is left."""
    what = f"array {index}"
    magic = r.number("I", f"{what}'s format word")
    if magic == V3_MAGIC:
        raise _Refused(f"{what} was saved in NumPy shape semantics (format V3), which this project does not read")
    if magic == V2_MAGIC:
        storage = r.number("i", f"{what}'s storage type")
        if storage != 0:
            raise _Refused(f"{what} has storage type {storage}: only dense arrays are read (0)")
    if magic in (V1_MAGIC, V2_MAGIC):
        ndim = r.number("i", f"{what}'s number of dimensions")
        form, size = "q", 8
    else:                                       # MXNet before 0.9: the first word is the number of dimensions
        ndim, form, size = magic, "I", 4
    if not 0 <= ndim <= MAX_NDIM:
        raise _Refused(f"{what} has {ndim} dimensions (at most {MAX_NDIM} are read)")
    shape = struct.unpack(f"<{ndim}{form}", r.take(size * ndim, f"{what}'s shape"))
    if magic == V2_MAGIC and ndim == 0:         # an empty (none) array: nothing follows
        return
    if any(dim < 0 for dim in shape):
        raise _Refused(f"{what} has shape {shape}: a negative dimension")
    device = r.number("i", f"{what}'s device type")
    if device not in DEVICE_TYPES:
        raise _Refused(f"{what} has device type {device} (MXNet's are {', '.join(map(str, DEVICE_TYPES))})")
    r.number("i", f"{what}'s device id")
    flag = r.number("i", f"{what}'s data type")
    if flag not in TYPE_SIZES:
        raise _Refused(f"{what} has data type {flag}, not one MXNet 1.9 loads")
    r.skip(math.prod(shape) * TYPE_SIZES[flag], f"{what}'s data (shape {shape}, type {flag})")


def _list(r: _Reader) -> None:
    """Past the whole file, as NDArray::Load of a list reads it."""
    magic, _reserved = r.number("Q", "the header"), r.number("Q", "the header")
    if magic != LIST_MAGIC:
        raise _Refused(f"it does not start as an MXNet array file does ({LIST_MAGIC:#x}, found {magic:#x})")
    count = r.number("Q", "the number of arrays")
    if count * SMALLEST_ARRAY + SMALLEST_NAME > r.left():
        raise _Refused(f"it announces {count:,} arrays, and its {r.size:,} bytes hold at most "
                       f"{max(0, r.left() - SMALLEST_NAME) // SMALLEST_ARRAY:,}")
    if count > MAX_ARRAYS:
        raise _Refused(f"it holds {count:,} arrays, more than any model's (this project reads at most "
                       f"{MAX_ARRAYS:,})")
    for index in range(count):
        _array(r, index)
    names = r.number("Q", "the number of names")
    if names not in (0, count):
        raise _Refused(f"it holds {count:,} arrays and {names:,} names (MXNet reads none or one per array)")
    if names * SMALLEST_NAME > r.left():
        raise _Refused(f"it announces {names:,} names in its last {r.left():,} bytes")
    for index in range(names):
        r.skip(r.number("Q", f"name {index}'s length"), f"name {index}")


def problem(f, size: int) -> "str | None":
    """Why the MXNet array file open as binary `f` (`size` bytes, read from its start) must not be given to
    mx.nd.load, or None: it is laid out as MXNet writes it and every count and shape fits in its bytes."""
    try:
        _list(_Reader(f, size))
    except _Refused as refused:
        return str(refused)
    return None


def array_problem(raw: bytes) -> "str | None":
    """Why one array's bytes (NDArray.__getstate__'s, MXNDArrayLoadFromRawBytes reads them) must not be
    given to MXNet, or None."""
    try:
        _array(_Reader(io.BytesIO(raw), len(raw)), 0)
    except _Refused as refused:
        return str(refused)
    return None
