"""The golden check of a margin loss under the sharded, sampled head, the one shape of the five per-loss files
(test_adaface.py, test_curricularface.py, test_elasticface.py, test_magface.py, test_subcenter.py): the
package's head on W ranks against a dense float64 reference of the official loss.

Each of them supplies its margins (the loss name and parameters the worker builds, margin.make_margin), a
batch maker that reaches the loss's branches, and an "official" object written from the loss's official code,
sharing nothing with mxnet_pfc; registers them (register); and checks every scenario (check_scenario) and that
bad parameters are refused naming the field (assert_refused):

  official.logits(cos (N, C), labels (N,), norms (N,)) -> (logits, d logits / d cos, d logits / d norm or None)
      updating its running statistics / draws first, as the official forward does; with K centers per class
      (sub-center ArcFace) cos is (N, C * K), class-major, logits (N, C) and d logits / d cos (N, C * K): the
      derivative of each row's class logit in that row's cosine
  official.penalty(norms) -> (values (N,), d values / d norm) or None   (MagFace's regulariser)
  official.state() -> dict                       compared with the head's Margin.state() after every call
"""
import json

import numpy as np
import pytest

import reference
from launch import golden_ranks
from reference import sgd_momentum

D, B = 32, 4
LRS = (0.1, 0.05, 0.02)     # three steps
RTOL = 1e-4
# (world size, implementation of the memory-bound steps): fused CPU kernels, and the MXNet-op path on 2 ranks.
RUNS = [(1, "fused"), (2, "fused"), (3, "fused"), (4, "fused"), (2, "mxnet")]
SETTINGS = {"full": (103, 1.0), "sampled": (1009, 0.1)}     # classes (uneven over 2-4 ranks), sample rate


def reference_step(official, x, labels, w):
    """Mean loss over the rows of x against centers w; (loss, dL/dx, dL/dw), float64.

    The embedding's gradient has its tangential part (through the cosines) and, where the loss depends on the
    norm (MagFace), the radial part dL/d|x| * x / |x|."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    N = x.shape[0]
    xn = np.linalg.norm(x, axis=1, keepdims=True)
    wn = np.linalg.norm(w, axis=1, keepdims=True)
    xh, wh = x / xn, w / wn
    logits, dlogits_dcos, dlogits_dnorm = official.logits(xh @ wh.T, labels, xn[:, 0])
    K = w.shape[0] // logits.shape[1]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(N), labels]))
    onehot = np.zeros_like(p)
    onehot[np.arange(N), labels] = 1.0
    dlogits = (p - onehot) / N
    dcos = np.repeat(dlogits, K, axis=1) * dlogits_dcos
    dxh, dwh = dcos @ wh, dcos.T @ xh
    dx = (dxh - xh * np.sum(dxh * xh, axis=1, keepdims=True)) / xn
    dnorm = np.zeros(N) if dlogits_dnorm is None else np.sum(dlogits * dlogits_dnorm, axis=1)
    penalty = official.penalty(xn[:, 0])
    if penalty is not None:
        values, dvalues = penalty
        loss += np.mean(values)
        dnorm = dnorm + dvalues / N
    dx += dnorm[:, None] * xh
    dw = (dwh - wh * np.sum(dwh * wh, axis=1, keepdims=True)) / wn
    return loss, dx, dw


def scenario_arrays(rng, name, loss, params, setting, micro_batches, world, make_batch):
    """The inputs of one scenario: margin, centers (K = params' `subcenters`, default 1, rows per class),
    momentum, and per step and micro-batch a global batch make_batch(rng, w, world, params) -> (x (B*world, D)
    float32, labels)."""
    subcenters = params.get("subcenters", 1)
    C, rate = SETTINGS[setting]
    w = rng.normal(size=(C * subcenters, D)).astype(np.float32)
    arrays = {f"{name}/loss": np.array(loss), f"{name}/params": np.array(json.dumps(params)),
              f"{name}/classes": np.array(C),
              f"{name}/micro_batches": np.array(micro_batches), f"{name}/rate": np.array(rate),
              f"{name}/lrs": np.array(LRS), f"{name}/weight": w,
              f"{name}/mom": (0.01 * rng.normal(size=(C * subcenters, D))).astype(np.float32)}
    for step in range(len(LRS)):
        for micro in range(micro_batches):
            x, y = make_batch(rng, w, world, params)
            arrays[f"{name}/x{step}.{micro}"] = x.astype(np.float32)
            arrays[f"{name}/y{step}.{micro}"] = y
    return arrays


def scenarios(margins, accumulated: str) -> dict:
    """The scenarios of a margin test: name -> (margin, setting, micro-batches). Every margin of MARGINS in every
    setting of SETTINGS on one micro-batch, and ACCUMULATED sampled over two ("ACCUMULATED-sampled-accum2")."""
    return {**{f"{margin}-{setting}": (margin, setting, 1) for margin in margins for setting in SETTINGS},
            f"{accumulated}-sampled-accum2": (accumulated, "sampled", 2)}


_MAKERS = {}      # test name: its make_inputs(world) -> arrays (register)


def register(test: str, margins: dict, accumulated: str, make_batch, seed: int):
    """A margin test's scenarios (scenarios(MARGINS, ACCUMULATED)), run with every other registered test's in one
    launch per (world, ops) (conftest.margin_run, session-scoped: one horovodrun per run instead of one per loss),
    named TEST.NAME in the results; test modules register when imported, at collection. margins: margin name ->
    (loss of margin.LOSSES, its parameters; their `subcenters`, default 1, sets the centers' rows per class);
    make_batch(rng, centers, world, parameters) -> a global batch (x, labels). Returns make_inputs(world)."""
    def make_inputs(world: int) -> dict:
        rng = np.random.default_rng(seed + world)
        arrays = {}
        for name, (margin, setting, micro_batches) in scenarios(margins, accumulated).items():
            loss, params = margins[margin]
            arrays.update(scenario_arrays(rng, name, loss, params, setting, micro_batches, world, make_batch))
        return arrays
    _MAKERS[test] = make_inputs
    return make_inputs


def golden(run, tmp) -> "tuple[dict, list[dict]]":
    """(inputs, every rank's results) of every registered test's scenarios on run = (world, ops)."""
    world, ops = run
    inputs = {f"{test}.{key}": value for test, make in _MAKERS.items() for key, value in make(world).items()}
    return inputs, run_scenarios(tmp, world, ops, inputs)


def run_scenarios(tmp, world, ops, arrays) -> "list[dict]":
    """Every rank's results for the scenarios in `arrays` (scenario_arrays merged)."""
    names = sorted({key.split("/")[0] for key in arrays})
    np.savez(tmp / "inputs.npz", scenarios=np.array(names), **arrays)
    return golden_ranks("tests/margin_worker.py", world, ops, tmp / "inputs.npz", tmp, names)


def assert_refused(loss: str, field: str, kwargs: dict):
    """margin.make_margin(LOSS, **kwargs) raises MarginParameterError (a ValueError) naming FIELD."""
    from mxnet_pfc.head.margin import MarginParameterError, make_margin

    with pytest.raises(MarginParameterError, match=rf"\b{field}\b") as error:
        make_margin(loss, **kwargs)
    assert error.value.param == field


def check_scenario(official, inputs, ranks, name):
    """Loss, embeddings' gradient, centers and momentum, and the margin's state after every micro-batch of
    every step, against `official` on the global batch; identical on every rank."""
    C, micro_batches = int(inputs[f"{name}/classes"]), int(inputs[f"{name}/micro_batches"])
    K = inputs[f"{name}/weight"].shape[0] // C
    rate = float(inputs[f"{name}/rate"])
    starts = [int(r[f"{name}/class_start"]) for r in ranks]
    weight, mom = inputs[f"{name}/weight"], inputs[f"{name}/mom"]
    for step, lr in enumerate(LRS):
        center_grad, used_by_step = np.zeros((C * K, D)), []
        for micro in range(micro_batches):
            x, y = inputs[f"{name}/x{step}.{micro}"], inputs[f"{name}/y{step}.{micro}"]
            key = f"{name}/{step}.{micro}"
            used = np.concatenate([res[key + "/index"] + starts[r] for r, res in enumerate(ranks)])
            assert np.isin(y, used).all()
            if rate == 1.0:
                assert len(used) == C
            rows = (used[:, None] * K + np.arange(K)).reshape(-1)
            used_by_step.append(rows)
            loss, dx, dw = reference_step(official, x, np.searchsorted(used, y), weight[rows])
            center_grad[rows] += dw / micro_batches
            losses = [float(res[key + "/loss"]) for res in ranks]
            assert len(set(losses)) == 1, f"ranks disagree on the loss: {losses}"
            assert abs(losses[0] - loss) <= RTOL * abs(loss), (step, micro, losses[0], loss)
            states = {str(res[key + "/state"]) for res in ranks}
            assert len(states) == 1, f"ranks disagree on the margin's state: {states}"
            state, expected = json.loads(states.pop()), official.state()
            assert sorted(state) == sorted(expected)
            np.testing.assert_allclose([state[k] for k in sorted(state)], [expected[k] for k in sorted(state)],
                                       rtol=1e-6)
            reference.assert_close(np.concatenate([res[key + "/grad"] for res in ranks]), dx / micro_batches,
                                   "embedding gradient", RTOL)
        used = np.unique(np.concatenate(used_by_step))
        new_w, new_mom = sgd_momentum(weight[used].astype(np.float64), mom[used].astype(np.float64),
                                      center_grad[used], lr, 0.9, 5e-4)
        got_w = np.concatenate([res[key + "/weight"] for res in ranks])
        got_mom = np.concatenate([res[key + "/mom"] for res in ranks])
        reference.assert_close(got_mom[used], new_mom, "momentum of sampled centers", RTOL)
        reference.assert_close(got_w[used], new_w, "sampled centers", RTOL)
        untouched = np.setdiff1d(np.arange(C * K), used)
        assert np.array_equal(got_w[untouched], weight[untouched]), "unsampled centers changed"
        weight, mom = got_w, got_mom
    assert np.diff(starts + [C]).min() >= 0
