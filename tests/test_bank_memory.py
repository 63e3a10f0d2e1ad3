"""The memory bank's start-up, checkpoint save, resume and fill hold no second copy of the whole bank.

At 10^6 classes x 512 on 2 ranks the centers are 1 GB per rank; a save through
np.save(w.asnumpy()) held a host copy of them on top of training's high-water
mark (docs/benchmarks.md, "Peak host memory over a whole run"). Each phase runs
in a fresh process on a 200,000 x 128 bank (100 MB of centers, as much momentum)
and the kernel's own peak of resident memory (VmHWM, reset before the phase) is
read after it: a second copy of the centers would add 100 MB; the bank copies at
most 16 MB blocks (memory_bank.HOST_CHUNK_BYTES) at a time.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
ROWS, WIDTH = 200_000, 128
SHARD_BYTES = ROWS * WIDTH * 4

PHASES = r"""
import json, os, sys
import mxnet as mx, numpy as np
from mxnet_pfc.head.memory_bank import MemoryBank

def status():
    text = open("/proc/self/status").read()
    return {k: int(text.split(k + ":")[1].split()[0]) * 1024 for k in ("VmRSS", "VmHWM")}

def phase(name, work):
    mx.nd.waitall()
    open("/proc/self/clear_refs", "w").write("5")       # the peak starts afresh from here
    before = status()["VmRSS"]
    work()
    mx.nd.waitall()
    growth[name] = status()["VmHWM"] - before

rows, width, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
growth, made = {}, {}
phase("start-up", lambda: made.setdefault("bank", MemoryBank(rows, width, 0, 1, mx.cpu(), ops=None)))
bank = made["bank"]
phase("save", lambda: bank.save(folder))
phase("load", lambda: bank.load(folder, [[0, rows]]))
centers, momentum = np.load(os.path.join(folder, "centers-rank00000.npy")), np.zeros((rows, width), np.float32)
phase("fill", lambda: bank.set_all(centers, momentum))
print(json.dumps(growth))
"""


@pytest.fixture(scope="module")
def growth(tmp_path_factory):
    """{phase: bytes the peak of resident memory rose above the resident memory before the phase}."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/PID/clear_refs to reset the peak of resident memory")
    folder = tmp_path_factory.mktemp("bank")
    proc = subprocess.run([sys.executable, "-c", PHASES, str(ROWS), str(WIDTH), str(folder)], cwd=REPO,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_start_up_allocates_the_centers_and_momentum_only(growth):
    assert growth["start-up"] < 2.5 * SHARD_BYTES, growth


def test_a_checkpoint_save_holds_no_host_copy_of_the_bank(growth):
    assert growth["save"] < SHARD_BYTES / 2, growth


def test_a_resume_reads_the_saved_bank_without_a_host_copy_of_it(growth):
    """MemoryBank.load (a resume): the saved rows go a block at a time into the bank, read from the file
    (np.load's memory map would keep the pages read resident)."""
    assert growth["load"] < SHARD_BYTES / 2, growth


def test_filling_the_bank_from_host_arrays_holds_no_second_copy(growth):
    """set_all: a resume and --init_centers fill the bank from host arrays already read."""
    assert growth["fill"] < SHARD_BYTES / 2, growth


def test_the_saved_file_is_np_save_s_byte_for_byte(tmp_path, monkeypatch):
    """Written a block at a time (blocks of 7 rows here: a partial last one), the file is np.save's."""
    import mxnet as mx

    from mxnet_pfc.head import memory_bank

    monkeypatch.setattr(memory_bank, "HOST_CHUNK_BYTES", 7 * 5 * 4)
    values = np.random.default_rng(0).standard_normal((51, 5)).astype(np.float32)
    memory_bank.write_npy(str(tmp_path / "chunked.npy"), mx.nd.array(values, dtype="float32"))
    np.save(tmp_path / "whole.npy", values)
    assert (tmp_path / "chunked.npy").read_bytes() == (tmp_path / "whole.npy").read_bytes()
    bank = memory_bank.MemoryBank(51, 5, 0, 1, mx.cpu(), ops=None)
    bank.set_all(values, -values)
    assert np.array_equal(bank.weight.asnumpy(), values) and np.array_equal(bank.weight_mom.asnumpy(), -values)


def test_a_center_file_in_fortran_order_is_refused_naming_it(tmp_path):
    """Rows are read from the file by offset, so a file whose rows are not contiguous (Fortran order, which
    np.save never writes for the bank) is refused, not read scrambled."""
    from mxnet_pfc.head.memory_bank import read_saved_rows
    from mxnet_pfc.runtime.errors import CheckpointError

    np.save(tmp_path / "centers-rank00000.npy", np.asfortranarray(np.ones((6, 4), np.float32)))
    np.save(tmp_path / "momentum-rank00000.npy", np.zeros((6, 4), np.float32))
    with pytest.raises(CheckpointError, match=r"centers-rank00000.npy: its rows are stored in Fortran order"):
        read_saved_rows(str(tmp_path), [[0, 6]], 0, 6, 4)
    np.save(tmp_path / "centers-rank00000.npy", np.arange(24, dtype=np.float32).reshape(6, 4))
    centers, momentum = read_saved_rows(str(tmp_path), [[0, 6]], 2, 3, 4)      # classes 2..4 of 6
    assert np.array_equal(centers, np.arange(8, 20, dtype=np.float32).reshape(3, 4)) and not momentum.any()
