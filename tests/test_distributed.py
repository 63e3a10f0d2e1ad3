"""Sharded head on 1-4 CPU ranks (horovodrun, Gloo) against one dense float64 numpy computation."""

import numpy as np
import pytest

import reference
from launch import golden_ranks
from reference import loss_and_grads, sgd_momentum

MARGINS = {"arcface": (64.0, 1.0, 0.5, 0.0), "cosface": (64.0, 1.0, 0.0, 0.4),
           "combined": (32.0, 0.9, 0.4, 0.15)}
# (num_classes, sample_rate): 103 is prime, so no world size divides it; with 103
# classes and rate 0.1 the positives outnumber num_sample; 1009 leaves room for negatives.
SETTINGS = {"full": (103, 1.0), "sampled": (1009, 0.1), "overflow": (103, 0.1)}
# name -> (margin, setting, inter-class filtering threshold T (0 = off), micro-batches per step K).
# With D = 32 random vectors, T = 0.25 filters about one negative cosine in ten.
SCENARIOS = {**{f"{m}-{s}": (m, s, 0.0, 1) for m in MARGINS for s in SETTINGS},
             **{f"{m}-{s}-filtered": (m, s, 0.25, 1) for m, s in
                [("arcface", "full"), ("combined", "sampled"), ("cosface", "overflow")]},
             "combined-sampled-accum3": ("combined", "sampled", 0.0, 3),
             "arcface-full-filtered-accum2": ("arcface", "full", 0.25, 2)}
D, B = 32, 4
LRS = (0.1, 0.05)          # the learning rate changes between the two steps
RTOL = 1e-4                # relative to the largest magnitude of the expected array
# (world size, implementation of the memory-bound steps): the fused CPU kernels
# everywhere, the MXNet-op composition (the GPU path) on 1-3 ranks.
RUNS = [(w, "fused") for w in (1, 2, 3, 4)] + [(w, "mxnet") for w in (1, 2, 3)]


def make_inputs(world, path):
    rng = np.random.default_rng(world)
    arrays = {"scenarios": np.array(list(SCENARIOS))}
    for name, (margin, setting, threshold, micro_batches) in SCENARIOS.items():
        C, rate = SETTINGS[setting]
        w = rng.normal(size=(C, D)).astype(np.float32)
        arrays[f"{name}/margin"] = np.array(MARGINS[margin])
        arrays[f"{name}/filter"] = np.array(threshold)
        arrays[f"{name}/micro_batches"] = np.array(micro_batches)
        arrays[f"{name}/rate"] = np.array(rate)
        arrays[f"{name}/lrs"] = np.array(LRS)
        arrays[f"{name}/weight"] = w
        arrays[f"{name}/mom"] = (0.01 * rng.normal(size=(C, D))).astype(np.float32)
        for step in range(len(LRS)):
            for micro in range(micro_batches):      # one global batch each
                y = rng.integers(0, C, size=B * world)
                x = rng.normal(size=(B * world, D))
                # Targets almost opposite their center: m1 * theta + m2 > pi, the fallback branch.
                x[:2] = -w[y[:2]] + 0.01 * rng.normal(size=(2, D))
                # Confident rows, as late in training: the target logit without margin
                # dwarfs every other logit (a softmax that subtracts it loses precision).
                x[2:4] = w[y[2:4]] + 0.1 * rng.normal(size=(2, D))
                arrays[f"{name}/x{step}.{micro}"] = x.astype(np.float32)
                arrays[f"{name}/y{step}.{micro}"] = y
    np.savez(path, **arrays)
    return arrays


@pytest.fixture(scope="module", params=RUNS, ids=lambda run: f"world{run[0]}-{run[1]}")
def golden_run(request, tmp_path_factory):
    world, ops = request.param
    tmp = tmp_path_factory.mktemp(f"golden{world}{ops}")
    inputs = make_inputs(world, tmp / "inputs.npz")
    return world, inputs, golden_ranks("tests/dist_worker.py", world, ops, tmp / "inputs.npz", tmp, SCENARIOS)


def assert_close(actual, expected, what):
    reference.assert_close(actual, expected, what, RTOL)


@pytest.mark.parametrize("name", SCENARIOS)
def test_loss_grad_and_centers_match_float64(golden_run, name):
    world, inputs, ranks = golden_run
    margin, setting, threshold, micro_batches = SCENARIOS[name]
    s, m1, m2, m3 = MARGINS[margin]
    C, rate = SETTINGS[setting]
    starts = [int(r[f"{name}/class_start"]) for r in ranks]
    counts = np.diff(starts + [C])
    assert starts[0] == 0 and (counts > 0).all() and counts.max() - counts.min() <= 1
    weight = inputs[f"{name}/weight"]
    mom = inputs[f"{name}/mom"]
    for step, lr in enumerate(LRS):
        # The step's gradient: the mean loss over its micro-batches, each a softmax over the
        # centers it sampled; the centers stay put until all are done, then one SGD step.
        center_grad, used_by_step = np.zeros((C, D)), []
        for micro in range(micro_batches):
            x, y = inputs[f"{name}/x{step}.{micro}"], inputs[f"{name}/y{step}.{micro}"]
            key = f"{name}/{step}.{micro}"
            # Which centers took part: positives always, exact count, sorted, no repeats.
            used = []
            for r, res in enumerate(ranks):
                index = res[key + "/index"]
                assert (np.diff(index) > 0).all(), "sampled index must be sorted without duplicates"
                own = np.unique(y[(y >= starts[r]) & (y < starts[r] + counts[r])]) - starts[r]
                assert np.isin(own, index).all(), "every positive of the global batch is sampled"
                want = counts[r] if rate == 1.0 else max(int(res[f"{name}/num_sample"]), len(own))
                assert len(index) == want
                used.append(index + starts[r])
            used = np.concatenate(used)
            used_by_step.append(used)
            # The reference: dense float64 softmax over the centers that took part.
            loss, dx, dw = loss_and_grads(x, np.searchsorted(used, y), weight[used], s, m1, m2, m3, threshold)
            center_grad[used] += dw / micro_batches
            losses = [float(res[key + "/loss"]) for res in ranks]
            assert len(set(losses)) == 1, f"ranks disagree on the loss: {losses}"
            assert abs(losses[0] - loss) <= RTOL * abs(loss)
            assert_close(np.concatenate([res[key + "/grad"] for res in ranks]), dx / micro_batches,
                         "embedding gradient")
            if micro < micro_batches - 1:        # the centers wait for the step's last micro-batch
                assert np.array_equal(np.concatenate([res[key + "/weight"] for res in ranks]), weight)
                assert np.array_equal(np.concatenate([res[key + "/mom"] for res in ranks]), mom)
        used = np.unique(np.concatenate(used_by_step))
        if micro_batches > 1 and rate < 1:
            assert len(used) > max(map(len, used_by_step)), "micro-batches should sample different negatives"
        new_w, new_mom = sgd_momentum(weight[used].astype(np.float64), mom[used].astype(np.float64),
                                      center_grad[used], lr, 0.9, 5e-4)
        got_w = np.concatenate([res[key + "/weight"] for res in ranks])
        got_mom = np.concatenate([res[key + "/mom"] for res in ranks])
        assert_close(got_mom[used], new_mom, "momentum of sampled centers")
        assert_close(got_w[used], new_w, "sampled centers")
        untouched = np.setdiff1d(np.arange(C), used)
        assert np.array_equal(got_w[untouched], weight[untouched]), "unsampled centers changed"
        assert np.array_equal(got_mom[untouched], mom[untouched]), "unsampled momentum changed"
        weight, mom = got_w, got_mom    # the next step starts from this (checked) state


def test_fallback_branch_is_exercised():
    """The inputs above do put targets where m1 * theta + m2 > pi."""
    inputs = make_inputs(2, "/dev/null")
    for margin in ("arcface", "combined"):
        name = f"{margin}-full"
        x, y, w = inputs[f"{name}/x0.0"], inputs[f"{name}/y0.0"], inputs[f"{name}/weight"]
        c = np.sum(x[:2] * w[y[:2]], 1) / np.linalg.norm(x[:2], axis=1) / np.linalg.norm(w[y[:2]], axis=1)
        _, m1, m2, _ = MARGINS[margin]
        assert (m1 * np.arccos(c) + m2 > np.pi).all()


def test_filtering_is_exercised():
    """The filtered scenarios do filter: many negative cosines lie above T, and so do the
    targets of the confident rows, which the filter must leave alone."""
    inputs = make_inputs(2, "/dev/null")
    for name, (_, _, threshold, _) in SCENARIOS.items():
        if not threshold:
            continue
        x, y, w = inputs[f"{name}/x0.0"], inputs[f"{name}/y0.0"], inputs[f"{name}/weight"]
        cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
        negative = np.ones_like(cos, dtype=bool)
        negative[np.arange(len(y)), y] = False
        assert (cos[negative] > threshold).mean() > 0.05, name
        assert (cos[~negative] > threshold).any(), f"{name}: a confident target must stay unfiltered"


def test_broadcast_parameters_gives_every_rank_the_roots_values_in_every_dtype(tmp_path):
    """comm.broadcast_parameters (the backbone at start, a pretrained or teacher model) on 3 ranks from rank 1:
    every rank ends with rank 1's values, dtype and shape, NaN included (one allreduce per dtype, the others
    contributing zeros; Horovod's in-place broadcast crashed now and then)."""
    from launch import run_ranks
    proc = run_ranks(3, ["tests/dist_worker.py", "broadcast", tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    ranks = [dict(np.load(tmp_path / f"rank{r}.npz")) for r in range(3)]
    root = ranks[1]
    assert not np.array_equal(ranks[0]["before/b_weight"], root["before/b_weight"])     # they did differ
    for got in ranks:
        for name in ("a_gamma", "b_weight", "c_var", "d_half"):
            after, expected = got[f"after/{name}"], root[f"before/{name}"]
            assert after.dtype == expected.dtype and after.shape == expected.shape, name
            np.testing.assert_array_equal(after, expected)          # NaN where NaN, -0.0 == 0.0
