"""AdaFace under the sharded, sampled head on 1-3 CPU ranks against the official formula.

The reference below is written from mk-minchul/AdaFace head.py (commit c60eaa78, lines 77-120)
with dense float64 numpy and an explicit one-hot, sharing no code with mxnet_pfc: statistics
over the global batch (every rank holds every row's norm), the EMA updated before use, the
derivative of the official autograd (zero where a clamp binds).
"""
import json
import math
import re

import numpy as np
import pytest

import reference
from launch import golden_ranks, run_ranks
from reference import sgd_momentum

EPS = 1e-3
# (s, m, h, t_alpha): the published defaults, and a strong setting where the scaler clips at
# +-1 and theta + g_angular leaves [eps, pi - eps] (the clamps bind).
MARGINS = {"default": (64.0, 0.4, 0.333, 0.01), "strong": (32.0, 0.4, 3.0, 0.5)}
SETTINGS = {"full": (103, 1.0), "sampled": (1009, 0.1)}
SCENARIOS = {**{f"{m}-{s}": (m, s, 1) for m in MARGINS for s in SETTINGS},
             "strong-sampled-accum2": ("strong", "sampled", 2)}
D, B = 32, 4
LRS = (0.1, 0.05, 0.02)     # three steps
RTOL = 1e-4
# (world size, implementation of the memory-bound steps): fused CPU kernels, and the MXNet-op path on 2 ranks.
RUNS = [(1, "fused"), (2, "fused"), (3, "fused"), (2, "mxnet")]


class OfficialAdaFace:
    """head.py's running statistics and logits, float64."""

    def __init__(self, s, m, h, t_alpha):
        self.s, self.m, self.h, self.t_alpha = s, m, h, t_alpha
        self.batch_mean, self.batch_std = 20.0, 100.0

    def logits(self, cos, labels, norms):
        """(logits (N, C), d logits / d cos (N, C)); updates the statistics first."""
        safe = np.clip(norms, 0.001, 100.0)
        self.batch_mean = safe.mean() * self.t_alpha + (1 - self.t_alpha) * self.batch_mean
        self.batch_std = safe.std(ddof=1) * self.t_alpha + (1 - self.t_alpha) * self.batch_std
        scaler = np.clip((safe - self.batch_mean) / (self.batch_std + EPS) * self.h, -1, 1)[:, None]
        onehot = np.zeros_like(cos)
        onehot[np.arange(len(labels)), labels] = 1.0
        c = np.clip(cos, -1 + EPS, 1 - EPS)
        dc = ((cos >= -1 + EPS) & (cos <= 1 - EPS)).astype(float)
        theta = np.arccos(c)
        raw = theta + onehot * (self.m * scaler * -1)
        theta_m = np.clip(raw, EPS, math.pi - EPS)
        dtheta = ((raw >= EPS) & (raw <= math.pi - EPS)).astype(float)
        out = np.cos(theta_m) - onehot * (self.m + self.m * scaler)
        # d cos(theta_m) / d c = -sin(theta_m) * dtheta * d acos(c)/dc = sin(theta_m) / sin(theta)
        dout = np.sin(theta_m) * dtheta / np.sin(theta) * dc
        return self.s * out, self.s * dout


def reference_step(ada, x, labels, w):
    """Mean cross-entropy over the rows of x against centers w; (loss, dL/dx, dL/dw)."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    N = x.shape[0]
    xn = np.linalg.norm(x, axis=1, keepdims=True)
    wn = np.linalg.norm(w, axis=1, keepdims=True)
    xh, wh = x / xn, w / wn
    logits, dlogits_dcos = ada.logits(xh @ wh.T, labels, xn[:, 0])
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(N), labels]))
    onehot = np.zeros_like(p)
    onehot[np.arange(N), labels] = 1.0
    dcos = (p - onehot) / N * dlogits_dcos
    dxh, dwh = dcos @ wh, dcos.T @ xh
    dx = (dxh - xh * np.sum(dxh * xh, axis=1, keepdims=True)) / xn      # the norm is detached
    dw = (dwh - wh * np.sum(dwh * wh, axis=1, keepdims=True)) / wn
    return loss, dx, dw


def make_inputs(world, path):
    rng = np.random.default_rng(100 + world)
    arrays = {"scenarios": np.array(list(SCENARIOS))}
    for name, (margin, setting, micro_batches) in SCENARIOS.items():
        C, rate = SETTINGS[setting]
        w = rng.normal(size=(C, D)).astype(np.float32)
        arrays[f"{name}/margin"] = np.array(MARGINS[margin])
        arrays[f"{name}/micro_batches"] = np.array(micro_batches)
        arrays[f"{name}/rate"] = np.array(rate)
        arrays[f"{name}/lrs"] = np.array(LRS)
        arrays[f"{name}/weight"] = w
        arrays[f"{name}/mom"] = (0.01 * rng.normal(size=(C, D))).astype(np.float32)
        for step in range(len(LRS)):
            for micro in range(micro_batches):
                y = rng.integers(0, C, size=B * world)
                x = rng.normal(size=(B * world, D))
                x[:1] = -w[y[:1]] + 0.001 * rng.normal(size=(1, D))   # cosine below -1 + eps: clamped
                x[1:3] = w[y[1:3]] + 0.05 * rng.normal(size=(2, D))   # small theta: theta + g_angular < eps
                # Norms from 1 to 60 (the small-theta rows large: a positive scaler; row 3 small: a negative one).
                norms = rng.uniform(1.0, 60.0, size=B * world)
                norms[1:3], norms[3] = 60.0, 1.0
                x *= (norms / np.linalg.norm(x, axis=1))[:, None]
                arrays[f"{name}/x{step}.{micro}"] = x.astype(np.float32)
                arrays[f"{name}/y{step}.{micro}"] = y
    np.savez(path, **arrays)
    return arrays


@pytest.fixture(scope="module", params=RUNS, ids=lambda run: f"world{run[0]}-{run[1]}")
def ada_run(request, tmp_path_factory):
    world, ops = request.param
    tmp = tmp_path_factory.mktemp(f"adaface{world}{ops}")
    inputs = make_inputs(world, tmp / "inputs.npz")
    return world, inputs, golden_ranks("tests/adaface_worker.py", world, ops, tmp / "inputs.npz", tmp, SCENARIOS)


def assert_close(actual, expected, what):
    reference.assert_close(actual, expected, what, RTOL)


@pytest.mark.parametrize("name", SCENARIOS)
def test_adaface_matches_the_official_formula(ada_run, name):
    """Loss, embeddings' gradient, centers and momentum, and the running statistics after each of
    three steps, against OfficialAdaFace on the global batch; identical on every rank."""
    world, inputs, ranks = ada_run
    margin, setting, micro_batches = SCENARIOS[name]
    C, rate = SETTINGS[setting]
    ada = OfficialAdaFace(*MARGINS[margin])
    starts = [int(r[f"{name}/class_start"]) for r in ranks]
    counts = np.diff(starts + [C])
    weight, mom = inputs[f"{name}/weight"], inputs[f"{name}/mom"]
    for step, lr in enumerate(LRS):
        center_grad, used_by_step = np.zeros((C, D)), []
        for micro in range(micro_batches):
            x, y = inputs[f"{name}/x{step}.{micro}"], inputs[f"{name}/y{step}.{micro}"]
            key = f"{name}/{step}.{micro}"
            used = np.concatenate([res[key + "/index"] + starts[r] for r, res in enumerate(ranks)])
            assert np.isin(y, used).all()
            if rate == 1.0:
                assert len(used) == C
            used_by_step.append(used)
            loss, dx, dw = reference_step(ada, x, np.searchsorted(used, y), weight[used])
            center_grad[used] += dw / micro_batches
            losses = [float(res[key + "/loss"]) for res in ranks]
            assert len(set(losses)) == 1, f"ranks disagree on the loss: {losses}"
            assert abs(losses[0] - loss) <= RTOL * abs(loss), (losses[0], loss)
            states = [tuple(res[key + "/state"]) for res in ranks]
            assert len(set(states)) == 1, f"ranks disagree on the running statistics: {states}"
            np.testing.assert_allclose(states[0], (ada.batch_mean, ada.batch_std), rtol=1e-6)
            assert_close(np.concatenate([res[key + "/grad"] for res in ranks]), dx / micro_batches,
                         "embedding gradient")
        used = np.unique(np.concatenate(used_by_step))
        new_w, new_mom = sgd_momentum(weight[used].astype(np.float64), mom[used].astype(np.float64),
                                      center_grad[used], lr, 0.9, 5e-4)
        got_w = np.concatenate([res[key + "/weight"] for res in ranks])
        got_mom = np.concatenate([res[key + "/mom"] for res in ranks])
        assert_close(got_mom[used], new_mom, "momentum of sampled centers")
        assert_close(got_w[used], new_w, "sampled centers")
        untouched = np.setdiff1d(np.arange(C), used)
        assert np.array_equal(got_w[untouched], weight[untouched]), "unsampled centers changed"
        weight, mom = got_w, got_mom
    assert counts.sum() == C


def test_the_inputs_reach_the_clamps():
    """In the strong setting the scaler clips at +-1, theta + g_angular falls below eps (a target
    logit with zero derivative), and a target cosine lies below -1 + eps."""
    inputs = make_inputs(2, "/dev/null")
    name = "strong-full"
    ada = OfficialAdaFace(*MARGINS["strong"])
    x, y, w = inputs[f"{name}/x0.0"].astype(float), inputs[f"{name}/y0.0"], inputs[f"{name}/weight"].astype(float)
    xn = np.linalg.norm(x, axis=1)
    cos = (x / xn[:, None]) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    _, dl = ada.logits(cos, y, xn)
    ct = cos[np.arange(len(y)), y]
    assert ct[0] < -1 + EPS and dl[0, y[0]] == 0
    assert (dl[np.arange(1, 3), y[1:3]] == 0).all()
    scaler = np.clip((np.clip(xn, 0.001, 100) - ada.batch_mean) / (ada.batch_std + EPS) * ada.h, -1, 1)
    assert (scaler == 1).any() and (scaler == -1).any()


def test_target_logit_derivative_by_finite_differences():
    """d f_t / d cos of AdaFaceMargin, the statistics held fixed, against central differences
    away from the clamps; zero where they bind."""
    from mxnet_pfc import AdaFaceMargin

    margin = AdaFaceMargin(s=64.0, m=0.4, h=0.333, t_alpha=0.5)
    rng = np.random.default_rng(0)
    norms = rng.uniform(5.0, 50.0, size=64)
    cos = rng.uniform(-0.95, 0.95, size=64)
    start = margin.state()
    f, df = margin.target_logit(cos, norms)
    state = margin.state()
    assert state != start
    h = 1e-6
    margin.load_state(start)
    f_plus, _ = margin.target_logit(cos + h, norms)
    margin.load_state(start)
    f_minus, _ = margin.target_logit(cos - h, norms)
    assert margin.state() == state
    # Away from the theta clamp: theta + g_angular inside [eps, pi - eps] by a margin.
    scaler = np.clip((norms - state["batch_mean"]) / (state["batch_std"] + EPS) * 0.333, -1, 1)
    shifted = np.arccos(cos) - 0.4 * scaler
    away = (shifted > EPS + 1e-3) & (shifted < math.pi - EPS - 1e-3)
    assert away.sum() > 50
    np.testing.assert_allclose(df[away], ((f_plus - f_minus) / (2 * h))[away], rtol=1e-5)
    # A clamped target: cosine past 1 - eps, and theta + g_angular below eps.
    margin.load_state(start)
    _, df = margin.target_logit(np.array([0.9995, 0.99, 0.5]), np.array([20.0, 1000.0, 1.0]))
    assert df[0] == 0.0
    assert df[1] == 0.0 or np.arccos(0.99) - 0.4 * min(1, (100 - margin.batch_mean) /
                                                       (margin.batch_std + EPS) * 0.333) >= EPS


@pytest.mark.parametrize("field, kwargs", [
    ("s", dict(s=0.0)), ("s", dict(s=-1.0)), ("m", dict(m=-0.1)), ("h", dict(h=0.0)), ("h", dict(h=-1.0)),
    ("t_alpha", dict(t_alpha=0.0)), ("t_alpha", dict(t_alpha=1.5)), ("t_alpha", dict(t_alpha=float("nan"))),
    ("m", dict(m=float("inf")))])
def test_bad_parameters_are_refused_naming_the_field(field, kwargs):
    from mxnet_pfc import AdaFaceMargin

    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        AdaFaceMargin(**kwargs)


def test_state_round_trip_and_bad_state():
    from mxnet_pfc import AdaFaceMargin

    a = AdaFaceMargin()
    assert a.state() == {"batch_mean": 20.0, "batch_std": 100.0}
    a.target_logit(np.array([0.1, 0.2, 0.3]), np.array([10.0, 20.0, 30.0]))
    b = AdaFaceMargin()
    b.load_state(a.state())
    assert b.state() == a.state()
    with pytest.raises(ValueError, match="batch_std"):
        b.load_state({"batch_mean": 1.0})
    with pytest.raises(ValueError, match="batch_mean"):
        b.load_state({"batch_mean": float("nan"), "batch_std": 1.0})
    with pytest.raises(ValueError, match="at least 2 rows"):
        b.target_logit(np.array([0.1]), np.array([10.0]))


@pytest.mark.parametrize("what, message", [
    ("h", r"PartialFC settings differ across ranks: h: rank 0=0.333, rank 1=0.5"),
    ("kind", r"PartialFC settings differ across ranks: margin kind: rank 0=1, rank 1=0")])
def test_a_margin_that_differs_across_ranks_is_refused(what, message):
    proc = run_ranks(2, ["tests/adaface_worker.py", "differ", what], timeout=90)
    assert proc.returncode != 0
    assert "constructed" not in proc.stdout
    for rank in (0, 1):
        assert re.search(rf"\[{rank}\]<stderr>:.*{message}", proc.stdout), proc.stdout[-3000:]


def test_a_nan_loss_leaves_the_running_statistics_as_they_were(tmp_path):
    """The step that raises NonFiniteLossError moves neither the centers nor the statistics (a
    resume from the last checkpoint, or a retry, sees the state of the last good step)."""
    proc = run_ranks(2, ["tests/adaface_worker.py", "nan-center", tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for r in range(2):
        report = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert report["error"] and report["moved"] and report["unchanged"], report
