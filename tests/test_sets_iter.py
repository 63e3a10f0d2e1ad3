"""Several sets read as one batch (SetsIter): each set's rows in every micro-batch, resumable.

Each micro-batch holds each set's rows in set order; each set keeps its own order, epochs and labels, and
a resumed run reads what it would have read."""
import numpy as np
import pytest

from mxnet_pfc.data.iterators import RecordIter, SetsIter, epoch_order, rows_per_set
from mxnet_pfc.data.records import DataError, RecordWriter
from test_data import encode, solid


def write_set(folder, images_per_identity, first_value):
    """A set whose image i is a solid grey of value first_value + 2 i (the two sets' values do not meet)."""
    writer = RecordWriter(str(folder), sum(images_per_identity), len(images_per_identity))
    value = first_value
    for class_id, count in enumerate(images_per_identity):
        for _ in range(count):
            writer.add(class_id, encode(solid(value)))
            value += 2
    writer.close()
    return str(folder / "train.rec")


def test_rows_per_set_follow_the_shares_and_fill_the_batch():
    assert rows_per_set(128, [5_800_000, 500_000]) == [118, 10]        # by size: Glint360K-like beside WebFace
    assert rows_per_set(128, [10, 10], [3, 1]) == [96, 32]
    assert rows_per_set(4, [10**9, 1, 1]) == [2, 1, 1]                 # every set keeps a row
    assert sum(rows_per_set(7, [3, 3, 3])) == 7
    with pytest.raises(DataError, match="cannot hold a row of each of 3 sets"):
        rows_per_set(2, [1, 1, 1])
    with pytest.raises(DataError, match="one positive number per set"):
        rows_per_set(8, [1, 1], [1, 0])


def test_each_micro_batch_holds_each_sets_rows_and_a_resume_reads_the_same(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = write_set(tmp_path / "a", (8, 8, 8), 0)          # 24 images, even values 0 .. 46
    b = write_set(tmp_path / "b", (4, 4), 101)           # 8 images, odd values 101 .. 115
    options = dict(rank=1, world_size=2, seed=3, rand_mirror=False, micro_batches=2)

    def sets():
        return SetsIter([RecordIter(a, 3, 3, **options), RecordIter(b, 1, 2, **options)], micro_batches=2)

    it = sets()
    assert it.rows == [3, 1] and it.num_images == 32
    assert it.steps_per_epoch == max(24 // (3 * 2 * 2), 8 // (1 * 2 * 2)) == 2
    steps = [next(it) for _ in range(5)]
    it.close()
    order_a = np.concatenate([epoch_order(24, 3, 1, 2, 3, e, 2) for e in range(3)])
    order_b = np.concatenate([epoch_order(8, 1, 1, 2, 3, e, 2) for e in range(3)])
    for step, batch in enumerate(steps):
        values = [int(v) for v in batch.data[:, 0, 0, 50].asnumpy()]
        want = []
        for k in range(2):           # micro-batch k: set a's 3 rows, then set b's 1
            want += [2 * int(i) for i in order_a[step][3 * k:3 * k + 3]] + [101 + 2 * int(order_b[step][k])]
        assert values == want
        labels = []          # each set's own class ids: 8 images an identity in a, 4 in b
        for k in range(2):
            labels += [int(i) // 8 for i in order_a[step][3 * k:3 * k + 3]] + [int(order_b[step][k]) // 4]
        assert [int(v) for v in batch.labels] == labels
        assert batch.epoch == step // 2
    resumed = sets()
    resumed.seek(3)
    again = next(resumed)
    resumed.close()
    assert np.array_equal(again.data.asnumpy(), steps[3].data.asnumpy())
    assert np.array_equal(again.labels, steps[3].labels) and again.epoch == steps[3].epoch == 1
