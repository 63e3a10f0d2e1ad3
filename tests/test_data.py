"""The RecordIO layout, the iterators, the packing tool and the synthetic set."""
import os

import cv2
import mxnet as mx
import numpy as np
import pytest

from mxnet_pfc.data import check, pack, synthetic_set
from mxnet_pfc.data.iterators import DummyIter, RecordIter, epoch_order
from mxnet_pfc.data.records import DataError, RecordWriter, open_records, read_property


def solid(value, size=112):
    """A JPEG-safe test image: flat colour `value` with a left/right marker (to see mirroring)."""
    image = np.full((size, size, 3), value, dtype=np.uint8)
    image[:, :8] = 255 - value
    return image


def encode(image, ext=".png"):
    return cv2.imencode(ext, image)[1].tobytes()


def write_set(folder, images_per_identity=(2, 3, 1)):
    total = sum(images_per_identity)
    writer = RecordWriter(str(folder), total, len(images_per_identity))
    value = 0
    for class_id, count in enumerate(images_per_identity):
        for _ in range(count):
            writer.add(class_id, encode(solid(10 * value)))
            value += 1
    writer.close()
    return str(folder / "train.rec")


def test_writer_produces_the_insightface_layout(tmp_path):
    rec = write_set(tmp_path)
    reader, records = open_records(rec)
    header, _ = mx.recordio.unpack(reader.read_idx(0))
    assert header.flag > 0 and list(header.label) == [7.0, 10.0]      # images 1..6, identities 7..9
    assert records.image_records.tolist() == [1, 2, 3, 4, 5, 6] and records.num_identities == 3
    ranges = [tuple(mx.recordio.unpack(reader.read_idx(i))[0].label) for i in (7, 8, 9)]
    assert ranges == [(1.0, 3.0), (3.0, 6.0), (6.0, 7.0)]
    assert read_property(str(tmp_path)) == (3, 112, 112)


def test_set_without_header_and_array_labels(tmp_path):
    writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "train.idx"), str(tmp_path / "train.rec"), "w")
    for i in range(4):
        label = float(i % 2) if i < 2 else [float(i % 2), 99.0]      # array label: the first element counts
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, label, i, 0), encode(solid(40 * i))))
    writer.close()
    _, records = open_records(str(tmp_path / "train.rec"))
    assert records.image_records.tolist() == [0, 1, 2, 3] and records.num_identities is None
    it = RecordIter(str(tmp_path / "train.rec"), batch_size=4, num_classes=2, rand_mirror=False)
    batch = next(it)
    it.close()
    by_value = {int(batch.data[k, 0, 0, 50].asscalar()): int(batch.labels[k]) for k in range(4)}
    assert by_value == {0: 0, 40: 1, 80: 0, 120: 1}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_epoch_order_splits_each_epoch_between_ranks(world):
    n, b = 50, 4
    orders = [epoch_order(n, b, r, world, seed=5, epoch=0) for r in range(world)]
    steps = n // (b * world)
    assert all(o.shape == (steps, b) for o in orders)
    seen = np.concatenate([o.ravel() for o in orders])
    assert len(set(seen.tolist())) == len(seen) == steps * b * world          # no image twice in an epoch
    assert not np.array_equal(epoch_order(n, b, 0, world, 5, 1), orders[0])    # reshuffled per epoch
    assert np.array_equal(epoch_order(n, b, 0, world, 5, 0), orders[0])        # reproducible


@pytest.mark.parametrize("world", [1, 3])
def test_epoch_order_with_micro_batches(world):
    """Gradient accumulation: a step's K x B images per rank are micro-batch slices k x world + rank of
    the step's global batch; no image twice in an epoch; the epoch is whole steps."""
    n, b, k = 100, 4, 3
    steps = n // (b * world * k)
    flat = np.random.default_rng([5, 0]).permutation(n)[:steps * k * world * b].reshape(steps, k * world, b)
    for rank in range(world):
        order = epoch_order(n, b, rank, world, seed=5, epoch=0, micro_batches=k)
        assert order.shape == (steps, k * b)
        assert np.array_equal(order.reshape(steps, k, b), flat[:, rank::world])
    seen = np.concatenate([epoch_order(n, b, r, world, 5, 0, k).ravel() for r in range(world)])
    assert len(set(seen.tolist())) == len(seen)
    # one micro-batch per step is the layout without accumulation
    single = n // (b * world)
    permutation = np.random.default_rng([5, 0]).permutation(n)
    assert np.array_equal(epoch_order(n, b, 0, world, 5, 0, 1),
                          permutation[:single * world * b].reshape(single, world, b)[:, 0])


def test_record_iter_with_micro_batches_and_resume(tmp_path):
    """grad_accum = 2: each step yields 2 x B images in epoch_order's layout, with their own
    mirror draws; seeking to step t (a resumed run) gives what reading t steps gave."""
    rec = write_set(tmp_path, (6, 5, 7, 6))            # 24 images: value 10 * i for image i
    options = dict(batch_size=2, num_classes=4, rank=1, world_size=2, seed=3, micro_batches=2)
    it = RecordIter(rec, **options)
    assert it.steps_per_epoch == 24 // (2 * 2 * 2)
    steps = [next(it) for _ in range(5)]               # into the second epoch
    it.close()
    order = np.concatenate([epoch_order(24, 2, 1, 2, 3, epoch, 2) for epoch in (0, 1)])
    for step, batch in zip(order, steps):
        assert batch.data.shape == (4, 3, 112, 112) and batch.labels.shape == (4,)
        assert [int(v) for v in batch.data[:, 0, 0, 50].asnumpy()] == [10 * int(i) for i in step]
    resumed = RecordIter(rec, **options)
    resumed.seek(4)
    again = next(resumed)
    resumed.close()
    assert np.array_equal(again.data.asnumpy(), steps[4].data.asnumpy()) and again.epoch == steps[4].epoch == 1


def test_epoch_order_refuses_a_set_smaller_than_a_global_batch():
    with pytest.raises(DataError, match="cannot fill one global batch"):
        epoch_order(5, 4, 0, 2, 0, 0)


def test_record_iter_reads_every_image_with_its_label_and_mirrors(tmp_path):
    rec = write_set(tmp_path, (3, 3, 3, 3))
    labels_of_value = {10 * v: v // 3 for v in range(12)}
    seen, mirrored = [], 0
    for rank in range(2):
        it = RecordIter(rec, batch_size=3, num_classes=4, rank=rank, world_size=2, seed=1)
        assert it.steps_per_epoch == 2
        for _ in range(2):
            batch = next(it)
            assert batch.data.shape == (3, 3, 112, 112) and batch.labels.dtype == np.int64
            for k in range(3):
                image = batch.data[k].asnumpy()
                value = int(image[0, 0, 50])
                assert labels_of_value[value] == batch.labels[k]
                mirrored += image[0, 0, 0] == value          # the marker moved to the right side
                seen.append(value)
        it.close()
    assert sorted(seen) == sorted(labels_of_value)              # one epoch over 2 ranks: every image once
    assert 0 < mirrored < 12


def test_label_outside_num_classes_names_the_record(tmp_path):
    rec = write_set(tmp_path, (2, 2))
    with pytest.raises(DataError, match="lists 2 identities, more than num_classes = 1"):
        RecordIter(rec, batch_size=2, num_classes=1)
    writer = mx.recordio.MXIndexedRecordIO(str(tmp_path / "plain.idx"), str(tmp_path / "plain.rec"), "w")
    for i, label in enumerate([0.0, 7.0]):
        writer.write_idx(i, mx.recordio.pack(mx.recordio.IRHeader(0, label, i, 0), encode(solid(0))))
    writer.close()
    it = RecordIter(str(tmp_path / "plain.rec"), batch_size=2, num_classes=5)
    with pytest.raises(DataError, match=r"record 1 \(byte 648\) has label 7.0, outside the classes \[0, 5\)"):
        next(it)


def test_undecodable_record_names_the_record(tmp_path):
    writer = RecordWriter(str(tmp_path), 2, 1)
    writer.add(0, encode(solid(0)))
    writer.add(0, b"not an image")
    writer.close()
    it = RecordIter(str(tmp_path / "train.rec"), batch_size=2, num_classes=1)
    with pytest.raises(DataError, match=r"record 2 \(byte \d+\) does not decode"):
        next(it)


def test_truncated_rec_is_refused_at_start_with_the_first_missing_record(tmp_path):
    rec = write_set(tmp_path, (2, 3, 1))
    reader, _ = open_records(rec)
    offsets = dict(reader.idx)
    reader.close()
    size = os.path.getsize(rec)
    os.truncate(rec, size - 5)                   # the last record (an identity record) loses its end
    with pytest.raises(DataError, match=rf"the last record \(9, at byte {offsets[9]}\) ends at byte {size}, "
                                        rf"past the end of the file \({size - 5} bytes\): the .rec is truncated"):
        RecordIter(rec, batch_size=2, num_classes=3)
    os.truncate(rec, offsets[5] + 3)             # records 5.. gone
    with pytest.raises(DataError, match=rf"is {offsets[5] + 3} bytes, but .*train.idx places 5 of its 10 records "
                                        rf"at or beyond that \(first: record 5 at byte {offsets[5]}\)"):
        RecordIter(rec, batch_size=2, num_classes=3)


def test_truncated_idx_is_refused(tmp_path):
    rec = write_set(tmp_path, (2, 3, 1))
    idx = tmp_path / "train.idx"
    lines = idx.read_bytes().splitlines(keepends=True)
    idx.write_bytes(b"".join(lines[:-1]) + lines[-1][:-3])          # cut inside the last line
    with pytest.raises(DataError, match="the last line is cut off .*: the index is truncated"):
        RecordIter(rec, batch_size=2, num_classes=3)
    idx.write_bytes(b"".join(lines[:7]))                             # whole lines missing
    with pytest.raises(DataError, match=r"train.rec: the header record claims 10 records \(6 images, 3 identities\), "
                                         r"but .*train.idx lists 7: the header is damaged or the index is truncated"):
        RecordIter(rec, batch_size=2, num_classes=3)
    idx.write_bytes(b"".join(lines[:3]) + b"garbage\n" + b"".join(lines[4:]))
    with pytest.raises(DataError, match="a line is not 'record<TAB>byte offset'"):
        RecordIter(rec, batch_size=2, num_classes=3)


def test_damaged_record_is_named_with_its_byte_offset(tmp_path):
    rec = write_set(tmp_path, (2, 3, 1))
    reader, _ = open_records(rec)
    offset = reader.idx[4]
    reader.close()
    with open(rec, "r+b") as f:                  # record 4's RecordIO magic number overwritten
        f.seek(offset)
        f.write(b"\xff" * 4)
    it = RecordIter(rec, batch_size=6, num_classes=3, rand_mirror=False)
    with pytest.raises(DataError, match=rf"record 4 \(byte {offset}\) cannot be read"):
        next(it)


def test_check_command_lists_every_damaged_record(tmp_path, capsys):
    rec = write_set(tmp_path, (2, 3, 1))
    assert check.main([str(tmp_path)]) == 0
    assert "6 image records, 3 classes: sound" in capsys.readouterr().out
    reader, _ = open_records(rec)
    offsets = dict(reader.idx)
    reader.close()
    with open(rec, "r+b") as f:
        f.seek(offsets[2])                       # record 2: RecordIO header damaged
        f.write(b"\xff" * 4)
        f.seek(offsets[5] + 8 + 24)              # record 5: image bytes overwritten
        f.write(b"\0" * 32)
    assert check.main([str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"record 2 (byte {offsets[2]}) cannot be read" in out
    assert f"record 5 (byte {offsets[5]}) does not decode as an image" in out
    assert "2 damaged record(s)" in out
    assert check.main([str(tmp_path), "--num-classes", "2"]) == 1          # record 6 has label 2
    assert "record 6 (byte" in capsys.readouterr().out


def test_missing_files_are_named(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        RecordIter(str(tmp_path / "nope.rec"), batch_size=2, num_classes=1)


def test_dummy_iter_gives_labels_in_range():
    it = DummyIter(batch_size=8, num_classes=10_000_000, steps_per_epoch=2)
    batches = [next(it) for _ in range(3)]
    assert batches[0].data.shape == (8, 3, 112, 112)
    assert all(0 <= b.labels.min() and b.labels.max() < 10_000_000 for b in batches)
    assert [b.epoch for b in batches] == [0, 0, 1]


def make_faces(root, sizes=(112, 112, 112), counts=(2, 1, 3)):
    for identity, (size, count) in enumerate(zip(sizes, counts)):
        folder = root / f"person_{identity}"
        folder.mkdir(parents=True)
        for k in range(count):
            cv2.imwrite(str(folder / f"{k}.png"), solid(20 * identity + k, size))


def test_pack_tool_writes_a_set_the_iterator_reads(tmp_path):
    make_faces(tmp_path / "faces")
    assert pack.main([str(tmp_path / "faces"), str(tmp_path / "out")]) == 0
    assert read_property(str(tmp_path / "out")) == (3, 112, 112)
    _, records = open_records(str(tmp_path / "out" / "train.rec"))
    assert len(records.image_records) == 6 and records.num_identities == 3
    it = RecordIter(str(tmp_path / "out" / "train.rec"), batch_size=6, num_classes=3, rand_mirror=False)
    batch = next(it)
    it.close()
    pairs = sorted((int(batch.data[k, 0, 0, 50].asscalar()), int(batch.labels[k])) for k in range(6))
    assert pairs == [(0, 0), (1, 0), (20, 1), (40, 2), (41, 2), (42, 2)]
    assert open(tmp_path / "out" / "identities.txt").read().splitlines()[1] == "1\tperson_1"


def test_pack_tool_refuses_wrong_sizes_unless_resizing(tmp_path, capsys):
    make_faces(tmp_path / "faces", sizes=(112, 96, 112))
    assert pack.main([str(tmp_path / "faces"), str(tmp_path / "out")]) == 1
    assert "is 96x96, expected 112x112 (an aligned face), or pass --resize" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out" / "train.rec")            # nothing half-written
    assert pack.main([str(tmp_path / "faces"), str(tmp_path / "out"), "--resize"]) == 0
    assert pack.main([str(tmp_path / "empty"), str(tmp_path / "out2")]) == 1


def test_synthetic_set_has_the_layout_and_learnable_identities(tmp_path):
    synthetic_set.generate(str(tmp_path), identities=12, images_per_identity=4, val_identities=10, val_pairs=40)
    assert synthetic_set.is_complete(str(tmp_path), 12, 4, 40)
    assert not synthetic_set.is_complete(str(tmp_path), 12, 5, 40)
    assert read_property(str(tmp_path)) == (12, 112, 112)
    it = RecordIter(str(tmp_path / "train.rec"), batch_size=48, num_classes=12, rand_mirror=False)
    batch = next(it)
    it.close()
    # identity shows in the pixels, but the nuisance dominates them: images of one identity are
    # only somewhat closer than images of two (a model must learn what to look at)
    x = batch.data.asnumpy().reshape(48, -1)
    distance = ((x[:, None] - x[None]) ** 2).mean(axis=2)
    same = batch.labels[:, None] == batch.labels[None]
    off_diagonal = ~np.eye(48, dtype=bool)
    assert 0.5 < distance[same & off_diagonal].mean() / distance[~same].mean() < 0.95
