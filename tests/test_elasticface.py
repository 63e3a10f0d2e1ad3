"""ElasticFace (arc, cos, their "+" variants) under the sharded, sampled head on 1-4 CPU ranks vs the official formula.

The reference is written from fdbtrs/ElasticFace utils/losses.py (ElasticArcFace, ElasticCosFace, with
plus=True for the "+" variants) in dense float64 numpy, sharing no code with mxnet_pfc. The one thing it
takes from the package's documentation rather than the official code is how the margins are drawn: the
official code calls torch.normal at every forward; ours are keyed by (seed, call) so that every rank and
a resume draw the same ones (docs/losses.md), and the reference draws them by that rule.
"""
import numpy as np
import pytest

from margin_golden import assert_refused, check_scenario, register, scenarios

pytestmark = pytest.mark.xdist_group("margin_run")   # with the others using conftest.margin_run (conftest.py)

# loss name: its published (s, m, std) (ElasticFace config/config.py)
LOSSES = {"elasticface-arc": dict(s=64.0, m=0.5, std=0.05), "elasticface-arc+": dict(s=64.0, m=0.5, std=0.0175),
          "elasticface-cos": dict(s=64.0, m=0.35, std=0.05), "elasticface-cos+": dict(s=64.0, m=0.35, std=0.02)}
SCENARIOS = scenarios(LOSSES, accumulated="elasticface-arc+")
SEED = 11


def draws(seed, call, rows, m, std):
    """The documented keying of the per-sample margins: N(m, std) from PCG64 seeded by SeedSequence([seed, call])."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, call]))).normal(m, std, size=rows)


class OfficialElasticFace:
    """utils/losses.py's ElasticArcFace / ElasticCosFace forward, float64."""

    def __init__(self, s, m, std, angular, plus, seed):
        self.s, self.m, self.std, self.angular, self.plus, self.seed = s, m, std, angular, plus, seed
        self.calls = 0

    def state(self):
        return {"calls": self.calls}

    def penalty(self, norms):
        return None

    def logits(self, cos, labels, norms):
        n = len(labels)
        cos = np.clip(cos, -1, 1)                                   # cos_theta.clamp(-1, 1)
        margin = draws(self.seed, self.calls, n, self.m, self.std)  # torch.normal(mean=m, std=std, size=(n, 1))
        self.calls += 1
        if self.plus:
            distmat = cos[np.arange(n), labels]
            order = np.argsort(-distmat)                            # torch.sort(distmat, descending=True)
            margin = np.sort(margin)[order]                         # margin sorted, then margin[idicate_cosie]
        m_hot = np.zeros_like(cos)
        m_hot[np.arange(n), labels] = margin                        # m_hot.scatter_(1, label, margin)
        if self.angular:
            theta = np.arccos(cos)
            out, dout = np.cos(theta + m_hot), np.sin(theta + m_hot) / np.sin(theta)
        else:
            out, dout = cos - m_hot, np.ones_like(cos)
        return self.s * out, self.s * dout, None


def plain_batch(rng, w, world, params):
    n = 4 * world
    y = rng.integers(0, w.shape[0], size=n)
    x = rng.normal(size=(n, w.shape[1]))
    x[:2] = w[y[:2]] + 0.5 * rng.normal(size=(2, w.shape[1]))     # two rows near their centers: large cosines
    return x * rng.uniform(0.5, 30.0, size=(n, 1)), y


make_inputs = register("elasticface", {loss: (loss, dict(params, seed=SEED)) for loss, params in LOSSES.items()},
                       "elasticface-arc+", plain_batch, seed=200)


@pytest.mark.parametrize("name", SCENARIOS)
def test_elasticface_matches_the_official_formula(margin_run, name):
    """Loss, embeddings' gradient, centers and momentum after each of three steps, and the draw counter,
    against OfficialElasticFace on the global batch; identical on every rank."""
    inputs, ranks = margin_run
    loss = SCENARIOS[name][0]
    official = OfficialElasticFace(**LOSSES[loss], angular="-arc" in loss, plus=loss.endswith("+"), seed=SEED)
    check_scenario(official, inputs, ranks, f"elasticface.{name}")


def test_the_draws_are_normal_with_the_configured_spread_and_differ_per_call_and_seed():
    from mxnet_pfc.head.margin import make_margin

    margin = make_margin("elasticface-arc", seed=3)
    first = margin.draws(0, 20000)
    assert abs(first.mean() - 0.5) < 0.002 and abs(first.std() - 0.05) < 0.002
    assert not np.array_equal(first, margin.draws(1, 20000))
    assert not np.array_equal(first, make_margin("elasticface-arc", seed=4).draws(0, 20000))
    np.testing.assert_array_equal(first[:8], margin.draws(0, 8))       # row i's draw: the same in any batch size


def test_plus_assigns_the_sorted_margins_in_the_official_order():
    """The official '+' gives row i the sorted margin at position order[i] (order: the rows by target cosine,
    descending), the permutation applied as it is: checked on a hand-made case."""
    from mxnet_pfc.head.margin import ElasticFaceMargin

    margin = ElasticFaceMargin(s=1.0, m=0.0, std=1.0, angular=False, plus=True, seed=5)
    cos = np.array([0.1, 0.9, 0.5, -0.2])
    drawn = np.sort(margin.draws(0, 4))
    f, _ = margin.target_logit(cos)
    order = [1, 2, 0, 3]                    # argsort of -cos
    np.testing.assert_allclose(cos - f, drawn[order])


def test_target_logit_derivative_by_finite_differences():
    from mxnet_pfc.head.margin import make_margin

    rng = np.random.default_rng(1)
    cos = rng.uniform(-0.95, 0.95, size=200)
    for loss in LOSSES:
        margin = make_margin(loss, seed=2)
        f, df = margin.target_logit(cos)
        h = 1e-6
        margin.load_state({"calls": 0})
        f_plus, _ = margin.target_logit(cos + h)
        margin.load_state({"calls": 0})
        f_minus, _ = margin.target_logit(cos - h)
        if loss.endswith("+"):      # the order of the rows may not change under the step
            assert np.array_equal(np.argsort(-cos), np.argsort(-(cos + h)))
        np.testing.assert_allclose(df, (f_plus - f_minus) / (2 * h), rtol=1e-5, err_msg=loss)


@pytest.mark.parametrize("field, kwargs", [("s", dict(s=0.0)), ("std", dict(std=-0.01)), ("m", dict(m=float("nan"))),
                                           ("seed", dict(seed=-1)), ("seed", dict(seed=1.5))])
def test_bad_parameters_are_refused_naming_the_field(field, kwargs):
    assert_refused("elasticface-cos", field, kwargs)


def test_bad_state_is_refused():
    from mxnet_pfc.head.margin import make_margin

    margin = make_margin("elasticface-arc+")
    for state in ({}, {"calls": -1}, {"calls": 1.5}, {"calls": True}, {"calls": 1, "other": 2}):
        with pytest.raises(ValueError, match="calls"):
            margin.load_state(state)
