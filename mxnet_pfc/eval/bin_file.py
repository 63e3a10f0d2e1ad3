"""InsightFace's .bin verification pair sets, read as data: the pickle is interpreted, never unpickled.

A .bin is a pickle of (images, issame): a list of encoded images and a list of booleans. The field's
writers give the images as bytes (Python 2's str; Python 3's bytes, as `_codecs.encode` in protocols 0-2)
or as the uint8 arrays cv2.imencode returns (insightface's build_eval_pack.py: numpy's `_frombuffer` in
protocol 5, `_reconstruct` and a BUILD of the array's state before it; numpy 1's `numpy.core` and numpy
2's `numpy._core` names), and the labels as Python booleans, numpy booleans or a boolean array.

pickle.Unpickler, even with a list of allowed globals, hands each BUILD to the built object's own
__setstate__: a dtype took a subarray or object flags after its type was checked, and numpy then read
memory as object pointers (issue 33). So nothing here is unpickled. `parse` runs the opcodes these
writers use, from an allow-list (_OPCODES), over plain values (tuples, lists, bytes, str, ints, booleans,
None) and three records of its own: a global's role (_Global, for the few names in _GLOBALS), a dtype's
code (_DType: uint8 or bool) and an array (_Array: code, shape, bytes). It calls no function and sets no
object's state; arrays are rebuilt from (shape, bytes) of uint8 and bool only, by numpy's own frombuffer.

What a file may cost, each refusal naming it: a regular file (a FIFO would block the reader, /dev/zero
never end) of at most MAX_BIN_BYTES; at most MAX_OPCODES opcodes (each leaves at most one value in the
stack or the memo); decoded images of at most DECODED_PER_FILE_BYTE times the file's size, counted from
the image list's length, so that memo references (a few bytes each) cannot stand for images the file
does not hold; and a set that 10-fold verification and TAR@FAR can evaluate (check_evaluable).
"""
from __future__ import annotations

import codecs
import math
import os
import pickletools
import re
from dataclasses import dataclass

import cv2
import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE, ImageError, decode_face
from mxnet_pfc.runtime import reading
from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.files import read_regular_file

MAX_BIN_BYTES = 1 << 30         # the published sets (lfw, cfp_fp, agedb_30 ...) are 50-300 MB
MAX_OPCODES = 1 << 22           # a protocol-5 image takes ~14 opcodes, a bytes image 3: 150,000 pairs and more
MAX_DIMENSIONS = 32             # numpy's own limit of array dimensions
# A 112 x 112 face decodes to 150,528 bytes of float32 (what load_bin holds); its JPEG is 2-10 KB. A
# published set decodes to ~30 times its size; memo references to one image, to thousands of times.
DECODED_PER_FILE_BYTE = 1000
FOLDS = 10                      # the folds of the verification protocol (verification.ten_fold_accuracy)


class BinFormatError(PfcError, ValueError):
    """A .bin file that is not (list of encoded images, list of booleans), or a set that cannot be evaluated."""


@reading.reads_file          # a set that kills the rank reading it is named to the supervisor
def load_bin(path: str, image_size: int = FACE_SIZE) -> "tuple[np.ndarray, np.ndarray]":
    """(images float32 (2P, 3, H, W) RGB 0..255, issame bool (P,)) from a .bin pair set.

    Images are decoded by data.faces.decode_face (RGB; JPEG warnings ignored, as OpenCV
    always did for these sets), resized bilinearly when not image_size square.
    """
    shown = os.fsencode(path).decode("utf-8", "backslashreplace")
    raw = read_regular_file(path, MAX_BIN_BYTES, "a verification .bin", BinFormatError)
    try:
        encoded, issame = parse(raw)
    except BinFormatError as error:
        raise BinFormatError(f"{shown}: {error}") from None
    check_evaluable(shown, issame)
    decoded = len(encoded) * 3 * image_size * image_size * np.dtype(np.float32).itemsize
    if decoded > DECODED_PER_FILE_BYTE * len(raw):
        raise BinFormatError(f"{shown}: its {len(encoded):,} images would decode to {decoded / 2**20:,.0f} MB "
                             f"({image_size}x{image_size} float32), more than {DECODED_PER_FILE_BYTE} times the "
                             f"file's {len(raw):,} bytes: a .bin holds each image it names (pickle memo "
                             "references repeat an image without its bytes)")
    images = np.empty((len(encoded), 3, image_size, image_size), dtype=np.float32)
    for i, payload in enumerate(encoded):
        try:      # other sizes are resized, as InsightFace's loader does
            face = decode_face(payload, f"{shown}: image {i} (pair {i // 2})", image_size, resize=True,
                               strict=False, interpolation=cv2.INTER_LINEAR)
        except ImageError as error:
            raise BinFormatError(str(error)) from None
        images[i] = face.transpose(2, 0, 1)
    return images, issame


def check_evaluable(source: str, issame: np.ndarray) -> None:
    """BinFormatError naming `source` unless the labels make a set the verification report is defined for:
    at least FOLDS pairs (ten_fold_accuracy tests on each fold and picks its threshold on the others: an
    empty fold has no accuracy) and at least one same and one different pair (tar_at_far: TAR is the
    share of same pairs accepted, FAR that of different pairs)."""
    pairs, same = len(issame), int(np.count_nonzero(issame))
    if pairs < FOLDS:
        raise BinFormatError(f"{source}: {pairs} pair(s): {FOLDS}-fold verification needs at least {FOLDS} pairs "
                             "(one in each fold)")
    if same in (0, pairs):
        raise BinFormatError(f"{source}: all {pairs} pairs are {'different' if same == 0 else 'same'}: TAR@FAR "
                             "needs at least one same and one different pair")


def parse(raw: bytes) -> "tuple[list[bytes], np.ndarray]":
    """(encoded images, issame as a bool array) of a .bin's pickle; BinFormatError saying what is wrong."""
    value = _Interpreter(raw).run()
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise BinFormatError(f"expected a pair (images, issame), got {_what(value)}")
    images, labels = value
    encoded = [_encoded(item) for item in images] if isinstance(images, (list, tuple)) else [None]
    if any(item is None for item in encoded):
        raise BinFormatError("the image list holds something other than encoded images (bytes, or uint8 arrays "
                             "as cv2.imencode returns)")
    issame = _booleans(labels)
    if issame is None:
        raise BinFormatError(f"the pair labels are {_what(labels)}, not a list of booleans")
    if len(encoded) != 2 * len(issame):
        raise BinFormatError(f"expected {2 * len(issame)} images for {len(issame)} booleans, got {len(encoded)}")
    return encoded, issame


# --- the values a .bin's pickle builds, besides tuples, lists, bytes, str, ints, booleans and None -----

@dataclass(frozen=True)
class _Global:
    """A name the pickle loads, by what it stands for here (a value of _GLOBALS); never the object itself."""
    role: str
    name: str       # module.name, for messages


@dataclass(frozen=True)
class _DType:
    """numpy.dtype('u1') or numpy.dtype('b1'), as a code: the only array types of a .bin."""
    code: str


class _Array:
    """A uint8 or bool array of a .bin: its code, shape and bytes (C order). An array from numpy's
    _reconstruct has no code until the BUILD that follows gives its state."""
    __slots__ = ("code", "shape", "data")

    def __init__(self, code: "str | None" = None, shape: tuple = (), data: bytes = b""):
        self.code, self.shape, self.data = code, shape, data


_NUMPY_CORES = ("numpy.core", "numpy._core")        # numpy 1's and numpy 2's module names
_GLOBALS = {
    ("numpy", "dtype"): "dtype",
    ("numpy", "ndarray"): "ndarray",
    **{(f"{core}.numeric", "_frombuffer"): "frombuffer" for core in _NUMPY_CORES},
    **{(f"{core}.multiarray", "_reconstruct"): "reconstruct" for core in _NUMPY_CORES},
    **{(f"{core}.multiarray", "scalar"): "scalar" for core in _NUMPY_CORES},
    ("_codecs", "encode"): "encode",            # Python 3's bytes in protocols 0-2
    ("__builtin__", "bytes"): "bytes",          # ... and an empty bytes object there
    ("builtins", "bytes"): "bytes",
}
_DTYPE_CODES = ("u1", "b1")
_BYTE_ORDERS = ("|", "=", "<", ">")             # meaningless for one-byte types; '|' is what numpy writes


def _bad(detail: str) -> BinFormatError:
    return BinFormatError(f"not a pickle of (images, issame): {detail}")


def _clip(text: str, limit: int = 80) -> str:
    """`text` from the file, for a message: escaped, at most `limit` characters."""
    return text[:limit].encode("unicode_escape").decode("ascii") + ("..." if len(text) > limit else "")


def _text(value) -> "str | None":
    """A short string of the pickle as text: Python 3's str, or Python 2's str (read as bytes)."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value if isinstance(value, str) else None


def _flag(value) -> bool:
    return isinstance(value, int) and value in (0, 1)


def _what(value) -> str:
    """What a value is, without its content (which may be large or nested deep)."""
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, _Global):
        return value.name
    if isinstance(value, _DType):
        return f"numpy.dtype('{value.code}')"
    if isinstance(value, _Array):
        return "an array" if value.code else "an array without its state"
    return type(value).__name__


def _shape(shape) -> tuple:
    if not (isinstance(shape, tuple) and len(shape) <= MAX_DIMENSIONS
            and all(type(n) is int and n >= 0 for n in shape)):
        raise _bad(f"an array shape that is {_what(shape)}, not a tuple of sizes")
    return shape


def _array(code: str, shape, data, fortran: bool) -> _Array:
    """An _Array of `code` from a pickle's shape and bytes, checked to match; bytes in C order."""
    shape = _shape(shape)
    if not isinstance(data, bytes):
        raise _bad(f"the data of an array is {_what(data)}, not bytes")
    if math.prod(shape) != len(data):
        raise _bad(f"an array of {len(shape)} dimension(s) holding {math.prod(shape):,} elements given "
                   f"{len(data):,} bytes")
    if fortran and len(shape) > 1:
        data = np.frombuffer(data, np.uint8).reshape(shape, order="F").tobytes()
    return _Array(code, shape, data)


def _dtype(args: tuple) -> _DType:
    """numpy.dtype(spec, align, copy) as numpy pickles it, for 'u1' and 'b1' only."""
    if not (len(args) == 3 and _flag(args[1]) and _flag(args[2])):
        raise _bad("numpy.dtype called with arguments other than (type, align, copy)")
    code = _text(args[0])
    if code not in _DTYPE_CODES:
        shown = _clip(code) if code is not None else _what(args[0])
        raise BinFormatError(f"an array of type '{shown}': a verification .bin holds uint8 images and booleans")
    return _DType(code)


def _check_dtype_state(dtype: _DType, state) -> None:
    """The BUILD after numpy.dtype(...): only the state numpy writes for a one-byte builtin type (version 3,
    no subarray, names or fields, elsize and alignment -1, no flags), which changes nothing."""
    if not (isinstance(state, tuple) and len(state) == 8 and state[0] == 3 and _text(state[1]) in _BYTE_ORDERS
            and state[2] is None and state[3] is None and state[4] is None
            and all(type(v) is int for v in state[5:]) and state[5:] == (-1, -1, 0)):
        raise _bad(f"a state of {_what(dtype)} other than numpy's own (subarrays, fields and flags are refused)")


def _from_buffer(args: tuple) -> _Array:
    """numpy's _frombuffer(buffer, dtype, shape, order): protocol 5's arrays."""
    if not (len(args) == 4 and isinstance(args[1], _DType) and _text(args[3]) in ("C", "F")):
        raise _bad("numpy's _frombuffer called with arguments other than (bytes, dtype, shape, order)")
    buffer, dtype, shape, order = args
    return _array(dtype.code, shape, buffer, _text(order) == "F")


def _empty_array(args: tuple) -> _Array:
    """numpy's _reconstruct(numpy.ndarray, shape, typecode): an array whose state the next BUILD gives."""
    if not (len(args) == 3 and isinstance(args[0], _Global) and args[0].role == "ndarray"
            and _text(args[2]) == "b"):
        raise _bad("numpy's _reconstruct called with arguments other than (numpy.ndarray, shape, b'b')")
    _shape(args[1])
    return _Array()


def _set_array_state(array: _Array, state) -> None:
    """The BUILD after _reconstruct: ([version,] shape, dtype, is_fortran, raw bytes)."""
    if isinstance(state, tuple) and len(state) == 5 and type(state[0]) is int:
        state = state[1:]
    if not (isinstance(state, tuple) and len(state) == 4 and isinstance(state[1], _DType) and _flag(state[2])):
        raise _bad("an array state other than (version, shape, dtype, is_fortran, bytes)")
    shape, dtype, fortran, data = state
    built = _array(dtype.code, shape, data, bool(fortran))
    array.code, array.shape, array.data = built.code, built.shape, built.data


def _scalar(args: tuple) -> bool:
    """numpy's scalar(dtype, bytes): a numpy boolean of the labels."""
    if not (len(args) == 2 and isinstance(args[0], _DType) and args[0].code == "b1"
            and isinstance(args[1], bytes) and len(args[1]) == 1):
        raise _bad("a numpy scalar that is not a boolean")
    return args[1] != b"\0"


def _latin1(args: tuple) -> bytes:
    """_codecs.encode(text, 'latin1'): how Python 3 pickles bytes in protocols 0-2."""
    if not (len(args) == 2 and isinstance(args[0], str) and _text(args[1]) in ("latin1", "latin-1")):
        raise _bad("_codecs.encode called with arguments other than (text, 'latin1')")
    try:
        return args[0].encode("latin-1")
    except UnicodeEncodeError:
        raise _bad("_codecs.encode of text that is not latin-1") from None


_CALLS = {"dtype": _dtype, "frombuffer": _from_buffer, "reconstruct": _empty_array, "scalar": _scalar,
          "encode": _latin1}


def _encoded(item) -> "bytes | None":
    """An encoded image as bytes: bytes as pickled, or the 1-D (or N x 1) uint8 array cv2.imencode returns."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, _Array) and item.code == "u1" and len(item.shape) in (1, 2) and item.data:
        return item.data
    return None


def _booleans(labels) -> "np.ndarray | None":
    """The pair labels as a bool array: a list of Python or numpy booleans, or a 1-D boolean array."""
    if isinstance(labels, (list, tuple)) and all(type(s) is bool for s in labels):
        return np.array(labels, dtype=bool)
    if isinstance(labels, _Array) and labels.code == "b1" and len(labels.shape) == 1:
        return np.frombuffer(labels.data, np.uint8) != 0
    return None


# --- the interpreter ----------------------------------------------------------------------------------

_DECIMAL = re.compile(rb"-?[0-9]{1,30}")


class _Interpreter:
    """One pass over a pickle's opcodes (the allow-list _OPCODES), with its stack, marks and memo."""

    def __init__(self, raw: bytes):
        self.raw, self.at = raw, 0
        self.stack: list = []
        self.marks: "list[int]" = []
        self.memo: dict = {}

    def run(self):
        """The value the pickle's STOP returns."""
        for count in range(1, MAX_OPCODES + 1):
            start = self.at
            if start >= len(self.raw):
                raise _bad(f"it ends at byte {start:,} before its STOP")
            code = self.raw[start]
            self.at += 1
            name, step = _OPCODES.get(code, (None, None))
            if step is None:
                raise _bad(f"byte {start:,} holds opcode {_opcode_name(code)}, which a .bin does not use")
            try:
                step(self)
            except IndexError:      # a pop of an empty stack (or a mark's items) or of a list
                raise _bad(f"opcode {name} at byte {start:,} finds too few values on the stack") from None
            except BinFormatError as error:
                raise BinFormatError(f"{error} (opcode {name} at byte {start:,})") from None
            if name == "STOP":
                if self.marks or len(self.stack) != 1:
                    raise _bad(f"it ends with {len(self.stack)} values on the stack and {len(self.marks)} "
                               "open marks, not one value")
                return self.stack[0]
        raise _bad(f"more than {MAX_OPCODES:,} opcodes: more than any verification set holds")

    # arguments
    def take(self, count: int) -> bytes:
        if count < 0 or count > len(self.raw) - self.at:
            raise _bad(f"{count:,} bytes announced, {len(self.raw) - self.at:,} left in the file")
        data = self.raw[self.at:self.at + count]
        self.at += count
        return data

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size), "little")

    def line(self) -> bytes:
        end = self.raw.find(b"\n", self.at)
        if end < 0:
            raise _bad("a line without its end")
        data = self.raw[self.at:end]
        self.at = end + 1
        return data

    def decimal(self) -> int:
        return _decimal(self.line())

    # values
    def push(self, value) -> None:
        self.stack.append(value)

    def pop(self):
        return self.stack.pop()

    def pop_mark(self) -> list:
        if not self.marks:
            raise _bad("items taken up to a MARK that is not there")
        mark = self.marks.pop()
        items = self.stack[mark:]
        del self.stack[mark:]
        return items

    def top_list(self) -> list:
        target = self.stack[-1]
        if not isinstance(target, list):
            raise _bad(f"items appended to {_what(target)}")
        return target

    def tuple_of(self, count: int) -> None:
        if len(self.stack) < count:
            raise IndexError
        items = tuple(self.stack[len(self.stack) - count:])
        del self.stack[len(self.stack) - count:]
        self.push(items)

    def load_global(self, module, name) -> None:
        role = _GLOBALS.get((module, name)) if isinstance(module, str) and isinstance(name, str) else None
        if role is None:
            shown = f"{_clip(module)}.{_clip(name)}" if isinstance(module, str) and isinstance(name, str) else \
                f"a global named by {_what(module)} and {_what(name)}"
            raise BinFormatError(f"refusing to load {shown}: a verification .bin holds only a list of encoded "
                                 "images and a list of booleans")
        self.push(_Global(role, f"{module}.{name}"))

    def reduce(self) -> None:
        args, function = self.pop(), self.pop()
        if not (isinstance(function, _Global) and isinstance(args, tuple)):
            raise _bad(f"a call of {_what(function)} with {_what(args)}")
        if function.role == "bytes" and args == ():
            self.push(b"")
        elif function.role in _CALLS:
            self.push(_CALLS[function.role](args))
        else:
            raise _bad(f"a call of {function.name}")

    def build(self) -> None:
        state, target = self.pop(), self.stack[-1]
        if isinstance(target, _DType):
            _check_dtype_state(target, state)
        elif isinstance(target, _Array) and target.code is None:
            _set_array_state(target, state)
        else:
            raise _bad(f"a BUILD (setting an object's state) on {_what(target)}: a .bin sets the state of "
                       "numpy's dtypes and arrays only")

    def remember(self, key: int) -> None:
        self.memo[key] = self.stack[-1]

    def recall(self, key: int) -> None:
        if key not in self.memo:
            raise _bad(f"memo entry {key} read before it is written")
        self.push(self.memo[key])


def _string_literal(line: bytes) -> bytes:
    """Protocol 0's STRING: a quoted, escaped line (Python 2's str), as bytes."""
    if len(line) < 2 or line[:1] not in (b"'", b'"') or line[-1:] != line[:1]:
        raise _bad("a STRING without its quotes")
    try:
        return codecs.escape_decode(line[1:-1])[0]
    except ValueError:
        raise _bad("a STRING with a broken escape") from None


def _utf8(data: bytes) -> str:
    try:
        return data.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise _bad("text that is not UTF-8") from None


def _unicode_literal(line: bytes) -> str:
    try:
        return str(line, "raw-unicode-escape")
    except UnicodeDecodeError:
        raise _bad("a UNICODE line with a broken escape") from None


def _decimal(text: bytes) -> int:
    """A number of protocol 0 (INT, LONG with its L, PUT, GET)."""
    text = text[:-1] if text.endswith(b"L") else text
    if not _DECIMAL.fullmatch(text):
        raise _bad("a number that is not a short decimal")
    return int(text)


def _int_literal(p: _Interpreter) -> None:
    line = p.line()         # protocols 0 and 1 write booleans as INT 00 / 01
    p.push(line == b"01" if line in (b"00", b"01") else _decimal(line))


def _proto(p: _Interpreter) -> None:
    if p.uint(1) > 5:
        raise _bad("a pickle protocol above 5")


def _append(p: _Interpreter) -> None:
    value = p.pop()
    p.top_list().append(value)


def _appends(p: _Interpreter) -> None:
    items = p.pop_mark()
    p.top_list().extend(items)


def _binint(p: _Interpreter) -> None:
    p.push(int.from_bytes(p.take(4), "little", signed=True))


def _binstring(p: _Interpreter) -> None:
    count = int.from_bytes(p.take(4), "little", signed=True)
    p.push(p.take(count))


def _global_line(p: _Interpreter) -> None:
    module = _utf8(p.line())
    p.load_global(module, _utf8(p.line()))


def _stack_global(p: _Interpreter) -> None:
    name = p.pop()
    p.load_global(p.pop(), name)


def _stop(p: _Interpreter) -> None:
    pass        # run() returns the value


# opcode byte: (pickletools' name, step). Everything else -- dicts, sets, objects (INST, OBJ, NEWOBJ),
# persistent ids, extension codes, POP and DUP, out-of-band buffers -- is refused by its absence.
_OPCODES = {ord(code): (name, step) for code, name, step in (
    ("\x80", "PROTO", _proto),
    ("\x95", "FRAME", lambda p: p.uint(8)),
    (".", "STOP", _stop),
    ("(", "MARK", lambda p: p.marks.append(len(p.stack))),
    (")", "EMPTY_TUPLE", lambda p: p.push(())),
    ("t", "TUPLE", lambda p: p.push(tuple(p.pop_mark()))),
    ("\x85", "TUPLE1", lambda p: p.tuple_of(1)),
    ("\x86", "TUPLE2", lambda p: p.tuple_of(2)),
    ("\x87", "TUPLE3", lambda p: p.tuple_of(3)),
    ("]", "EMPTY_LIST", lambda p: p.push([])),
    ("l", "LIST", lambda p: p.push(p.pop_mark())),
    ("a", "APPEND", _append),
    ("e", "APPENDS", _appends),
    ("N", "NONE", lambda p: p.push(None)),
    ("\x88", "NEWTRUE", lambda p: p.push(True)),
    ("\x89", "NEWFALSE", lambda p: p.push(False)),
    ("I", "INT", _int_literal),
    ("J", "BININT", _binint),
    ("K", "BININT1", lambda p: p.push(p.uint(1))),
    ("M", "BININT2", lambda p: p.push(p.uint(2))),
    ("L", "LONG", lambda p: p.push(p.decimal())),
    ("\x8a", "LONG1", lambda p: p.push(int.from_bytes(p.take(p.uint(1)), "little", signed=True))),
    ("S", "STRING", lambda p: p.push(_string_literal(p.line()))),
    ("T", "BINSTRING", _binstring),
    ("U", "SHORT_BINSTRING", lambda p: p.push(p.take(p.uint(1)))),
    ("V", "UNICODE", lambda p: p.push(_unicode_literal(p.line()))),
    ("X", "BINUNICODE", lambda p: p.push(_utf8(p.take(p.uint(4))))),
    ("\x8c", "SHORT_BINUNICODE", lambda p: p.push(_utf8(p.take(p.uint(1))))),
    ("\x8d", "BINUNICODE8", lambda p: p.push(_utf8(p.take(p.uint(8))))),
    ("B", "BINBYTES", lambda p: p.push(p.take(p.uint(4)))),
    ("C", "SHORT_BINBYTES", lambda p: p.push(p.take(p.uint(1)))),
    ("\x8e", "BINBYTES8", lambda p: p.push(p.take(p.uint(8)))),
    ("\x96", "BYTEARRAY8", lambda p: p.push(p.take(p.uint(8)))),       # its bytes: nothing here mutates them
    ("c", "GLOBAL", _global_line),
    ("\x93", "STACK_GLOBAL", _stack_global),
    ("R", "REDUCE", lambda p: p.reduce()),
    ("b", "BUILD", lambda p: p.build()),
    ("p", "PUT", lambda p: p.remember(p.decimal())),
    ("q", "BINPUT", lambda p: p.remember(p.uint(1))),
    ("r", "LONG_BINPUT", lambda p: p.remember(p.uint(4))),
    ("\x94", "MEMOIZE", lambda p: p.remember(len(p.memo))),
    ("g", "GET", lambda p: p.recall(p.decimal())),
    ("h", "BINGET", lambda p: p.recall(p.uint(1))),
    ("j", "LONG_BINGET", lambda p: p.recall(p.uint(4))),
)}


def _opcode_name(code: int) -> str:
    """An opcode byte as pickletools names it (or its hex value, for a byte that is no opcode)."""
    known = pickletools.code2op.get(chr(code))
    return known.name if known else f"0x{code:02x}"
