"""Shard math and the center sampler, in one process (no collectives needed)."""
import math

import mxnet as mx
import numpy as np
import pytest

from mxnet_pfc.head.sampler import CenterSampler, expected_draws, num_sampled_centers, shard_range


def mxnet_draws(n):
    """The head's source of draws: MXNet's generator (tests seed it with mx.random.seed)."""
    return lambda count: mx.nd.random.randint(0, n, shape=(count,), dtype="int32").asnumpy()


@pytest.mark.parametrize("num_classes", [1, 7, 103, 1000, 10 ** 9 + 7])
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7, 16, 64])
def test_shards_cover_every_class_once(num_classes, world):
    if num_classes < world:
        with pytest.raises(ValueError, match="must be at least the world size"):
            shard_range(num_classes, 0, world)
        return
    ranges = [shard_range(num_classes, r, world) for r in range(world)]
    position = 0
    for start, count in ranges:
        assert start == position and count >= 1
        position += count
    assert position == num_classes
    counts = [c for _, c in ranges]
    assert max(counts) - min(counts) <= 1 and counts == sorted(counts, reverse=True)


def test_shard_range_rejects_bad_rank():
    with pytest.raises(ValueError, match="rank 2 is not in a world of size 2"):
        shard_range(10, 2, 2)


def test_num_sampled_centers():
    assert num_sampled_centers(500_000, 0.1) == 50_000
    assert num_sampled_centers(5, 0.1) == 1            # at least one
    assert num_sampled_centers(10, 1.0) == 10


@pytest.mark.parametrize("n, d", [(10, 1), (1000, 100), (500_000, 50_000), (100, 99)])
def test_expected_draws_covers_the_mean(n, d):
    mean = n * math.log(n / (n - d))
    assert expected_draws(n, d) > mean + 2 * math.sqrt(mean)
    assert expected_draws(n, n) == 0


def sample(sampler, labels, n):
    return sampler.sample(np.where((labels >= 0) & (labels < n), labels, n))


@pytest.mark.parametrize("n, k, labels", [
    (1000, 100, [3, 3, 999, 1000, 5000, 17]),     # repeats and other ranks' labels
    (50, 5, list(range(0, 40, 2))),               # positives (20) outnumber k: all kept
    (30, 29, [0, 29]),                            # nearly all classes
])
def test_sample_has_positives_exact_count_no_repeats(n, k, labels):
    mx.random.seed(3)
    sampler = CenterSampler(n, k, mxnet_draws(n))
    labels = np.array(labels)
    for _ in range(20):
        index, target = sample(sampler, labels, n)
        positives = np.unique(labels[labels < n])
        assert len(index) == max(k, len(positives))
        assert (np.diff(index) > 0).all() and index.min() >= 0 and index.max() < n
        assert np.isin(positives, index).all()
        mine = labels < n
        assert (index[target[mine]] == labels[mine]).all()   # target = column of the label


def test_negatives_are_uniform_without_replacement():
    """Each negative class is drawn with probability (k - P) / (n - P); pairs too."""
    n, k, trials = 20, 6, 6000
    labels = np.array([4, 11, 11])                 # P = 2 positives
    mx.random.seed(5)
    sampler = CenterSampler(n, k, mxnet_draws(n))
    counts = np.zeros(n)
    pair = 0
    for _ in range(trials):
        index, _ = sample(sampler, labels, n)
        counts[index] += 1
        pair += (0 in index) and (19 in index)
    assert counts[4] == counts[11] == trials
    negatives = np.delete(counts, [4, 11])
    p = (k - 2) / (n - 2)
    sigma = math.sqrt(trials * p * (1 - p))
    assert np.abs(negatives - trials * p).max() < 4.5 * sigma, negatives
    p_pair = p * (k - 3) / (n - 3)                 # without replacement, not p ** 2
    assert abs(pair - trials * p_pair) < 4.5 * math.sqrt(trials * p_pair)


def test_full_rate_uses_every_center():
    sampler = CenterSampler(10, 10, mxnet_draws(10))
    index, target = sample(sampler, np.array([3, 12]), 10)
    assert (index == np.arange(10)).all() and target[0] == 3


def test_random_shapes_give_valid_samples():
    """Repeated draws, draws of positives, other ranks' labels and redraws (too few distinct
    draws), over 150 random shapes: every positive, exactly max(k, positives) sorted
    distinct ids, each row's column, and negatives only from the draws."""
    rng = np.random.default_rng(0)
    for trial in range(150):
        n, N = int(rng.integers(5, 300)), int(rng.integers(1, 40))
        k = int(rng.integers(1, n))
        labels = rng.integers(-5, n + 20, N)
        mine = (labels >= 0) & (labels < n)
        sampler = CenterSampler(n, k, mxnet_draws(n))
        mx.random.seed(trial)
        index, target = sample(sampler, labels, n)
        positives = np.unique(labels[mine])
        assert index.dtype == np.int32 and target.dtype == np.int32, trial
        assert len(index) == max(k, len(positives)), trial
        assert (np.diff(index) > 0).all() and index.min() >= 0 and index.max() < n, trial
        assert np.isin(positives, index).all(), trial
        assert (index[target[mine]] == labels[mine]).all(), trial
        # the same draws again: every negative is one of them (the first round's, or a redraw's)
        mx.random.seed(trial)
        draws = np.concatenate([mx.nd.random.randint(0, n, shape=(sampler.num_draws * 2 ** r,), dtype="int32").asnumpy()
                                for r in range(3)])
        assert np.isin(np.setdiff1d(index, positives), draws).all(), trial
