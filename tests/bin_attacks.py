""".bin verification sets as the field's writers write them, and as an attacker does (issue 33 item 1).

Used by test_bin_file.py and, as the seeds of its fuzzing, by bin_fuzz_worker.py (which imports no MXNet).
"""
import pickle

import numpy as np

from mxnet_pfc.data import synthetic_set


class Pickled:
    """Pickles as func(*args), then (with a state) a BUILD of `state` on the result: any call and any state
    a pickle can hold, as an attacker writes them."""

    def __init__(self, func, args, state=None):
        self.func, self.args, self.state = func, args, state

    def __reduce__(self):
        return (self.func, self.args) if self.state is None else (self.func, self.args, self.state)


def real_pairs(folder, pairs: int = 10, seed: int = 0) -> "tuple[list[bytes], list[bool]]":
    """(JPEG bytes of 2 x pairs faces, issame) of a generated set, half of its pairs same, half different."""
    path = str(folder / f"real-{pairs}-{seed}.bin")
    synthetic_set.write_verification_set(path, identities=5, pairs=pairs, seed=seed)
    with open(path, "rb") as f:
        return pickle.load(f)           # our own file


def dtype_with_state(state) -> Pickled:
    """numpy.dtype('u1') as numpy pickles it, followed by a BUILD of `state` instead of numpy's own."""
    return Pickled(np.dtype, ("u1", False, True), state)


def reconstructed(dtype, shape, raw) -> Pickled:
    """An array as numpy pickles it in protocols 0-4: _reconstruct, then a BUILD of its state."""
    return Pickled(np.core.multiarray._reconstruct, (np.ndarray, (0,), b"b"), (1, shape, dtype, False, raw))


# numpy.dtype's state (version, byte order, subarray, names, fields, elsize, alignment, flags)
OBJECT_FLAGS = (3, "|", None, None, None, -1, -1, 0x3F)            # "holds object pointers"
SUBARRAY = (3, "|", (np.dtype("u1"), (100_000_000,)), None, None, -1, -1, 0)


def segfault_bin(issame) -> bytes:
    """uint8 arrays whose dtype is given object flags after its type check, with a 2-item list for data:
    numpy reads list slots past their end as object pointers (the old loader: a segmentation fault)."""
    images = [reconstructed(dtype_with_state(OBJECT_FLAGS), (100_000,), [b"x", b"y"]) for _ in range(2 * len(issame))]
    return pickle.dumps((images, issame), protocol=2)


def subarray_bin(images, issame) -> bytes:
    """Real JPEGs as uint8 arrays whose dtype is given a subarray of 100,000,000 bytes after its type
    check (the old loader loaded it; the issue saw 4 KB of heap read "from" a 16-byte buffer)."""
    dtype = dtype_with_state(SUBARRAY)
    return pickle.dumps(([reconstructed(dtype, (len(b),), b) for b in images], issame), protocol=2)


def build_on_function_bin(images, issame) -> bytes:
    """A BUILD on the object the name numpy.dtype loads (the old loader's stand-in function, whose
    __defaults__ it set for the rest of the process), popped, then (images, issame)."""
    state = pickle.dumps((None, {"__defaults__": (True, True)}), protocol=2)[2:-1]     # without PROTO and STOP
    return b"\x80\x02cnumpy\ndtype\n" + state + b"b0" + pickle.dumps((images, issame), protocol=2)[2:]


def memo_bin(image: bytes, pairs: int) -> bytes:
    """2 x pairs references to one JPEG (pickle writes it once and a memo reference for each repeat)."""
    return pickle.dumps(([image] * (2 * pairs), [True, False] * (pairs // 2)), protocol=pickle.HIGHEST_PROTOCOL)


# --- Python 2's pickles (insightface's own lfw.bin, cfp_fp.bin ...: str images), written opcode by opcode ---

def _py2_str_literal(data: bytes) -> bytes:
    return b"'" + b"".join(bytes([c]) if 32 <= c < 127 and c not in b"\\'" else b"\\x%02x" % c for c in data) + b"'"


def _py2_str(data: bytes, protocol: int) -> bytes:
    if protocol == 0:
        return b"S" + _py2_str_literal(data) + b"\n"
    return (b"U" + bytes([len(data)]) if len(data) < 256 else b"T" + len(data).to_bytes(4, "little")) + data


def _py2_bool(value: bool, protocol: int) -> bytes:
    if protocol < 2:
        return b"I01\n" if value else b"I00\n"
    return b"\x88" if value else b"\x89"


def _py2_array(data: bytes) -> bytes:
    """A uint8 array as Python 2's numpy pickles it (protocol 2): _reconstruct, dtype('u1') and its BUILD."""
    return (b"cnumpy.core.multiarray\n_reconstruct\nq\x01cnumpy\nndarray\nq\x02K\x00\x85U\x01b\x87Rq\x03"
            b"(K\x01J" + len(data).to_bytes(4, "little") + b"\x85cnumpy\ndtype\nq\x04U\x02u1K\x00K\x01\x87Rq\x05"
            b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89" + _py2_str(data, 2) + b"tb")


def python2_bin(images, issame, protocol: int, arrays: bool = False) -> bytes:
    """(images, issame) as Python 2's pickle.dump writes them: a tuple of a list of str and a list of bools
    (protocol 0: STRING and INT 01/00; 1: BINSTRING; 2: NEWTRUE/NEWFALSE too), or with protocol 2 the
    images as numpy arrays."""
    head = b"\x80\x02" if protocol == 2 else b""
    items = [(_py2_array(b) if arrays else _py2_str(b, protocol)) + b"a" for b in images]
    labels = [_py2_bool(s, protocol) + b"a" for s in issame]
    return head + b"((lp0\n" + b"".join(items) + b"(lp1\n" + b"".join(labels) + b"tp2\n."
