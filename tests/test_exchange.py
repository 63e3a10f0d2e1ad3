"""The input exchange of collective 1 on simulated ranks, in one process.

An allgather concatenates the ranks' packed vectors; here that concatenation
is done by hand for W ranks, and every simulated rank unpacks it as it would
after the real collective. tests/test_bad_input.py runs the same through
horovodrun for the collective itself.
"""
import mxnet as mx
import numpy as np
import pytest

from mxnet_pfc.head import exchange

CTX = mx.cpu()
D, C = 8, 50


def gather(inputs, num_classes=C):
    """What every rank sees after collective 1: [(headers, table, per_rank)] per simulated rank."""
    converted = [exchange.convert_inputs(x, y, num_classes) for x, y in inputs]
    gathered = mx.nd.concat(*[exchange.pack(x, y, p, num_classes, CTX) for x, y, p in converted], dim=0)
    world = len(inputs)
    return [(*exchange.unpack(gathered, world, x, p), x) for x, _, p in converted]


def problems_everywhere(inputs, num_classes=C):
    """The problem list each simulated rank finds; they must all be the same."""
    found = [exchange.input_problems(headers, D, num_classes) for headers, _, _ in gather(inputs, num_classes)]
    assert all(f == found[0] for f in found), found
    return found[0]


def good(rank, rows=4):
    rng = np.random.default_rng(rank)
    return rng.normal(size=(rows, D)).astype(np.float32), rng.integers(0, C, rows)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_good_input_arrives_exactly_on_every_rank(world):
    inputs = [good(r) for r in range(world)]
    for headers, batch, x in gather(inputs):
        assert exchange.input_problems(headers, D, C) == []
        assert batch is not None                       # the regular layout: only headers and labels on the host
        embeddings, labels = batch
        assert embeddings.context == CTX and isinstance(labels, np.ndarray)
        assert np.array_equal(embeddings.asnumpy(), np.concatenate([x for x, _ in inputs]))
        assert np.array_equal(labels, np.concatenate([y for _, y in inputs]))


def test_labels_beyond_float32_travel_exactly():
    classes = 2 ** 40
    labels = [np.array([0, 2 ** 24 + 1, 2 ** 40 - 1, 123456789012]), np.array([2 ** 33 + 7, 1, 2, 3])]
    inputs = [(np.ones((4, D), np.float32), y) for y in labels]
    for headers, batch, x in gather(inputs, classes):
        assert exchange.input_problems(headers, D, classes) == []
        assert np.array_equal(batch[1], np.concatenate(labels))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_one_bad_rank_is_named_by_every_rank(world):
    last = world - 1

    def with_last(x, y):
        return [good(r) for r in range(last)] + [(x, y)]

    x, y = good(last)
    cases = {
        "label too large": (with_last(x, np.array([1, 2, 3, 55])), f"rank {last}: 1 labels outside [0, 50) "
                                                                 "(smallest 1, largest 55)"),
        "label negative": (with_last(x, np.array([-1, 2, 3, 0])), f"rank {last}: 1 labels outside [0, 50) "
                                                                 "(smallest -1, largest 3)"),
        "label fraction": (with_last(x, np.array([1.5, 2, 3, 0])), f"rank {last}: 1 labels outside [0, 50)"),
        "label strings": (with_last(x, np.array(["a", "b", "c", "d"])), f"rank {last}: labels must be integers"),
        "wrong width": (with_last(np.ones((4, 11), np.float32), y), f"rank {last}: embedding width 11 != "
                                                                     "embedding_size 8"),
        "1-D embeddings": (with_last(np.ones(4, np.float32), y), f"rank {last}: embeddings must be 2-D"),
        "labels per row": (with_last(x, y[:3]), f"rank {last}: labels must be 1-D with one label per embedding row"),
        "NaN": (with_last(np.where(np.arange(4)[:, None] == 2, np.nan, x).astype(np.float32), y),
                f"rank {last}: 8 NaN/Inf values in the embeddings"),
        "empty": (with_last(np.ones((0, D), np.float32), np.array([], np.int64)), f"rank {last}: empty batch"),
    }
    for name, (inputs, expected) in cases.items():
        found = problems_everywhere(inputs)
        assert any(expected in problem for problem in found), (name, found)
        with pytest.raises(exchange.PartialFCInputError, match="invalid PartialFC input"):
            exchange.raise_if_bad(gather(inputs)[0][0], D, C)


def test_float32_labels_refused_above_two_to_the_24():
    inputs = [(np.ones((2, D), np.float32), np.array([1.0, 2.0], np.float32))] * 2
    assert problems_everywhere(inputs, num_classes=2 ** 25) == [
        f"rank {r}: float32 labels cannot hold class ids above 2^24 = 16777216 exactly: pass int64 labels"
        for r in range(2)]


def test_batch_sizes_that_sum_to_a_regular_length_are_still_caught():
    # 5 + 3 == 2 x 4 rows: rank 1's own length times the world is the gathered length,
    # so rank 1 tries the regular layout first; the headers must send it to the walk.
    inputs = [good(0, rows=5), good(1, rows=4), good(2, rows=3)]
    seen = gather(inputs)
    assert seen[1][1] is None
    found = problems_everywhere(inputs)
    assert found == ["batch sizes differ across ranks: rank 0=5, rank 1=4, rank 2=3"]
