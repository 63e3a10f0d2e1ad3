"""MXNet array files (.params, optimizer states, center files) cost what they weigh (issue 33, item 6).

MXNet 1.9 believes every count and shape in such a file: a 24-byte file announcing 2^24 arrays made every
loader allocate 3.8 GB before reading one. The project's one loader (mxnet_files.load_arrays) reads the layout
first (runtime/array_file.py) and refuses what the file's bytes cannot hold. The loads run in
array_files_worker.py, whose address space may grow by at most 1 GiB (its MEMORY_BOUND) beyond what it held
after loading real files, so that a loader that believes a word fails there, not on this machine; the
commands run under `ulimit -v` of 2 GiB.
"""
import json
import os
import struct
import sys

import mxnet as mx

from launch import own_set_run, run_command

WORKER = "tests/array_files_worker.py"
COMMAND_MEMORY_KB = 2 << 20          # 2 GiB of address space for a command (the 24-byte file would take 3.8 GB)


def header(count: int) -> bytes:
    return struct.pack("<QQQ", 0x112, 0, count)


def v2_array(shape: tuple, values: bytes, flag: int = 0, ndim: "int | None" = None) -> bytes:
    """One array as MXNet 1.x writes it (dense, on the CPU), its shape and number of dimensions as given."""
    ndim = len(shape) if ndim is None else ndim
    return struct.pack(f"<Iii{len(shape)}qiii", 0xF993FAC9, 0, ndim, *shape, 1, 0, flag) + values


NO_NAMES = struct.pack("<Q", 0)
CRAFTED = {       # file name: (its bytes, what the refusal says)
    "count.params": (header(1 << 24), "cannot load: it announces 16,777,216 arrays, and its 24 bytes hold at most 0"),
    "names.params": (header(0) + struct.pack("<Q", 1 << 32) + bytes(16),
                     "cannot load: it holds 0 arrays and 4,294,967,296 names (MXNet reads none or one per array)"),
    "name-length.params": (header(1) + v2_array((1,), bytes(4)) + struct.pack("<QQ", 1, 1 << 40) + b"w",
                           "cannot load: name 0 at byte 76 is 1,099,511,627,776 bytes, and 1 are left"),
    "shape.params": (header(1) + v2_array((1 << 40,), bytes(4)) + NO_NAMES,
                     "cannot load: array 0's data (shape (1099511627776,), type 0) at byte 56 is 4,398,046,511,104 "
                     "bytes, and 12 are left"),
    "overflow.params": (header(1) + v2_array((1 << 32, 1 << 32), bytes(4)) + NO_NAMES,     # 2^64: 0 in MXNet
                        "cannot load: array 0's data (shape (4294967296, 4294967296), type 0) at byte 64 is "
                        "73,786,976,294,838,206,464 bytes"),
    "ndim.params": (header(1) + v2_array((), bytes(64), ndim=-1) + NO_NAMES,   # read onto MXNet's stack
                    "cannot load: array 0 has -1 dimensions (at most 32 are read)"),
    "old-ndim.params": (header(1) + struct.pack("<I", (1 << 31) - 1) + bytes(64) + NO_NAMES,
                        "cannot load: array 0 has 2147483647 dimensions (at most 32 are read)"),
    "sparse.params": (header(1) + struct.pack("<Ii", 0xF993FAC9, 1) + bytes(64) + NO_NAMES,
                      "cannot load: array 0 has storage type 1: only dense arrays are read (0)"),
}


def worker_outcomes(files) -> "dict[str, dict]":
    proc = run_command([sys.executable, WORKER, "load", *files], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {os.path.basename(r["file"]): r for r in map(json.loads, proc.stdout.splitlines()) if r.get("file")}


def test_a_file_is_refused_when_its_counts_or_shapes_announce_more_than_it_holds(tmp_path):
    """Each count, length and shape a loader would believe, set beyond the file's bytes, is refused naming the
    file and the word; so are a dimension count of -1 (MXNet read the rest of the file onto its stack) and
    dimensions whose product overflows 64 bits (MXNet allocated 0 bytes for a 2^64-element array)."""
    for name, (data, _) in CRAFTED.items():
        (tmp_path / name).write_bytes(data)
    outcomes = worker_outcomes([tmp_path / name for name in CRAFTED])
    for name, (_, expected) in CRAFTED.items():
        assert outcomes[name]["outcome"] == "refused", outcomes[name]
        assert outcomes[name]["message"].startswith(f"{tmp_path / name}: {expected}"), outcomes[name]


def test_only_regular_files_are_read(tmp_path):
    """A FIFO would block mx.nd.load forever, /dev/zero (behind a symlink) would be read until memory runs out."""
    os.mkfifo(tmp_path / "fifo.params")
    os.symlink("/dev/zero", tmp_path / "zero.params")
    (tmp_path / "folder.params").mkdir()
    outcomes = worker_outcomes([tmp_path / name for name in ("zero.params", "folder.params", "fifo.params")])
    for name, kind in (("fifo.params", "a FIFO"), ("zero.params", "a character device"),
                       ("folder.params", "a folder")):
        assert outcomes[name]["message"] == (f"{tmp_path / name} is not a regular file ({kind}): an MXNet array "
                                             "file is read only from a regular file"), outcomes[name]


def test_mutated_array_files_load_or_are_refused_within_a_memory_bound(tmp_path):
    """The property-based fuzz (array_files_worker.fuzz: 400 derandomized examples, 10 s each at most): files
    saved by mx.nd.save, then mutated, load or are refused with the project's error, and no load asks for
    more than the worker's bound; a crash of the worker fails the test and leaves the file."""
    proc = run_command([sys.executable, WORKER, "fuzz", tmp_path], timeout=300)
    assert proc.returncode == 0, (f"the last file tried is {tmp_path / 'last.params'}:\n" + proc.stdout[-4000:])


def bomb_model(prefix) -> None:
    """PREFIX-symbol.json of a small network, and PREFIX-0000.params: 24 bytes announcing 2^24 arrays."""
    mx.sym.FullyConnected(mx.sym.flatten(mx.sym.Variable("data")), num_hidden=8, name="fc1").save(
        f"{prefix}-symbol.json")
    with open(f"{prefix}-0000.params", "wb") as f:
        f.write(header(1 << 24))


def limited(*command) -> list:
    """COMMAND under `ulimit -v` COMMAND_MEMORY_KB."""
    return ["bash", "-c", f'ulimit -v {COMMAND_MEMORY_KB} && exec "$@"', "bash", sys.executable, *command]


def test_export_refuses_a_model_whose_parameters_announce_2_to_the_24_arrays(tmp_path):
    bomb_model(tmp_path / "model")
    proc = run_command(limited("-m", "mxnet_pfc.export", tmp_path / "model", "--prefix", tmp_path / "out"),
                       timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert (f"mxnet_pfc.export: {tmp_path}/model-0000.params: cannot load: it announces 16,777,216 arrays, and its "
            "24 bytes hold at most 0") in proc.stdout, proc.stdout[-3000:]
    assert not list(tmp_path.glob("out*"))


def test_the_trainer_refuses_such_a_file_as_pretrained_before_step_1(set_b, tmp_path):
    bomb_model(tmp_path / "zoo")
    proc = run_command(limited("-m", "mxnet_pfc.train", *own_set_run(set_b, tmp_path / "run", "--max_update", 2,
                                                                     "--pretrained", tmp_path / "zoo")),
                       timeout=300)
    assert proc.returncode != 0
    assert f"{tmp_path}/zoo-0000.params: cannot load: it announces 16,777,216 arrays" in proc.stdout, (
        proc.stdout[-3000:])
    assert "step 1/" not in proc.stdout
