"""MagFace under the sharded, sampled head on 1-4 CPU ranks against the official formula.

The reference is written from IrvingMeng/MagFace models/magface.py (MagLinear, MagLoss; commit 99bae61)
and run/trainer.py's total loss in dense float64 numpy, sharing no code with mxnet_pfc: the norm
a = clamp(|x|, l_a, u_a) is not detached, so the embedding's gradient has a radial part, from the
margin m(a) and from lambda_g * g(a); the derivative of the clamp is 1 on [l_a, u_a], 0 outside.
"""
import math

import numpy as np
import pytest

from margin_golden import assert_refused, check_scenario, register, scenarios

pytestmark = pytest.mark.xdist_group("margin_run")   # with the others using conftest.margin_run (conftest.py)

PUBLISHED = dict(s=64.0, l_a=10.0, u_a=110.0, l_m=0.45, u_m=0.8, lambda_g=35.0)
MARGINS = {"published": dict(PUBLISHED), "fallback": dict(PUBLISHED, easy_margin=False, s=32.0, l_m=1.2, u_m=2.5)}
SCENARIOS = scenarios(MARGINS, accumulated="published")


class OfficialMagFace:
    """MagLinear.forward + MagLoss (+ lambda_g * loss_g), float64, with their derivatives."""

    def __init__(self, s, l_a, u_a, l_m, u_m, lambda_g, easy_margin=True):
        self.s, self.l_a, self.u_a, self.l_m, self.u_m = s, l_a, u_a, l_m, u_m
        self.lambda_g, self.easy_margin = lambda_g, easy_margin

    def state(self):
        return {}

    def clamped(self, norms):
        return np.clip(norms, self.l_a, self.u_a), ((norms >= self.l_a) & (norms <= self.u_a)).astype(float)

    def logits(self, cos, labels, norms):
        a, da = self.clamped(norms)                                             # x_norm.clamp(l_a, u_a)
        k = (self.u_m - self.l_m) / (self.u_a - self.l_a)
        m = (k * (a - self.l_a) + self.l_m)[:, None]                            # ada_margin = m(x_norm)
        cos = np.clip(cos, -1, 1)
        sin = np.sqrt(1.0 - cos ** 2)
        cos_m = cos * np.cos(m) - sin * np.sin(m)                               # cos(theta + m)
        d_cos_m_dc = np.cos(m) + cos / sin * np.sin(m)
        d_cos_m_dm = -cos * np.sin(m) - sin * np.cos(m)
        if self.easy_margin:
            use = cos > 0
            out = np.where(use, cos_m, cos)
            dout_dc, dout_dm = np.where(use, d_cos_m_dc, 1), np.where(use, d_cos_m_dm, 0)
        else:
            use = cos > np.cos(math.pi - m)
            mm = np.sin(math.pi - m) * m
            dmm_dm = -np.cos(math.pi - m) * m + np.sin(math.pi - m)
            out = np.where(use, cos_m, cos - mm)
            dout_dc, dout_dm = np.where(use, d_cos_m_dc, 1), np.where(use, d_cos_m_dm, -dmm_dm)
        onehot = np.zeros_like(cos)
        onehot[np.arange(len(labels)), labels] = 1.0
        logits = self.s * (onehot * out + (1 - onehot) * cos)
        dlogits_dcos = self.s * (onehot * dout_dc + (1 - onehot))
        dlogits_dnorm = self.s * onehot * dout_dm * k * da[:, None]
        return logits, dlogits_dcos, dlogits_dnorm

    def penalty(self, norms):
        a, da = self.clamped(norms)
        return self.lambda_g * (a / self.u_a ** 2 + 1 / a), self.lambda_g * (1 / self.u_a ** 2 - 1 / a ** 2) * da


def norm_spanning_batch(rng, w, world, params):
    """Norms below l_a, inside, above u_a; target cosines both sides of 0 (and of the fallback's threshold)."""
    n = 4 * world
    y = rng.integers(0, w.shape[0], size=n)
    x = rng.normal(size=(n, w.shape[1]))
    x[: n // 2] += 2.0 * w[y[: n // 2]]                    # half the rows near their centers: cos > 0
    x[n - 1] = -w[y[n - 1]] + 0.01 * rng.normal(size=w.shape[1])      # cos near -1: past pi - m
    norms = rng.uniform(12.0, 100.0, size=n)
    norms[0], norms[n - 2] = 5.0, 150.0                    # clamped: no gradient through the norm
    return x * (norms / np.linalg.norm(x, axis=1))[:, None], y


make_inputs = register("magface", {name: ("magface", params) for name, params in MARGINS.items()}, "published",
                       norm_spanning_batch, seed=300)


@pytest.mark.parametrize("name", SCENARIOS)
def test_magface_matches_the_official_formula(margin_run, name):
    """Loss (cross-entropy + lambda_g * mean g), embeddings' gradient (with its radial part), centers and
    momentum after each of three steps, against OfficialMagFace on the global batch; identical on every rank."""
    inputs, ranks = margin_run
    check_scenario(OfficialMagFace(**MARGINS[SCENARIOS[name][0]]), inputs, ranks, f"magface.{name}")


def test_the_radial_gradient_is_there_and_the_clamped_rows_have_none():
    """The reference's embedding gradient has a radial part (dL/d|x| != 0) inside [l_a, u_a] and none outside,
    and removing it would change the gradient (the test above could not pass without it)."""
    from margin_golden import reference_step

    inputs = make_inputs(2)
    name = "published-full"
    x, y, w = inputs[f"{name}/x0.0"].astype(float), inputs[f"{name}/y0.0"], inputs[f"{name}/weight"]
    _, dx, _ = reference_step(OfficialMagFace(**PUBLISHED), x, y, w)
    radial = np.sum(dx * x / np.linalg.norm(x, axis=1, keepdims=True), axis=1)
    norms = np.linalg.norm(x, axis=1)
    assert np.all(np.abs(radial[(norms > 10) & (norms < 110)]) > 1e-6)
    np.testing.assert_allclose(radial[(norms < 10) | (norms > 110)], 0, atol=1e-12)


@pytest.mark.parametrize("easy_margin", [True, False])
def test_norm_derivatives_by_finite_differences(easy_margin):
    """d f_t / d |x| and d (lambda_g g) / d |x| of MagFaceMargin against central differences, and d f_t / d cos."""
    from mxnet_pfc.head.margin import MagFaceMargin

    margin = MagFaceMargin(easy_margin=easy_margin, l_m=1.2 if not easy_margin else 0.45, u_m=2.5 if not easy_margin
                           else 0.8)
    rng = np.random.default_rng(4)
    cos = rng.uniform(-0.97, 0.97, size=300)
    norms = rng.uniform(10.5, 109.5, size=300)
    h = 1e-5
    f, df_dc = margin.target_logit(cos, norms)
    penalty, dpenalty, df_dnorm = margin.norm_terms(cos, norms)
    f_up, _ = margin.target_logit(cos, norms + h)
    f_down, _ = margin.target_logit(cos, norms - h)
    p_up, _, _ = margin.norm_terms(cos, norms + h)
    p_down, _, _ = margin.norm_terms(cos, norms - h)
    # away from the branch switch, where f_t is not differentiable
    switch = 0.0 if easy_margin else np.cos(math.pi - (margin.slope * (norms - 10) + margin.l_m))
    away = np.abs(cos - switch) > 1e-3
    np.testing.assert_allclose(df_dnorm[away], ((f_up - f_down) / (2 * h))[away], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dpenalty, (p_up - p_down) / (2 * h), rtol=1e-5)
    f_right, _ = margin.target_logit(cos + 1e-7, norms)
    f_left, _ = margin.target_logit(cos - 1e-7, norms)
    np.testing.assert_allclose(df_dc[away], ((f_right - f_left) / 2e-7)[away], rtol=1e-4)
    # outside [l_a, u_a] nothing flows into the norm
    _, dpenalty, df_dnorm = margin.norm_terms(np.array([0.5, 0.5]), np.array([5.0, 200.0]))
    assert (dpenalty == 0).all() and (df_dnorm == 0).all()


@pytest.mark.parametrize("field, kwargs", [("s", dict(s=-1.0)), ("l_a", dict(l_a=0.0)), ("u_a", dict(u_a=10.0)),
                                           ("u_m", dict(u_m=0.3)), ("lambda_g", dict(lambda_g=-1.0)),
                                           ("l_m", dict(l_m=float("inf")))])
def test_bad_parameters_are_refused_naming_the_field(field, kwargs):
    assert_refused("magface", field, kwargs)


def test_the_published_lambda_g_is_above_the_papers_bound():
    from mxnet_pfc.head.margin import make_margin

    margin = make_margin("magface")
    assert math.isclose(margin.min_lambda_g(), 22.5867, rel_tol=1e-4) and margin.lambda_g == 35.0
