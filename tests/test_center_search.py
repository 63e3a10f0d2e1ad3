"""The most similar classes of another set by center cosine, blockwise over 1-3 ranks, against dense numpy."""
import numpy as np
import pytest

from launch import run_ranks
from mxnet_pfc.head import center_search
from mxnet_pfc.head.center_search import merge_top


def dense(a, b, k):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    cos = a.astype(np.float64) @ b.T.astype(np.float64)
    ids = np.argsort(-cos, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(cos, ids, 1), ids


@pytest.mark.parametrize("world,products", [(1, "numpy"), (2, "numpy"), (3, "numpy"), (2, "mxnet")])
def test_blockwise_search_over_ranks_finds_what_a_dense_search_finds(tmp_path, world, products):
    """37 B classes in blocks of 4 rows (several blocks per rank's shard), k = 5; 6 B classes planted near
    A classes are each A class's best match. The products by NumPy, or by MXNet (a context's: a GPU's path)."""
    rng = np.random.default_rng(world)
    a = rng.normal(size=(50, 16)).astype(np.float32)
    b = rng.normal(size=(37, 16)).astype(np.float32)
    planted = {3: 30, 17: 2, 25: 11, 40: 36, 41: 0, 49: 19}        # A class -> B class
    for i, j in planted.items():
        b[j] = a[i] + 0.05 * rng.normal(size=16)
    np.savez(tmp_path / "in.npz", a=a, b=b)
    proc = run_ranks(world, ["tests/center_search_worker.py", tmp_path / "in.npz", tmp_path, 5, 4, products],
                     timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(world)]
    cos = np.concatenate([r["cos"] for r in ranks])
    ids = np.concatenate([r["ids"] for r in ranks])
    want_cos, want_ids = dense(a, b, 5)
    assert np.array_equal(ids, want_ids)
    assert np.abs(cos - want_cos).max() < 1e-5
    assert all(ids[i, 0] == j for i, j in planted.items())
    assert all(int(r["rows_seen"]) == 37 for r in ranks), "every rank compared its A rows with every B row"


def test_merge_keeps_the_k_best_and_breaks_ties_by_the_lower_id():
    best_cos, best_id = np.array([[0.9, -np.inf]]), np.array([[7, -1]])
    cos, ids = merge_top(best_cos, best_id, np.array([[0.5, 0.9, 0.95]]), np.array([3, 2, 9]), 3)
    assert cos.tolist() == [[0.95, 0.9, 0.9]] and ids.tolist() == [[9, 2, 7]]


@pytest.mark.parametrize("sample", [3, 8, 2048])
def test_looking_only_at_the_cosines_that_can_enter_keeps_the_k_best(monkeypatch, sample):
    """merge_candidates (the cosines at or above the k-th best so far or the k-th best of a sample of the
    chunk) against merge_top over every cosine, chunk after chunk, with many ties (cosines on a grid)."""
    monkeypatch.setattr(center_search, "SAMPLE", sample)
    rng = np.random.default_rng(sample)
    k = 4
    best = (np.full((30, k), -np.inf, np.float32), np.full((30, k), -1, np.int64))
    want = best
    for first in range(0, 60, 20):
        cos = (rng.integers(-8, 9, size=(30, 20)) / 8).astype(np.float32)
        best = center_search.merge_candidates(*best, cos, first, k)
        want = merge_top(*want, cos, np.arange(first, first + 20), k)
        assert np.array_equal(best[0], want[0]) and np.array_equal(best[1], want[1])
