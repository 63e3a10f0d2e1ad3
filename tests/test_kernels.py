"""The fused kernels build, load, fall back cleanly, and agree with the MXNet-op path."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from launch import REPO, rank_env
from mxnet_pfc.head import kernels

nd = mx.nd


def test_library_path_depends_on_source_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("MXNET_PFC_CACHE", str(tmp_path))
    path = kernels.library_path()
    assert path.parent == tmp_path and path.name.startswith("libpfc_kernels-")
    monkeypatch.setattr(kernels, "_cpu_signature", lambda: "another cpu")
    assert kernels.library_path() != path


def test_build_is_atomic_and_cached(tmp_path):
    path = kernels.build(tmp_path / "lib.so")
    assert path.exists() and not list(tmp_path.glob("tmp*.so"))
    mtime = path.stat().st_mtime
    assert kernels.build(path) == path and path.stat().st_mtime == mtime


def test_missing_compiler_falls_back_to_mxnet_ops(tmp_path):
    """No g++: a warning and the MXNet-op path, never a crash."""
    code = ("import logging; logging.basicConfig(); import mxnet as mx; "
            "from mxnet_pfc.head.kernels import head_ops; print('OPS', head_ops(mx.cpu()).name)")
    env = {**rank_env(), "MXNET_PFC_CACHE": str(tmp_path), "CXX": "no-such-compiler"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "OPS mxnet" in proc.stdout, proc.stderr[-2000:]
    assert "fused Partial FC kernels unavailable (no C++ compiler (g++) found)" in proc.stderr


def test_disabled_by_environment():
    code = "import mxnet as mx; from mxnet_pfc.head.kernels import head_ops; print('OPS', head_ops(mx.cpu()).name)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**rank_env(), "MXNET_PFC_KERNELS": "0"},
                          capture_output=True, text=True, timeout=120)
    assert "OPS mxnet" in proc.stdout, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def both():
    assert kernels.load_fused(), "the fused kernels should build on this machine"
    return kernels.FusedOps(), kernels.MXNetOps()


@pytest.mark.parametrize("margin", ["arcface", "cosface", "combined"])
@pytest.mark.parametrize("threshold", [None, 2.0])     # inter-class filtering off / on (scaled units)
def test_each_kernel_matches_its_mxnet_twin(both, threshold, margin):
    """Same inputs through both kernel sets, including the margin of the target logit (one
    formula in margin.py and pfc_kernels.cc) on both of its branches."""
    from mxnet_pfc import CombinedMarginLoss

    margin = CombinedMarginLoss.from_name(margin, s=30.0)
    fused, plain = both
    rng = np.random.default_rng(0)
    N, S, D, R = 16, 700, 24, 2000          # S > one column block of the gradient kernel
    weight = rng.normal(size=(R, D)).astype(np.float32)
    index = np.sort(rng.choice(R, S, replace=False)).astype(np.int32)
    target = rng.integers(0, S, N).astype(np.int32)
    mask = (rng.random(N) < 0.6).astype(np.float32)
    raw = rng.uniform(-1, 1, size=(N, S))
    # target cosines across (-1, 1): ArcFace's fallback branch (m1 * theta + m2 > pi) included
    raw[np.arange(N), target] = np.linspace(-0.99, 0.99, N) * np.linalg.norm(weight[index[target]], axis=1)
    raw = raw.astype(np.float32)
    target_grad = rng.normal(size=N).astype(np.float32)
    xh = rng.normal(size=(N, D)).astype(np.float32)
    results = []
    for ops in (fused, plain):
        w, idx = nd.array(weight), nd.array(index, dtype="int32")
        cosw, inv = ops.logits(nd.array(xh), w, idx, out=nd.zeros((N, S)))
        logits, lse, f_t, df_t = ops.scale_lse(nd.array(raw), 30.0 * inv, nd.array(target, dtype="int32"),
                                               nd.array(mask), margin, threshold)
        grad, b = ops.softmax_grad(logits.copy(), lse, inv, nd.array(target, dtype="int32"), nd.array(mask),
                                   nd.array(target_grad), 30.0, N, threshold)
        mom = nd.full((R, D), 0.01)
        grad_xh = ops.center_step(grad, nd.array(xh), b * inv, idx, w, mom, 0.1, 0.9, 5e-4)
        results.append([a.asnumpy() for a in (cosw, inv, logits, lse, grad, b, grad_xh, w, mom, f_t, df_t)])
    names = ["logits (cos |w|)", "inv_norm", "scaled logits", "lse", "grad", "b", "grad_xh", "weight", "mom",
             "f_t", "df_t"]
    for name, a, b in zip(names, *results):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6 * max(1.0, np.abs(b).max()), err_msg=name)
    # the products and the SGD against float64
    w64, x64 = weight[index].astype(np.float64), xh.astype(np.float64)
    np.testing.assert_allclose(results[0][0], x64 @ w64.T, rtol=1e-5, atol=1e-5)
    g64, coef = results[0][4].astype(np.float64), (results[0][5] * results[0][1]).astype(np.float64)
    np.testing.assert_allclose(results[0][6], g64 @ w64, rtol=1e-5, atol=1e-6)
    step = 0.9 * 0.01 - 0.1 * (g64.T @ x64 - coef[:, None] * w64 + 5e-4 * w64)
    np.testing.assert_allclose(results[0][8][index], step, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(results[0][7][index], w64 + step, rtol=1e-5, atol=1e-7)
    untouched = np.setdiff1d(np.arange(R), index)
    assert np.array_equal(results[0][7][untouched], weight[untouched]), "rows outside the index changed"
    assert (results[0][8][untouched] == np.float32(0.01)).all(), "momentum outside the index changed"
    if threshold is not None:       # filtered: above the threshold and not a target; no gradient
        logits, grad = results[0][2], results[0][4]
        filtered = logits > threshold
        filtered[np.arange(N)[mask > 0], target[mask > 0]] = False
        assert 0.1 < filtered.mean() < 0.9
        assert (grad[filtered] == 0).all() and (results[1][4][filtered] == 0).all()
        # and they enter the log-sum-exp as logit 0, the target as f_t: one row by hand, in float64
        row = next(i for i in range(N) if mask[i] > 0)
        others = np.delete(np.where(filtered[row], 0.0, logits[row].astype(np.float64)), target[row])
        expected = np.log(np.exp(others).sum() + np.exp(np.float64(results[0][9][row])))
        assert results[0][3][row] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("kind", ["all", "runs", "scattered", "one"])
def test_blocked_products_match_float64(both, kind):
    """pfc_logits and pfc_center_step read blocks of 128 centers either in place (consecutive
    indices: every center, or runs of them) or gathered; both ways against float64."""
    fused, _ = both
    rng = np.random.default_rng(1)
    N, D, R = 12, 40, 700
    index = {"all": np.arange(R),
             "runs": np.r_[np.arange(0, 128), np.arange(200, 300), np.arange(301, 501, 2), np.arange(520, 660)],
             "scattered": np.sort(rng.choice(R, 333, replace=False)),
             "one": np.array([R - 1])}[kind].astype(np.int32)
    S = index.shape[0]
    weight, mom = rng.normal(size=(R, D)), rng.normal(size=(R, D)) * 0.01
    xh, grad, coef = rng.normal(size=(N, D)), rng.normal(size=(N, S)) * 0.01, rng.normal(size=S) * 0.01
    w, m, idx = nd.array(weight), nd.array(mom), nd.array(index, dtype="int32")
    cosw, inv = fused.logits(nd.array(xh), w, idx, out=nd.zeros((N, S)))
    grad_xh = fused.center_step(nd.array(grad), nd.array(xh), nd.array(coef), idx, w, m, 0.1, 0.9, 5e-4)
    rows = weight[index]
    np.testing.assert_allclose(cosw.asnumpy(), xh @ rows.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(inv.asnumpy(), 1 / np.linalg.norm(rows, axis=1), rtol=1e-5)
    np.testing.assert_allclose(grad_xh.asnumpy(), grad @ rows, rtol=1e-4, atol=1e-6)
    step = 0.9 * mom[index] - 0.1 * (grad.T @ xh - coef[:, None] * rows + 5e-4 * rows)
    np.testing.assert_allclose(m.asnumpy()[index], step, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(w.asnumpy()[index], rows + step, rtol=1e-5, atol=1e-6)
    others = np.setdiff1d(np.arange(R), index)
    assert np.array_equal(w.asnumpy()[others], weight[others].astype(np.float32))
    assert np.array_equal(m.asnumpy()[others], mom[others].astype(np.float32))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("num_classes, rate", [(1, 1.0), (20, 0.05)])
def test_a_step_with_one_center_matches_float64(fused, num_classes, rate):
    """S = 1: each row's only column is its target, so its other-columns sum is empty (was NaN on MXNet ops)."""
    from reference import loss_and_grads, sgd_momentum
    from mxnet_pfc import CombinedMarginLoss, PartialFC

    rng = np.random.default_rng(3)
    x = rng.normal(size=(6, 8)).astype(np.float32)
    label = num_classes // 2
    pfc = PartialFC(CombinedMarginLoss(64, 1, 0.5, 0), 8, num_classes, rate, lr=0.1, seed=1, fused_kernels=fused)
    assert pfc.ops.name == ("fused" if fused else "mxnet")
    w0 = pfc.bank.weight.asnumpy().astype(np.float64)
    loss, grad = pfc.forward_backward(nd.array(x), np.full(6, label))
    assert pfc.sampled_index.shape == (1,)
    ref_loss, ref_dx, ref_dw = loss_and_grads(x, np.zeros(6, int), w0[[label]], 64, 1, 0.5, 0)
    new_w, _ = sgd_momentum(w0[[label]], np.zeros((1, 8)), ref_dw, 0.1, 0.9, 5e-4)
    assert abs(loss - ref_loss) <= 1e-5
    np.testing.assert_allclose(grad.asnumpy(), ref_dx, atol=1e-6)
    np.testing.assert_allclose(pfc.bank.weight.asnumpy()[[label]], new_w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("margin", ["arcface", "cosface"])
def test_a_nan_target_logit_stays_nan_in_both_paths(both, margin):
    """A row whose only non-finite cell is its target: f_t and the row's log-sum-exp must be NaN,
    so that the loss check stops the step (under -ffast-math a clamp to [-1, 1] can turn NaN into 1)."""
    from mxnet_pfc import CombinedMarginLoss

    margin = CombinedMarginLoss.from_name(margin)
    logits = np.random.default_rng(1).uniform(-0.5, 0.5, size=(3, 5)).astype(np.float32)
    logits[1, 2] = np.nan
    target, mask = nd.array([0, 2, 4], dtype="int32"), nd.array([1, 1, 0])
    for ops in both:
        _, lse, f_t, _ = ops.scale_lse(nd.array(logits), nd.ones((5,)), target, mask, margin, 0.3 * margin.s)
        lse, f_t = lse.asnumpy(), f_t.asnumpy()
        assert np.isnan(f_t[1]) and np.isnan(lse[1]), (ops.name, f_t, lse)
        assert np.isfinite(lse[[0, 2]]).all() and np.isfinite(f_t[[0, 2]]).all(), ops.name
