"""AdaFace under the sharded, sampled head on 1-4 CPU ranks against the official formula.

The reference below is written from mk-minchul/AdaFace head.py (commit c60eaa78, lines 77-120)
with dense float64 numpy and an explicit one-hot (the harness: margin_golden.py), sharing no
code with mxnet_pfc: statistics over the global batch (every rank holds every row's norm), the
EMA updated before use, the derivative of the official autograd (zero where a clamp binds).
"""
import json
import math
import re

import numpy as np
import pytest

from launch import run_ranks
from margin_golden import assert_refused, check_scenario, register, scenarios

pytestmark = pytest.mark.xdist_group("margin_run")   # with the others using conftest.margin_run (conftest.py)

EPS = 1e-3
# (s, m, h, t_alpha): the published defaults, and a strong setting where the scaler clips at
# +-1 and theta + g_angular leaves [eps, pi - eps] (the clamps bind).
MARGINS = {"default": (64.0, 0.4, 0.333, 0.01), "strong": (32.0, 0.4, 3.0, 0.5)}
SCENARIOS = scenarios(MARGINS, accumulated="strong")


class OfficialAdaFace:
    """head.py's running statistics and logits, float64."""

    def __init__(self, s, m, h, t_alpha):
        self.s, self.m, self.h, self.t_alpha = s, m, h, t_alpha
        self.batch_mean, self.batch_std = 20.0, 100.0

    def state(self):
        return {"batch_mean": self.batch_mean, "batch_std": self.batch_std}

    def penalty(self, norms):
        return None

    def logits(self, cos, labels, norms):
        """(logits (N, C), d logits / d cos (N, C), None: the norm is detached); updates the statistics first."""
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
        return self.s * out, self.s * dout, None


def clamp_reaching_batch(rng, w, world, params):
    """A global batch whose rows reach AdaFace's clamps (test_the_inputs_reach_the_clamps)."""
    n = 4 * world
    y = rng.integers(0, w.shape[0], size=n)
    x = rng.normal(size=(n, w.shape[1]))
    x[:1] = -w[y[:1]] + 0.001 * rng.normal(size=(1, w.shape[1]))   # cosine below -1 + eps: clamped
    x[1:3] = w[y[1:3]] + 0.05 * rng.normal(size=(2, w.shape[1]))   # small theta: theta + g_angular < eps
    # Norms from 1 to 60 (the small-theta rows large: a positive scaler; row 3 small: a negative one).
    norms = rng.uniform(1.0, 60.0, size=n)
    norms[1:3], norms[3] = 60.0, 1.0
    return x * (norms / np.linalg.norm(x, axis=1))[:, None], y


make_inputs = register("adaface", {name: ("adaface", dict(zip(("s", "m", "h", "t_alpha"), values)))
                                    for name, values in MARGINS.items()}, "strong", clamp_reaching_batch, seed=100)


@pytest.mark.parametrize("name", SCENARIOS)
def test_adaface_matches_the_official_formula(margin_run, name):
    """Loss, embeddings' gradient, centers and momentum, and the running statistics after each of
    three steps, against OfficialAdaFace on the global batch; identical on every rank."""
    inputs, ranks = margin_run
    check_scenario(OfficialAdaFace(*MARGINS[SCENARIOS[name][0]]), inputs, ranks, f"adaface.{name}")


def test_the_inputs_reach_the_clamps():
    """In the strong setting the scaler clips at +-1, theta + g_angular falls below eps (a target
    logit with zero derivative), and a target cosine lies below -1 + eps."""
    inputs = make_inputs(2)
    name = "strong-full"
    ada = OfficialAdaFace(*MARGINS["strong"])
    x, y, w = inputs[f"{name}/x0.0"].astype(float), inputs[f"{name}/y0.0"], inputs[f"{name}/weight"].astype(float)
    xn = np.linalg.norm(x, axis=1)
    cos = (x / xn[:, None]) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    _, dl, _ = ada.logits(cos, y, xn)
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

    assert_refused("adaface", field, kwargs)
    with pytest.raises(ValueError, match=rf"\b{field}\b"):        # the class itself, as the package exports it
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
    proc = run_ranks(2, ["tests/margin_worker.py", "differ", what], timeout=90)
    assert proc.returncode != 0
    assert "constructed" not in proc.stdout
    for rank in (0, 1):
        assert re.search(rf"\[{rank}\]<stderr>:.*{message}", proc.stdout), proc.stdout[-3000:]


def test_a_nan_loss_leaves_the_running_statistics_as_they_were(tmp_path):
    """The step that raises NonFiniteLossError moves neither the centers nor the statistics (a
    resume from the last checkpoint, or a retry, sees the state of the last good step)."""
    proc = run_ranks(2, ["tests/margin_worker.py", "nan-center", tmp_path], timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for r in range(2):
        report = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert report["error"] and report["moved"] and report["unchanged"], report
