"""The .bin loader fuzzed in a process of its own (test_bin_file.py): a crash fails the test, not pytest.

    python tests/bin_fuzz_worker.py SEEDS_FOLDER MEMORY_BYTES EXAMPLES

Every SEEDS_FOLDER/*.bin (real sets in the field's formats, and the issue's attacks) is loaded, then mutated by
hypothesis (bytes flipped, opcodes and numbers inserted or written over, ranges deleted or repeated, the
file cut short); load_bin must return a set or raise BinFormatError, within MEMORY_BYTES of address space
(RLIMIT_AS, set before anything is loaded). Prints what it loaded at the end; any other exception is
printed with its traceback and the process exits non-zero. Imports no MXNet.
"""
import os
import resource
import sys
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# Opcodes a .bin uses, and ones it must refuse (dicts, objects, POP, DUP, persistent ids, extensions,
# out-of-band buffers ...), as single bytes to insert or write over.
OPCODE_BYTES = b"\x80\x95.()t\x85\x86\x87]lae\x88\x89NIJKMLS\x8aTUVX\x8c\x8dBC\x8e\x96c\x93Rbpqr\x94ghj" \
               b"}sud012iox\x81\x92\x82\x83\x84\x97\x98\x8f\x90\x91FGP Q"
# Numbers that length and count fields may be set to.
NUMBERS = (0, 1, 2, 0x7F, 0xFF, 0x100, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 40, (1 << 63) - 1,
           (1 << 64) - 1)


@st.composite
def mutated(draw, seeds: "list[bytes]") -> bytes:
    raw = bytearray(draw(st.sampled_from(seeds)))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(st.integers(0, len(raw)))
        kind = draw(st.sampled_from(["flip", "opcode", "number", "delete", "repeat", "truncate", "insert"]))
        if kind == "flip" and at < len(raw):
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "opcode":
            code = draw(st.sampled_from(OPCODE_BYTES))
            raw[at:at + draw(st.integers(0, 1))] = bytes([code])        # written over, or inserted
        elif kind == "number":
            size = draw(st.sampled_from([1, 2, 4, 8]))
            value = draw(st.sampled_from(NUMBERS)) % (1 << (8 * size))
            raw[at:at + size] = value.to_bytes(size, "little")
        elif kind == "delete":
            del raw[at:at + draw(st.integers(1, 64))]
        elif kind == "repeat":
            raw[at:at] = raw[at:at + draw(st.integers(1, 64))] * draw(st.integers(1, 8))
        elif kind == "truncate":
            del raw[at:]
        elif kind == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(raw)


def main(folder: str, memory: int, examples: int) -> int:
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    from mxnet_pfc.eval.bin_file import BinFormatError, load_bin
    seeds = [open(os.path.join(folder, name), "rb").read() for name in sorted(os.listdir(folder))
             if name.endswith(".bin")]
    work = tempfile.mkdtemp(prefix="bin-fuzz-")
    path = os.path.join(work, "fuzzed.bin")
    count = [0]

    def load(raw: bytes) -> None:
        with open(path, "wb") as f:
            f.write(raw)
        count[0] += 1
        try:
            images, issame = load_bin(path)
        except BinFormatError:
            return
        assert len(images) == 2 * len(issame) >= 20, "a set that loads can be evaluated"

    for seed in seeds:          # each as it is, then mutated
        load(seed)
    settings(max_examples=examples, deadline=10_000, derandomize=True, database=None,
             suppress_health_check=list(HealthCheck))(given(mutated(seeds))(load))()
    os.remove(path)
    os.rmdir(work)
    print(f"loaded {len(seeds)} seeds and {count[0] - len(seeds)} mutations of them")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
