"""CurricularFace under the sharded, sampled head on 1-4 CPU ranks against the official formula.

The reference is written from HuangYG123/CurricularFace head/metrics.py (class CurricularFace, commit
68c8727, lines 86-105) in dense float64 numpy, sharing no code with mxnet_pfc: t, the running mean of
the target cosines, over the global batch (every rank has them all after the extra collective), updated
before use and detached; the hard negatives (cos above cos(theta_y + m)) modulated as cos * (t + cos)
with gradient t + 2 cos; the target overwritten by cos(theta_y + m) or, past pi - m, cos - m sin(m).
"""
import math

import numpy as np
import pytest

from margin_golden import assert_refused, check_scenario, register, scenarios

pytestmark = pytest.mark.xdist_group("margin_run")   # with the others using conftest.margin_run (conftest.py)

# (s, m, t_alpha): the published values, and TFace's momentum with a larger margin (more rows past pi - m)
MARGINS = {"published": dict(s=64.0, m=0.5, t_alpha=0.01), "tface-wide": dict(s=32.0, m=0.9, t_alpha=0.1)}
SCENARIOS = scenarios(MARGINS, accumulated="published")


class OfficialCurricularFace:
    """metrics.py's CurricularFace.forward, float64, with d logits / d cos."""

    def __init__(self, s, m, t_alpha):
        self.s, self.m, self.t_alpha = s, m, t_alpha
        self.t = 0.0                                                    # register_buffer('t', zeros(1))

    def state(self):
        return {"t": self.t}

    def penalty(self, norms):
        return None

    def logits(self, cos, labels, norms):
        rows = np.arange(len(labels))
        cos = np.clip(cos, -1, 1)                                       # cos_theta.clamp(-1, 1)
        target = cos[rows, labels][:, None]
        sin = np.sqrt(1.0 - target ** 2)
        cos_theta_m = target * math.cos(self.m) - sin * math.sin(self.m)
        mask = cos > cos_theta_m
        use = target > math.cos(math.pi - self.m)
        final = np.where(use, cos_theta_m, target - math.sin(math.pi - self.m) * self.m)
        dfinal = np.where(use, math.cos(self.m) + target / sin * math.sin(self.m), 1.0)
        self.t = target.mean() * self.t_alpha + (1 - self.t_alpha) * self.t      # before use, no grad
        out = np.where(mask, cos * (self.t + cos), cos)
        dout = np.where(mask, self.t + 2 * cos, 1.0)
        out[rows, labels], dout[rows, labels] = final[:, 0], dfinal[:, 0]         # scatter_ of the target
        return self.s * out, self.s * dout, None


def varied_batch(rng, w, world, params):
    """Rows near their centers (few hard negatives), random rows (many), one row past pi - m (the fallback)."""
    n = 4 * world
    y = rng.integers(0, w.shape[0], size=n)
    x = rng.normal(size=(n, w.shape[1]))
    x[: n // 2] += 1.5 * w[y[: n // 2]]
    x[n - 1] = -w[y[n - 1]] + 0.3 * rng.normal(size=w.shape[1])
    return x * rng.uniform(0.5, 20.0, size=(n, 1)), y


make_inputs = register("curricularface", {name: ("curricularface", params) for name, params in MARGINS.items()},
                       "published", varied_batch, seed=400)


@pytest.mark.parametrize("name", SCENARIOS)
def test_curricularface_matches_the_official_formula(margin_run, name):
    """Loss, embeddings' gradient, centers and momentum, and t after each of three steps, against
    OfficialCurricularFace on the global batch; identical on every rank."""
    inputs, ranks = margin_run
    check_scenario(OfficialCurricularFace(**MARGINS[SCENARIOS[name][0]]), inputs, ranks, f"curricularface.{name}")


def test_the_inputs_have_hard_and_easy_negatives_and_the_fallback():
    inputs = make_inputs(2)
    name = "tface-wide-full"
    x, y, w = inputs[f"{name}/x0.0"].astype(float), inputs[f"{name}/y0.0"], inputs[f"{name}/weight"].astype(float)
    cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    target = cos[np.arange(len(y)), y]
    cos_theta_m = np.cos(np.arccos(target) + 0.9)
    hard = cos > cos_theta_m[:, None]
    hard[np.arange(len(y)), y] = False
    assert hard.sum() > 50 and (~hard).sum() > 50
    assert (target < math.cos(math.pi - 0.9)).any()


def test_modulation_derivative_by_finite_differences():
    """The loss of one row as a function of one hard negative's cosine, through the package's MXNet-op path:
    d loss / d cos from softmax_grad against central differences (t held fixed)."""
    import mxnet as mx

    from mxnet_pfc.head.kernels.ops import HardNegatives, MXNetOps, head_ops

    s, t = 16.0, 0.3
    rng = np.random.default_rng(2)
    cos = rng.uniform(-0.5, 0.9, size=(3, 7))
    threshold = np.array([0.2, -0.1, 0.5])
    target = np.array([0, 3, 6], dtype=np.int32)

    def loss_of(c):
        value = np.where(c > threshold[:, None], c * (t + c), c) * s
        value[np.arange(3), target] = s * c[np.arange(3), target]
        top = value.max(axis=1, keepdims=True)
        lse = top[:, 0] + np.log(np.exp(value - top).sum(axis=1))
        return np.mean(lse - value[np.arange(3), target]), lse

    _, lse = loss_of(cos)
    for ops in (MXNetOps(), head_ops(mx.cpu())):
        hard = HardNegatives(t=t, threshold=mx.nd.array(s * threshold), s=s)
        grad, _ = ops.softmax_grad(mx.nd.array(s * cos), mx.nd.array(lse), mx.nd.ones(7), mx.nd.array(target,
                                   dtype="int32"), mx.nd.ones(3), mx.nd.zeros(3), s, 3, None, hard)
        grad = grad.asnumpy()
        for i, j in [(0, 1), (0, 4), (1, 0), (2, 2), (2, 5)]:
            if abs(cos[i, j] - threshold[i]) < 1e-3:
                continue
            h = 1e-6
            up, down = cos.copy(), cos.copy()
            up[i, j] += h
            down[i, j] -= h
            numeric = (loss_of(up)[0] - loss_of(down)[0]) / (2 * h)
            assert abs(grad[i, j] - numeric) <= 1e-3 * max(1e-3, abs(numeric)), (ops.name, i, j, grad[i, j], numeric)


@pytest.mark.parametrize("field, kwargs", [("s", dict(s=0.0)), ("m", dict(m=-0.1)), ("m", dict(m=4.0)),
                                           ("t_alpha", dict(t_alpha=0.0)), ("t_alpha", dict(t_alpha=float("nan")))])
def test_bad_parameters_are_refused_naming_the_field(field, kwargs):
    assert_refused("curricularface", field, kwargs)


def test_state_round_trip_and_bad_state():
    from mxnet_pfc.head.margin import make_margin

    margin = make_margin("curricularface")
    margin.hard_negatives(np.array([0.2, 0.4]))
    other = make_margin("curricularface")
    other.load_state(margin.state())
    assert other.state() == margin.state() == {"t": pytest.approx(0.003)}
    for state in ({}, {"t": float("inf")}, {"t": "0.1"}, {"t": 0.1, "x": 1}):
        with pytest.raises(ValueError, match="'t'"):
            other.load_state(state)
