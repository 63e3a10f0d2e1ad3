"""The index of a set held as arrays (issue 34, item 4): a few bytes a record, read as MXNet reads it."""
import os
import threading
import tracemalloc

import mxnet as mx
import numpy as np
import pytest

from mxnet_pfc.data import folders
from mxnet_pfc.data.records import RECORD_MAGIC, DataError, open_records

MAGIC = RECORD_MAGIC.to_bytes(4, "little")


def write_plain(folder, payloads, numbers=None):
    """A set without a header, written by MXNet's own writer (which splits a payload at each aligned magic)."""
    rec, idx = str(folder / "train.rec"), str(folder / "train.idx")
    writer = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for i, payload in enumerate(payloads):
        key = numbers[i] if numbers else i
        writer.write_idx(key, mx.recordio.pack(mx.recordio.IRHeader(0, float(i % 3), key, 0), payload))
    writer.close()
    return rec, idx


def test_split_records_read_as_mxnets_reader_reads_them(tmp_path):
    """A payload holding the magic number at a 4-byte boundary is split by the dmlc writer; it reads back whole."""
    payloads = [b"", b"abc", MAGIC, b"xxxx" + MAGIC + b"yy", MAGIC * 3 + b"z", b"q" + MAGIC + b"qqq" + MAGIC,
                b"12" + MAGIC + b"34", os.urandom(5000) + MAGIC + os.urandom(3)]
    rec, idx = write_plain(tmp_path, payloads)
    mxnet_reader = mx.recordio.MXIndexedRecordIO(idx, rec, "r")
    reader, records = open_records(rec)
    assert records.image_records.tolist() == list(range(len(payloads)))
    for key in range(len(payloads)):
        raw = reader.read(key)
        assert raw == mxnet_reader.read_idx(key) and mx.recordio.unpack(raw)[1] == payloads[key]
    assert dict(reader.idx) == mxnet_reader.idx
    mxnet_reader.close()
    with open(rec, "r+b") as f:           # the second part of record 3 loses its magic number
        f.seek(reader.offset(3) + 8 + 24 + 4)
        f.write(b"\xff" * 4)
    with pytest.raises(DataError, match=rf"record 3 \(byte {reader.offset(3)}\) cannot be read: no RecordIO record "
                                        rf"header at byte {reader.offset(3) + 8 + 24 + 4}"):
        reader.read(3)
    reader.close()


def test_record_numbers_in_any_order_and_a_number_listed_twice(tmp_path):
    rec, idx = write_plain(tmp_path, [b"a", b"b", b"c"], numbers=[10, 3, 7])
    reader, records = open_records(rec)
    assert records.image_records.tolist() == [3, 7, 10] and reader.read(7)[-1:] == b"c"
    assert dict(reader.idx) == mx.recordio.MXIndexedRecordIO(idx, rec, "r").idx
    reader.close()
    lines = open(idx).read().splitlines()
    with open(idx, "w") as f:
        f.write("\n".join(lines + ["3\t" + lines[0].split("\t")[1]]) + "\n")
    with pytest.raises(DataError, match=r"train.idx: record 3 is listed twice: the index is damaged"):
        open_records(rec)


def test_reads_from_many_threads_at_once(tmp_path):
    payloads = [os.urandom(100 + 37 * i) for i in range(64)]
    rec, _ = write_plain(tmp_path, payloads)
    reader, _ = open_records(rec)
    wrong = []

    def read_all(seed):
        for key in np.random.default_rng(seed).permutation(len(payloads)):
            if mx.recordio.unpack(reader.read(int(key)))[1] != payloads[key]:
                wrong.append(int(key))

    threads = [threading.Thread(target=read_all, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not wrong and not any(thread.is_alive() for thread in threads)


def retained_bytes(make):
    """(bytes Python and NumPy still hold after make(), its result) with the result alive."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        result = make()
        return tracemalloc.get_traced_memory()[0] - before, result
    finally:
        tracemalloc.stop()


def test_a_record_sets_index_takes_a_few_bytes_a_record(tmp_path):
    """MXNet's reader kept a dict entry and a list entry a record (over 100 bytes); a 42M-image set
    must fit in < 0.7 GB per rank: < 16 bytes a record."""
    n = 40_000
    rec, _ = write_plain(tmp_path, [b"f"] * n)
    held, (reader, records) = retained_bytes(lambda: open_records(rec))
    assert len(records.image_records) == n and held / n < 16, f"{held / n:.1f} bytes a record"
    reader.close()


def test_an_image_folders_index_takes_a_few_bytes_an_image(tmp_path):
    """The index of ROOT/<identity>/<image> holds the names in one array, not a Python string an image."""
    root = tmp_path / "faces"
    for identity in range(40):
        (root / f"person_{identity:03d}").mkdir(parents=True)
        for k in range(250):
            (root / f"person_{identity:03d}" / f"{k:04d}.jpg").touch()
    for write in (True, False):          # a listing, then the index read back from OUTPUT
        held, index = retained_bytes(lambda: folders.load_index(str(root), str(tmp_path / "out"), write=write))
        assert len(index) == 10_000 and held / len(index) < 32, f"{held / len(index):.1f} bytes an image"
    assert index.path(251) == os.path.join("person_001", "0001.jpg") and int(index.labels[251]) == 1
    assert index.paths[:2] == [os.path.join("person_000", "0000.jpg"), os.path.join("person_000", "0001.jpg")]


def test_skipped_draws_leave_the_generator_where_drawing_them_does():
    """A resume skips the mirror draws of the steps done a chunk at a time: the same stream after."""
    from mxnet_pfc.data.iterators import skip_draws
    for count in (0, 1, 7, 1000, 12345):
        drawn, skipped = np.random.default_rng([3, 1, 0]), np.random.default_rng([3, 1, 0])
        drawn.random(count)
        skip_draws(skipped, count, chunk=64)
        assert np.array_equal(drawn.random(5), skipped.random(5))


def test_a_label_is_read_from_the_records_first_bytes_as_unpacking_reads_it(tmp_path):
    """read_label agrees with the whole record's header for scalar and array labels, and for a record too
    short to hold a header it reads the record whole and names what is wrong."""
    import mxnet as mx

    from mxnet_pfc.data.records import DataError, open_records, unpack_image_record
    writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "train.idx"), str(tmp_path / "train.rec"), "w")
    labels = [3.0, [7.0, 99.0], 0.0, [2.0]]
    for i, label in enumerate(labels):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, label, i, 0), b"\xff\xd8 not an image"))
    writer.write_idx(4, b"tiny")                      # no header: a damaged record
    writer.close()
    reader, _ = open_records(str(tmp_path / "train.rec"))
    for key in range(4):
        whole = unpack_image_record(reader.read(key), key, reader.offset(key), str(tmp_path / "train.rec"))[1]
        assert reader.read_label(key) == whole == (labels[key] if not isinstance(labels[key], list) else labels[key][0])
    with pytest.raises(DataError, match="record 4 .* has a header that does not unpack"):
        reader.read_label(4)
    with pytest.raises(DataError, match="record 9 is not in"):
        reader.read_label(9)
