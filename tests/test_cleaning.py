"""Sub-center cleaning's rule for one class, against insightface's cleaning loop transcribed, and on planted noise."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxnet_pfc.data.cleaning import judge_class


def drop_py(x, subcenters, threshold):
    """recognition/subcenter_arcface/drop.py's loop over one class, as written there (sklearn's normalize
    replaced by its arithmetic): the kept images' indices and the dominant sub-center."""
    x = x / np.linalg.norm(x, axis=1, keepdims=True)
    subcenters = subcenters / np.linalg.norm(subcenters, axis=1, keepdims=True)
    K = subcenters.shape[0]
    K_stat = np.zeros((K,), dtype=int)
    for i in range(x.shape[0]):
        sim = np.dot(subcenters, x[i])
        K_stat[np.argmax(sim)] += 1
    dominant_index = np.argmax(K_stat)
    sim = np.dot(x, subcenters[dominant_index])
    return np.where(sim > np.cos(np.pi * threshold / 180.0))[0], int(dominant_index)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 40), k=st.integers(1, 5), d=st.integers(2, 16),
       threshold=st.floats(10.0, 120.0))
def test_the_verdict_is_drop_pys(seed, n, k, d, threshold):
    rng = np.random.default_rng(seed)
    subcenters = rng.normal(size=(k, d))
    x = subcenters[rng.integers(0, k, n)] + rng.normal(scale=rng.uniform(0.1, 2.0), size=(n, d))
    verdict = judge_class(x, subcenters, threshold)
    kept, dominant = drop_py(x, subcenters, threshold)
    assert verdict.dominant == dominant
    assert np.array_equal(np.flatnonzero(verdict.kept), kept)
    clear = np.abs(verdict.angles - threshold) > 1e-6          # the angle says the same, off the boundary
    assert np.all(((verdict.angles < threshold) == verdict.kept)[clear])


def test_planted_noise_is_what_is_dropped():
    """A class whose 30 clean faces gather at sub-center 2, with 8 faces of other people: the 8 are dropped,
    the clean ones kept, whichever sub-center the stray faces sit at."""
    rng = np.random.default_rng(0)
    subcenters = rng.normal(size=(3, 64))
    clean = subcenters[2] + 0.3 * rng.normal(size=(30, 64)) * np.linalg.norm(subcenters[2]) / 8
    noise = rng.normal(size=(8, 64))
    noise[:4] = subcenters[0] + 0.1 * rng.normal(size=(4, 64))       # some sit at a non-dominant sub-center
    verdict = judge_class(np.concatenate([clean, noise]), subcenters)
    assert verdict.dominant == 2
    assert verdict.kept[:30].all() and not verdict.kept[30:].any()


def test_ties_and_refusals():
    subcenters = np.eye(3)
    x = np.array([[1.0, 0, 0], [0, 1.0, 0]])             # one image nearest each of two sub-centers
    assert judge_class(x, subcenters, 45).dominant == 0    # the first among equals, as drop.py's argmax
    assert judge_class(np.zeros((0, 3)), subcenters).kept.shape == (0,)
    with pytest.raises(ValueError, match="an angle in degrees"):
        judge_class(x, subcenters, 0)
