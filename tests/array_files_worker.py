"""MXNet array files loaded through the project's one loader (mxnet_files.load_arrays), in a process whose address
space may grow by at most MEMORY_BOUND beyond what it holds after loading real files: an allocation sized by a
word of a small file fails there (MXNet reports std::bad_alloc) instead of taking the machine's memory.

    array_files_worker.py load FILE...   one JSON line per file: {"file", "outcome": loaded|refused, "message"}
    array_files_worker.py fuzz FOLDER    the property below on mutated files; exit 0 when it held. Each file is
                                         written to FOLDER/last.params before it is loaded, so a crash leaves it.

The property: a file saved by mx.nd.save (with and without names, several dtypes and shapes, empty, and the
two older formats MXNet still reads), then mutated (a 4- or 8-byte field set to a count- or size-like value,
bytes changed, inserted or cut), loads or is refused with a PfcError; never another exception, never a
crash, and never a failure of MXNet to allocate (its messages for that are OUT_OF_MEMORY).
"""
import json
import resource
import struct
import sys
from datetime import timedelta
from pathlib import Path

import mxnet as mx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.mxnet_files import load_arrays

MEMORY_BOUND = 1 << 30          # bytes of address space beyond the warmed-up process's
EXAMPLES = 400
OUT_OF_MEMORY = ("bad_alloc", "Failed to allocate", "length_error", "_M_default_append", "MemoryError")
# values a mutated field takes: counts and sizes that MXNet would believe, and the format's own words
FIELD_VALUES = [0, 1, 2, 3, 12, 33, 0x112, 1 << 24, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 40, (1 << 63) - 1,
                (1 << 64) - 1, 0xF993FAC8, 0xF993FAC9, 0xF993FACA]


def legacy_array(magic: "int | None", shape: tuple, values: bytes, flag: int) -> bytes:
    """One array in MXNet's V1 form (magic given) or its form before 0.9 (magic None: the first word is ndim)."""
    head = struct.pack("<Ii", magic, len(shape)) + struct.pack(f"<{len(shape)}q", *shape) if magic else \
        struct.pack(f"<I{len(shape)}I", len(shape), *shape)
    return head + struct.pack("<iii", 1, 0, flag) + values


def seeds(folder: Path) -> "list[bytes]":
    """Real array files: as mx.nd.save writes them, and a list in the two older forms (checked to load)."""
    saved = {
        "named": {"arg:fc_weight": mx.nd.array([[1, 2, 3], [4, 5, 6]]), "aux:mean": mx.nd.ones(4, dtype="float16"),
                  "arg:count": mx.nd.array([7], dtype="int64"), "arg:pixels": mx.nd.zeros((2, 2, 2), dtype="uint8")},
        "unnamed": [mx.nd.array([1.5, 2.5, 3.5], dtype="float64"), mx.nd.array([[1], [2]], dtype="int32"),
                    mx.nd.array([-1, 2], dtype="int8")],
        "empty": [],
    }
    files = []
    for name, arrays in saved.items():
        mx.nd.save(str(folder / f"{name}.params"), arrays)
        files.append((folder / f"{name}.params").read_bytes())
    older = (struct.pack("<QQQ", 0x112, 0, 2) + legacy_array(0xF993FAC8, (2,), struct.pack("<2f", 1, 2), 0)
             + legacy_array(None, (1, 2), struct.pack("<2i", 3, 4), 4) + struct.pack("<Q", 0))
    (folder / "older.params").write_bytes(older)
    assert [a.asnumpy().tolist() for a in mx.nd.load(str(folder / "older.params"))] == [[1, 2], [[3, 4]]]
    return files + [older]


def limit_memory() -> None:
    """Address space: what the process holds now (MXNet loaded, its engine started) plus MEMORY_BOUND."""
    size = int(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmSize:"))) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_BOUND, resource.getrlimit(resource.RLIMIT_AS)[1]))


def outcome(file: Path) -> dict:
    try:
        load_arrays(str(file))
        return {"file": str(file), "outcome": "loaded", "message": ""}
    except PfcError as error:
        return {"file": str(file), "outcome": "refused", "message": str(error)}


@st.composite
def mutated(draw, originals: "list[bytes]") -> bytes:
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["field", "field", "byte", "cut", "insert"]))
        offset = draw(st.one_of(st.integers(0, len(data) // 4).map(lambda k: 4 * k), st.integers(0, len(data))))
        if kind == "field":
            width = draw(st.sampled_from([4, 8]))
            value = draw(st.one_of(st.sampled_from(FIELD_VALUES), st.integers(0, (1 << 64) - 1))) % (1 << 8 * width)
            data[offset:offset + width] = value.to_bytes(width, "little")
        elif kind == "byte":
            data[offset:offset + 1] = bytes([draw(st.integers(0, 255))])
        elif kind == "cut":
            del data[offset:]
        else:
            data[offset:offset] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


def fuzz(folder: Path) -> None:
    originals = seeds(folder)
    for name in ("named", "unnamed", "empty", "older"):        # warm up: MXNet's engine and allocator
        assert outcome(folder / f"{name}.params")["outcome"] == "loaded"
    limit_memory()
    last = folder / "last.params"

    @settings(max_examples=EXAMPLES, deadline=timedelta(seconds=10), derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), print_blob=False)
    @given(mutated(originals))
    def loads_or_is_refused(data):
        last.write_bytes(data)
        result = outcome(last)
        assert not any(mark in result["message"] for mark in OUT_OF_MEMORY), result["message"]

    loads_or_is_refused()
    print(f"{EXAMPLES} mutated files loaded or refused within {MEMORY_BOUND >> 20} MiB")


def main(mode: str, *args: str) -> None:
    if mode == "fuzz":
        fuzz(Path(args[0]))
        return
    mx.nd.save(str(Path(args[0]).parent / "warm-up.params"), {"w": mx.nd.ones(3)})
    outcome(Path(args[0]).parent / "warm-up.params")
    limit_memory()
    for file in args:
        print(json.dumps(outcome(Path(file))), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
