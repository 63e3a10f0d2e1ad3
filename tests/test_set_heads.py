"""Several sets, one head each (SetHeads) on 1-4 CPU ranks, against one dense float64 numpy computation.

The objective is sum_s weight_s x L_s, L_s the mean Partial FC loss of set s's rows of the global batch
(docs/DESIGN.md 2.13): the loss, the embedding gradient in the batch's row order, and every head's
centers and momentum after its SGD step are checked, at sample rates 1.0 and 0.1, with gradient
accumulation, the second step starting from the first one's (checked) centers.
"""
import numpy as np
import pytest

import reference
from launch import golden_ranks
from reference import loss_and_grads, sgd_momentum

D = 32
MARGIN = (64.0, 1.0, 0.5, 0.0)         # ArcFace
LRS = (0.1, 0.05)
RTOL = 1e-4
# name -> ((classes, sample rate) per set, rows per rank per set, set weights, micro-batches per step).
# 103 and 211 are primes (no world size divides them); 1009 classes at rate 0.1 leave room for negatives.
SCENARIOS = {
    "full": (((103, 1.0), (211, 1.0)), (3, 2), (1.0, 1.0), 1),
    "sampled-weighted": (((1009, 0.1), (103, 1.0)), (4, 2), (1.0, 0.5), 1),
    "sampled-accum2": (((103, 1.0), (1009, 0.1)), (2, 3), (0.7, 1.3), 2),
}
RUNS = [(w, "fused") for w in (1, 2, 3, 4)] + [(2, "mxnet")]


def make_inputs(world, path):
    rng = np.random.default_rng(100 + world)
    arrays = {"scenarios": np.array(list(SCENARIOS))}
    for name, (sets, rows, weights, micro_batches) in SCENARIOS.items():
        arrays[f"{name}/sets"] = np.array(len(sets))
        arrays[f"{name}/margin"] = np.array(MARGIN)
        arrays[f"{name}/rows"] = np.array(rows)
        arrays[f"{name}/set_weights"] = np.array(weights)
        arrays[f"{name}/micro_batches"] = np.array(micro_batches)
        arrays[f"{name}/lrs"] = np.array(LRS)
        for k, (classes, rate) in enumerate(sets):
            arrays[f"{name}/{k}/rate"] = np.array(rate)
            arrays[f"{name}/{k}/weight"] = rng.normal(size=(classes, D)).astype(np.float32)
            arrays[f"{name}/{k}/mom"] = (0.01 * rng.normal(size=(classes, D))).astype(np.float32)
        for step in range(len(LRS)):
            for micro in range(micro_batches):
                for k, (classes, _) in enumerate(sets):
                    key = f"{name}/{step}.{micro}/{k}"
                    arrays[f"{key}/y"] = rng.integers(0, classes, size=rows[k] * world)
                    arrays[f"{key}/x"] = rng.normal(size=(rows[k] * world, D)).astype(np.float32)
    np.savez(path, **arrays)
    return arrays


@pytest.fixture(scope="module", params=RUNS, ids=lambda run: f"world{run[0]}-{run[1]}")
def golden_run(request, tmp_path_factory):
    world, ops = request.param
    tmp = tmp_path_factory.mktemp(f"sets{world}{ops}")
    inputs = make_inputs(world, tmp / "inputs.npz")
    ranks = golden_ranks("tests/set_heads_worker.py", world, ops, tmp / "inputs.npz", tmp, SCENARIOS)
    assert all(str(res[f"{name}/{k}/ops"]) == ops for res in ranks for name in SCENARIOS
               for k in range(len(SCENARIOS[name][0]))), "a head ran the wrong implementation"
    return world, inputs, ranks


def assert_close(actual, expected, what):
    reference.assert_close(actual, expected, what, RTOL)


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_weighted_sum_of_the_sets_losses_matches_float64(golden_run, name):
    world, inputs, ranks = golden_run
    sets, rows, set_weights, micro_batches = SCENARIOS[name]
    s, m1, m2, m3 = MARGIN
    state = [(inputs[f"{name}/{k}/weight"], inputs[f"{name}/{k}/mom"]) for k in range(len(sets))]
    for step, lr in enumerate(LRS):
        center_grads = [np.zeros((classes, D)) for classes, _ in sets]
        used_by_set = [[] for _ in sets]
        for micro in range(micro_batches):
            key = f"{name}/{step}.{micro}"
            total, grads = 0.0, []
            for k, ((classes, rate), (weight, _)) in enumerate(zip(sets, state)):
                x, y = inputs[f"{key}/{k}/x"], inputs[f"{key}/{k}/y"]
                used = np.concatenate([res[f"{key}/{k}/index"] + int(res[f"{name}/{k}/class_start"])
                                       for res in ranks])
                assert np.isin(y, used).all(), "every positive of the set's global batch is sampled"
                if rate == 1.0:
                    assert np.array_equal(used, np.arange(classes))
                used_by_set[k].append(used)
                loss, dx, dw = loss_and_grads(x, np.searchsorted(used, y), weight[used], s, m1, m2, m3)
                total += set_weights[k] * loss
                grads.append(set_weights[k] * dx / micro_batches)
                center_grads[k][used] += set_weights[k] * dw / micro_batches
            losses = [float(res[key + "/loss"]) for res in ranks]
            assert len(set(losses)) == 1, f"ranks disagree on the loss: {losses}"
            assert abs(losses[0] - total) <= RTOL * abs(total)
            # rank r's rows: set 0's rows[0] of its share of the global batch, then set 1's
            expected = np.concatenate([np.concatenate([grads[k][r * rows[k]:(r + 1) * rows[k]]
                                                       for k in range(len(sets))]) for r in range(world)])
            assert_close(np.concatenate([res[key + "/grad"] for res in ranks]), expected, "embedding gradient")
        for k in range(len(sets)):
            weight, mom = state[k]
            used = np.unique(np.concatenate(used_by_set[k]))
            new_w, new_mom = sgd_momentum(weight[used].astype(np.float64), mom[used].astype(np.float64),
                                          center_grads[k][used], lr, 0.9, 5e-4)
            got_w = np.concatenate([res[f"{key}/{k}/weight"] for res in ranks])
            got_mom = np.concatenate([res[f"{key}/{k}/mom"] for res in ranks])
            assert_close(got_mom[used], new_mom, f"set {k}: momentum of sampled centers")
            assert_close(got_w[used], new_w, f"set {k}: sampled centers")
            untouched = np.setdiff1d(np.arange(len(weight)), used)
            assert np.array_equal(got_w[untouched], weight[untouched]), f"set {k}: unsampled centers changed"
            state[k] = (got_w, got_mom)


def test_set_heads_refuse_what_cannot_be_a_set():
    from mxnet_pfc import CombinedMarginLoss, PartialFC
    from mxnet_pfc.head.set_heads import SetHeads
    heads = [PartialFC(CombinedMarginLoss(), embedding_size=8, num_classes=10) for _ in range(2)]
    for rows, weights, said in (([3], None, "2 heads, 1 row counts"), ([3, 0], None, "at least one row"),
                                ([3, 2], [1.0, 0.0], "positive finite"), ([3, 2], [1.0, float("nan")], "positive")):
        with pytest.raises(ValueError, match=said):
            SetHeads(heads, rows, weights)
    import mxnet as mx
    with pytest.raises(ValueError, match="a batch of 4 rows on this rank; the sets give 3 \\+ 2 = 5"):
        SetHeads(heads, [3, 2]).forward_backward(mx.nd.zeros((4, 8)), np.zeros(4, dtype=np.int64))
