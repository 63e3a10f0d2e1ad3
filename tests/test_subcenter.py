"""Sub-center ArcFace against the official formula on 1-4 CPU ranks, and its K rows per class.

Under the sharded, sampled head; the K rows go through checkpoints, re-sharding and the trainer's checks.

The reference is written from insightface's recognition/subcenter_arcface/train_parall.py (get_symbol_arcface,
lines 120-178, commit 7fadd42) in dense float64 numpy, sharing no code with mxnet_pfc: K rows per class,
class-major; a class's cosine the largest of its K; then ArcFace's margin on the target (no fallback past
pi - m); the gradient of a class's cosine to the sub-center that gave it.
"""
import numpy as np
import pytest

from margin_golden import assert_refused, check_scenario, register, scenarios

pytestmark = pytest.mark.xdist_group("margin_run")   # with the others using conftest.margin_run (conftest.py)

MARGINS = {"published": dict(s=64.0, m1=1.0, m2=0.5, m3=0.0, subcenters=3),
           "two-combined": dict(s=32.0, m1=1.0, m2=0.3, m3=0.1, subcenters=2)}
SCENARIOS = scenarios(MARGINS, accumulated="published")


class OfficialSubCenterArcFace:
    """train_parall.py's fc7 with loss_K sub-centers: reshape (N, C, K), max over K, then the margin."""

    def __init__(self, s, m1, m2, m3, subcenters):
        self.s, self.m1, self.m2, self.m3, self.K = s, m1, m2, m3, subcenters

    def state(self):
        return {}

    def penalty(self, norms):
        return None

    def logits(self, cos, labels, norms):
        n = len(labels)
        per_class = cos.reshape(n, -1, self.K)                          # mx.symbol.reshape(fc7, (-1, C, K))
        pooled = per_class.max(axis=2)                                  # mx.symbol.max(sim_s3, axis=2)
        winner = (per_class == pooled[:, :, None]).astype(float)        # max's gradient: the largest sub-center
        rows = np.arange(n)
        target = pooled[rows, labels]
        theta = np.arccos(target)
        out, dout = pooled.copy(), np.ones_like(pooled)
        out[rows, labels] = np.cos(self.m1 * theta + self.m2) - self.m3
        dout[rows, labels] = self.m1 * np.sin(self.m1 * theta + self.m2) / np.sin(theta)
        dcos = (winner * dout[:, :, None]).reshape(n, -1)
        return self.s * out, self.s * dcos, None


def near_a_subcenter(rng, w, world, params):
    """Half the rows near one of their class's sub-centers (each may win), the rest random."""
    K = params["subcenters"]
    n = 4 * world
    y = rng.integers(0, w.shape[0] // K, size=n)
    x = rng.normal(size=(n, w.shape[1]))
    x[: n // 2] += 1.5 * w[y[: n // 2] * K + rng.integers(0, K, size=n // 2)]
    return x * rng.uniform(0.5, 20.0, size=(n, 1)), y


make_inputs = register("subcenter", {name: ("subcenter-arcface", params) for name, params in MARGINS.items()},
                       "published", near_a_subcenter, seed=500)


@pytest.mark.parametrize("name", SCENARIOS)
def test_subcenter_arcface_matches_the_official_formula(margin_run, name):
    """Loss, embeddings' gradient, every sub-center and its momentum after each of three steps (only the
    sampled classes' rows move), against the official symbol's math on the global batch."""
    inputs, ranks = margin_run
    check_scenario(OfficialSubCenterArcFace(**MARGINS[SCENARIOS[name][0]]), inputs, ranks, f"subcenter.{name}")


def test_the_inputs_make_every_sub_center_win_somewhere():
    inputs = make_inputs(2)
    name = "published-full"
    x, w = inputs[f"{name}/x0.0"].astype(float), inputs[f"{name}/weight"].astype(float)
    cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
    winners = cos.reshape(len(x), -1, 3).argmax(axis=2)
    assert set(np.unique(winners)) == {0, 1, 2}


@pytest.mark.parametrize("field, kwargs", [("subcenters", dict(subcenters=0)), ("subcenters", dict(subcenters=2.5)),
                                           ("subcenters", dict(subcenters=True)), ("s", dict(s=-1.0))])
def test_bad_parameters_are_refused_naming_the_field(field, kwargs):
    assert_refused("subcenter-arcface", field, kwargs)


def test_the_trainer_field_is_subcenter_k():
    from mxnet_pfc.runtime.errors import ConfigError
    from mxnet_pfc.training import config

    cfg = config.parse_args(["--loss", "subcenter-arcface", "--subcenter_k", "4"])
    assert config.margin_of(cfg).subcenters == 4 and cfg.margin_m2 == 0.5
    with pytest.raises(ConfigError, match="subcenter_k = 0"):
        config.parse_args(["--loss", "subcenter-arcface", "--subcenter_k", "0"])
    with pytest.raises(ConfigError, match="subcenter_k: not a parameter of --loss arcface"):
        config.parse_args(["--loss", "arcface", "--subcenter_k", "2"])


def test_a_margin_run_checkpoints_k_rows_per_class_reshards_them_and_refuses_another_k(reference, tmp_path):
    """Through config.sh: the checkpoint holds K rows per class (state.json says K); loaded onto 3 ranks every
    row arrives where its class went; a resume with another K, or under a one-center loss, is refused on every
    rank, naming both counts."""
    import json

    from launch import REPO, ckpt, config_sh, run_command, run_ranks, tiny_synthetic_run

    data, _ = reference
    output = tmp_path / "run"
    args = ("--loss", "subcenter-arcface", "--max_update", 8, "--save_interval", 8)
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *args)), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    saved = ckpt(output / "checkpoints", 8)
    state = json.loads((saved / "state.json").read_text())
    assert state["subcenters"] == 3 and state["shards"] == [[0, 20], [20, 20]]
    for r in range(2):
        assert np.load(saved / f"centers-rank{r:05d}.npy").shape == (60, 128)

    proc = run_ranks(3, [REPO / "tests" / "reshard_worker.py", saved, tmp_path], timeout=180)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for kind in ("centers", "momentum"):
        before = np.concatenate([np.load(saved / f"{kind}-rank{r:05d}.npy") for r in range(2)])
        after = np.concatenate([np.load(tmp_path / f"{kind}-{r}.npy") for r in range(3)])
        assert [len(np.load(tmp_path / f"{kind}-{r}.npy")) for r in range(3)] == [42, 39, 39]   # 14, 13, 13 classes
        assert np.array_equal(after, before), kind

    for other in (("--subcenter_k", 2), ("--loss", "arcface")):
        extra = ("--loss", "subcenter-arcface", *other) if other[0] == "--subcenter_k" else other
        proc = run_command(config_sh(*tiny_synthetic_run(data, output, "--max_update", 10, *extra, "--resume", "8")),
                           timeout=300)
        assert proc.returncode != 0
        for rank in (0, 1):
            log = (output / "logs" / f"rank{rank}.log").read_text()
            wanted = 2 if other[0] == "--subcenter_k" else 1
            assert f"its memory bank has 3 center(s) per class, this run {wanted}" in log, (other, rank)


def test_the_reference_gradient_by_finite_differences():
    """The reference's embedding and sub-center gradients (the max's gradient to the winning row) against
    central differences of its float64 loss, away from ties between sub-centers."""
    from margin_golden import reference_step

    inputs = make_inputs(1)
    name = "two-combined-full"
    x, y, w = inputs[f"{name}/x0.0"].astype(float), inputs[f"{name}/y0.0"], inputs[f"{name}/weight"].astype(float)
    official = OfficialSubCenterArcFace(**MARGINS["two-combined"])
    _, dx, dw = reference_step(official, x, y, w)
    h = 1e-6
    for i, d in [(0, 0), (1, 5), (2, 17), (3, 31)]:
        up, down = x.copy(), x.copy()
        up[i, d] += h
        down[i, d] -= h
        numeric = (reference_step(official, up, y, w)[0] - reference_step(official, down, y, w)[0]) / (2 * h)
        assert abs(numeric - dx[i, d]) <= 1e-6 + 1e-5 * abs(numeric), (i, d)
    for r, d in [(2 * y[1] + 1, 3), (2 * y[0], 7), (11, 0)]:
        up, down = w.copy(), w.copy()
        up[r, d] += h
        down[r, d] -= h
        numeric = (reference_step(official, x, y, up)[0] - reference_step(official, x, y, down)[0]) / (2 * h)
        assert abs(numeric - dw[r, d]) <= 1e-6 + 1e-5 * abs(numeric), (r, d)
