"""Bad input raises a clear error on every rank, within seconds, and never hangs."""
import json
import re

import mxnet as mx
import numpy as np
import pytest

from launch import run_ranks
from mxnet_pfc import CombinedMarginLoss, PartialFC, PartialFCInputError

# What each case's message must say (dist_worker.bad_cases builds the inputs).
EXPECTED = {
    "label_too_large": r"rank {last}: 1 labels outside \[0, 50\) \(smallest 1, largest 55\)",
    "label_negative": r"rank {last}: 1 labels outside \[0, 50\) \(smallest -1, largest 3\)",
    "label_fraction": r"rank {last}: 1 labels outside \[0, 50\)",
    "label_strings": r"rank {last}: labels must be integers",
    "wrong_width": r"rank {last}: embedding width 11 != embedding_size 8",
    "batch_differs": r"batch sizes differ across ranks: rank 0=4, rank 1=3",
    "nan_embedding": r"rank {last}: 32 NaN/Inf values in the embeddings",
    "inf_embedding": r"rank {last}: 4 NaN/Inf values in the embeddings",
}


@pytest.mark.parametrize("world", [2, 3])
def test_every_rank_raises_the_same_clear_error(world, tmp_path):
    proc = run_ranks(world, ["tests/dist_worker.py", "bad", tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    for case, pattern in EXPECTED.items():
        messages = [rep[case]["error"] for rep in reports]
        assert all(messages), f"{case}: a rank did not raise: {messages}"
        assert len(set(messages)) == 1, f"{case}: ranks raised different errors"
        assert re.search(pattern.format(last=world - 1), messages[0]), messages[0]
        assert max(rep[case]["seconds"] for rep in reports) < 10
    # The good step afterwards runs and agrees: bad input left no collective half-done.
    assert len({rep["after"]["loss"] for rep in reports}) == 1


@pytest.mark.parametrize("case", ["label_too_large", "nan_embedding", "batch_differs"])
def test_uncaught_bad_input_ends_the_job(case):
    proc = run_ranks(2, ["tests/dist_worker.py", "bad-uncaught", case], timeout=90)
    assert proc.returncode != 0
    assert "step finished" not in proc.stdout
    for rank in (0, 1):
        assert re.search(rf"\[{rank}\]<stderr>:.*PartialFCInputError: invalid PartialFC input", proc.stdout), \
            proc.stdout[-3000:]


def test_settings_that_differ_across_ranks_are_refused():
    proc = run_ranks(2, ["tests/dist_worker.py", "bad-config"], timeout=90)
    assert proc.returncode != 0
    assert "constructed" not in proc.stdout
    for rank in (0, 1):
        assert re.search(rf"\[{rank}\]<stderr>:.*PartialFC settings differ across ranks: "
                         r"num_classes: rank 0=50, rank 1=51", proc.stdout), proc.stdout[-3000:]


@pytest.mark.parametrize("world, value, threshold, kernels", [
    (2, "nan", 0, "1"), (3, "nan", 0, "1"), (2, "inf", 0, "1"),
    # Inter-class filtering must not turn a NaN or +Inf logit into a filtered 0, in either kernel
    # path. A center of norm 1e-30 has inverse norm Inf (its square underflows): Inf logits.
    (2, "1e-30", 0.3, "1"), (2, "1e-30", 0.3, "0")])
def test_nan_loss_stops_every_rank_before_a_center_moves(world, value, threshold, kernels, tmp_path):
    proc = run_ranks(world, ["tests/dist_worker.py", "nan-center", tmp_path, value, threshold], timeout=120,
                     env={"MXNET_PFC_KERNELS": kernels})
    assert proc.returncode == 0, proc.stdout[-4000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    start = 50 - 50 // world          # the last rank's shard
    for report in reports:
        assert report["error"] and report["unchanged"], report
        assert re.search(rf"the loss is (nan|inf): non-finite logits from the centers of rank {world - 1} "
                         rf"\(classes {start}\.\.49\); stopped before updating the centers", report["error"])


def make_head(num_classes=50, **kw):
    return PartialFC(CombinedMarginLoss(), embedding_size=8, num_classes=num_classes, **kw)


def test_float32_labels_refused_when_they_cannot_be_exact():
    pfc = make_head(num_classes=2 ** 24 + 10, sample_rate=0.001)
    x = mx.nd.ones((2, 8))
    with pytest.raises(PartialFCInputError,
                       match="float32 labels cannot hold class ids above 2\\^24 = 16777216 exactly"):
        pfc.forward_backward(x, mx.nd.array([1, 2], dtype="float32"))
    # int64 labels above 2^24 are exact and fine.
    loss, _ = pfc.forward_backward(x, np.array([2 ** 24 + 1, 2 ** 24 + 9], dtype=np.int64))
    assert np.isfinite(loss)


def test_labels_must_be_numbers():
    with pytest.raises(PartialFCInputError, match="labels must be integers"):
        make_head().forward_backward(mx.nd.ones((2, 8)), np.array(["a", "b"]))


def test_wrong_label_count_and_shape():
    pfc = make_head()
    with pytest.raises(PartialFCInputError, match="labels must be 1-D with one label per embedding row"):
        pfc.forward_backward(mx.nd.ones((3, 8)), np.array([1, 2]))
    with pytest.raises(PartialFCInputError, match="embeddings must be 2-D"):
        pfc.forward_backward(mx.nd.ones((3, 8, 1)), np.array([1, 2, 3]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(sample_rate=0.0), "sample_rate must be in"),
    (dict(sample_rate=1.5), "sample_rate must be in"),
    (dict(num_classes=0), "num_classes must be a positive integer"),
])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        make_head(**kwargs)


def test_bad_margin():
    with pytest.raises(ValueError, match="margin scale s must be positive"):
        CombinedMarginLoss(s=0)
    with pytest.raises(ValueError, match="unknown margin 'arc'; choose one of"):
        CombinedMarginLoss.from_name("arc")


def test_float32_ndarray_labels_give_the_same_step_as_int64():
    """MXNet iterators hand labels over as float32 NDArrays: same loss, gradient, centers."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 8)).astype(np.float32)
    y = rng.integers(0, 50, 6)
    results = []
    for labels in (mx.nd.array(y, dtype="float32"), y.astype(np.int64)):
        pfc = make_head()
        pfc.bank.weight[:] = np.ones((50, 8), dtype=np.float32) + np.arange(50, dtype=np.float32)[:, None] * 0.01
        loss, grad = pfc.forward_backward(mx.nd.array(x), labels)
        results.append((loss, grad.asnumpy(), pfc.bank.weight.asnumpy()))
    assert results[0][0] == results[1][0]
    assert np.array_equal(results[0][1], results[1][1]) and np.array_equal(results[0][2], results[1][2])
