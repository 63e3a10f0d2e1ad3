"""The fused kernels build, load, fall back cleanly, and agree with the MXNet-op path."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from launch import REPO, rank_env, run_ranks
from mxnet_pfc.head.kernels import build
from mxnet_pfc.head.kernels.ops import FusedOps, HeadOps, MXNetOps

nd = mx.nd


def test_library_path_depends_on_source_and_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("MXNET_PFC_CACHE", str(tmp_path))
    path = build.library_path()
    assert path.parent == tmp_path and path.name.startswith("libpfc_kernels-")
    monkeypatch.setattr(build, "_cpu_signature", lambda: "another cpu")
    assert build.library_path() != path


def test_build_is_atomic_and_cached(tmp_path):
    path = build.build(tmp_path / "lib.so")
    assert path.exists() and not list(tmp_path.glob("tmp*.so"))
    mtime = path.stat().st_mtime
    assert build.build(path) == path and path.stat().st_mtime == mtime


def test_missing_compiler_falls_back_to_mxnet_ops(tmp_path):
    """No g++: a warning and the MXNet-op path, never a crash."""
    code = ("import logging; logging.basicConfig(); import mxnet as mx; "
            "from mxnet_pfc.head.kernels.ops import head_ops; print('OPS', head_ops(mx.cpu()).name)")
    env = {**rank_env(), "MXNET_PFC_CACHE": str(tmp_path), "CXX": "no-such-compiler"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert "OPS mxnet" in proc.stdout, proc.stderr[-2000:]
    assert "fused Partial FC kernels unavailable (no C++ compiler (g++) found)" in proc.stderr


def test_disabled_by_environment():
    code = "import mxnet as mx; from mxnet_pfc.head.kernels.ops import head_ops; print('OPS', head_ops(mx.cpu()).name)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**rank_env(), "MXNET_PFC_KERNELS": "0"},
                          capture_output=True, text=True, timeout=120)
    assert "OPS mxnet" in proc.stdout, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def both():
    assert build.load_fused(), "the fused kernels should build on this machine"
    return FusedOps(), MXNetOps()


def test_fused_kernels_load_in_a_multi_rank_run():
    """comm.init() called before the head is built (as the trainer does) still loads the kernels before
    Horovod starts: the head hands comm its loader when imported (kernels/build.py)."""
    code = ("from mxnet_pfc.runtime import comm; from mxnet_pfc.head.margin import CombinedMarginLoss; "
            "from mxnet_pfc.head.partial_fc import PartialFC; "
            "comm.init(); pfc = PartialFC(CombinedMarginLoss(), 8, 4); "
            "print(f'RANK {comm.rank()} OF {comm.size()} OPS {pfc.ops.name}', flush=True); comm.shutdown()")
    proc = run_ranks(2, ["-c", code], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "RANK 0 OF 2 OPS fused" in proc.stdout and "RANK 1 OF 2 OPS fused" in proc.stdout, proc.stdout[-3000:]


def kernel_inputs(full: bool):
    """A small step's inputs as NumPy arrays: N rows, S of R centers of size D sampled (every one when full)."""
    rng = np.random.default_rng(4)
    N, D, R = 6, 5, 20
    index = np.arange(R) if full else np.sort(rng.choice(R, 9, replace=False))
    S = index.shape[0]
    return dict(weight=rng.normal(size=(R, D)), mom=0.01 * rng.normal(size=(R, D)), xh=rng.normal(size=(N, D)),
                index=index.astype(np.int32), target=rng.integers(0, S, N).astype(np.int32),
                mask=(rng.random(N) < 0.7).astype(np.float32), logits=rng.uniform(-1, 1, size=(N, S)),
                coef=0.1 * rng.normal(size=S), center_grad=rng.normal(size=(S, D)),
                step_grad=0.01 * rng.normal(size=(N, S)), target_grad=rng.normal(size=N))


@pytest.mark.parametrize("full", [False, True], ids=["some-rows", "every-row"])
def test_both_implementations_keep_the_interfaces_in_place_contract(both, full):
    """HeadOps' docstrings, checked on each implementation: what is written in place, what is returned, what
    stays. grad of sgd_rows is scratch (either may overwrite it); both update exactly the rows of index."""
    a = {k: v if v.dtype == np.int32 else v.astype(np.float32) for k, v in kernel_inputs(full).items()}
    R, S = a["weight"].shape[0], a["index"].shape[0]
    others = np.setdiff1d(np.arange(R), a["index"])
    updated = []
    for impl in both:
        assert isinstance(impl, HeadOps)
        arr = {k: nd.array(v, dtype=v.dtype) for k, v in a.items()}
        read_only = {k: arr[k] for k in ("xh", "index", "target", "mask", "coef", "target_grad", "step_grad")}

        inv = impl.inv_norm(arr["weight"])
        np.testing.assert_allclose(inv.asnumpy(), 1 / np.linalg.norm(a["weight"], axis=1), rtol=1e-5)
        out = nd.zeros((a["xh"].shape[0], S))
        cosw, inv_rows = impl.logits(arr["xh"], arr["weight"], arr["index"], out)
        assert cosw is out, impl.name                           # written into out
        np.testing.assert_allclose(out.asnumpy(), a["xh"] @ a["weight"][a["index"]].T, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(inv_rows.asnumpy(), inv.asnumpy()[a["index"]], rtol=1e-6)

        logits, col_scale = arr["logits"], 30.0 * inv_rows
        scaled, lse_others, target_scos = impl.scale_lse(logits, col_scale, arr["target"], arr["mask"])
        assert scaled is logits, impl.name                      # scaled in place
        expected = a["logits"] * col_scale.asnumpy()[None].astype(np.float64)
        np.testing.assert_allclose(logits.asnumpy(), expected, rtol=1e-6)
        # the target's scaled logit, unmargined, on rows with mask 1; 0 elsewhere
        rows = np.arange(a["mask"].shape[0])
        owned = a["mask"] > 0
        np.testing.assert_array_equal(target_scos.asnumpy(), np.where(owned, logits.asnumpy()[rows, a["target"]], 0))
        # the log-sum-exp of the other columns (every column where mask is 0)
        kept = np.ones_like(expected, dtype=bool)
        kept[rows[owned], a["target"][owned]] = False
        np.testing.assert_allclose(lse_others.asnumpy(), np.log(np.where(kept, np.exp(expected), 0).sum(axis=1)),
                                   rtol=1e-5)
        lse = lse_others        # softmax_grad below takes any log-sum-exp

        grad, b = impl.softmax_grad(logits, lse, inv_rows, arr["target"], arr["mask"], arr["target_grad"], 30.0,
                                    a["xh"].shape[0])
        rows = np.flatnonzero(a["mask"])
        np.testing.assert_array_equal(grad.asnumpy()[rows, a["target"][rows]], a["target_grad"][rows])
        assert b.shape == (S,)

        weight, mom = arr["weight"], arr["mom"]
        assert impl.sgd_rows(weight, mom, arr["center_grad"], arr["coef"], arr["index"], 0.1, 0.9, 5e-4) is None
        w0 = a["weight"][a["index"]].astype(np.float64)
        step = 0.9 * a["mom"][a["index"]] - 0.1 * (a["center_grad"] - a["coef"][:, None] * w0 + 5e-4 * w0)
        np.testing.assert_allclose(mom.asnumpy()[a["index"]], step, rtol=1e-4, atol=1e-7, err_msg=impl.name)
        np.testing.assert_allclose(weight.asnumpy()[a["index"]], w0 + step, rtol=1e-5, atol=1e-7, err_msg=impl.name)
        assert np.array_equal(weight.asnumpy()[others], a["weight"][others]), impl.name
        assert np.array_equal(mom.asnumpy()[others], a["mom"][others]), impl.name

        before = weight.asnumpy()
        grad_xh = impl.center_step(arr["step_grad"], arr["xh"], arr["coef"], arr["index"], weight, mom, 0.1, 0.9, 5e-4)
        np.testing.assert_allclose(grad_xh.asnumpy(), a["step_grad"] @ before[a["index"]], rtol=1e-5, atol=1e-6)
        assert not np.array_equal(weight.asnumpy()[a["index"]], before[a["index"]]), impl.name
        assert np.array_equal(weight.asnumpy()[others], a["weight"][others]), impl.name
        for name, value in read_only.items():                   # only read, by every method
            np.testing.assert_array_equal(value.asnumpy(), a[name], err_msg=f"{impl.name} wrote {name}")
        updated.append((weight.asnumpy(), mom.asnumpy()))
    (w_fused, m_fused), (w_mxnet, m_mxnet) = updated
    np.testing.assert_allclose(w_fused, w_mxnet, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m_fused, m_mxnet, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("threshold", [None, 2.0])     # inter-class filtering off / on (scaled units)
def test_each_kernel_matches_its_mxnet_twin(both, threshold):
    """Same inputs through both kernel sets (the margin is not theirs: the host's, after collective 2)."""
    fused, plain = both
    rng = np.random.default_rng(0)
    N, S, D, R = 16, 700, 24, 2000          # S > one column block of the gradient kernel
    weight = rng.normal(size=(R, D)).astype(np.float32)
    index = np.sort(rng.choice(R, S, replace=False)).astype(np.int32)
    target = rng.integers(0, S, N).astype(np.int32)
    mask = (rng.random(N) < 0.6).astype(np.float32)
    raw = rng.uniform(-1, 1, size=(N, S))
    # target cosines across (-1, 1)
    raw[np.arange(N), target] = np.linspace(-0.99, 0.99, N) * np.linalg.norm(weight[index[target]], axis=1)
    raw = raw.astype(np.float32)
    target_grad = rng.normal(size=N).astype(np.float32)
    xh = rng.normal(size=(N, D)).astype(np.float32)
    results = []
    for ops in (fused, plain):
        w, idx = nd.array(weight), nd.array(index, dtype="int32")
        cosw, inv = ops.logits(nd.array(xh), w, idx, out=nd.zeros((N, S)))
        logits, lse_others, target_scos = ops.scale_lse(nd.array(raw), 30.0 * inv, nd.array(target, dtype="int32"),
                                                        nd.array(mask), threshold)
        # the gradient kernel takes a global log-sum-exp; this rank's, with the target column, stands in for it
        lse = nd.array(np.logaddexp(lse_others.asnumpy(), target_scos.asnumpy()))
        grad, b = ops.softmax_grad(logits.copy(), lse, inv, nd.array(target, dtype="int32"), nd.array(mask),
                                   nd.array(target_grad), 30.0, N, threshold)
        mom = nd.full((R, D), 0.01)
        grad_xh = ops.center_step(grad, nd.array(xh), b * inv, idx, w, mom, 0.1, 0.9, 5e-4)
        results.append([a.asnumpy() for a in (cosw, inv, logits, lse_others, grad, b, grad_xh, w, mom, target_scos)])
    names = ["logits (cos |w|)", "inv_norm", "scaled logits", "lse_others", "grad", "b", "grad_xh", "weight", "mom",
             "target_scos"]
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
    # lse_others and target_scos against float64: the target column left out of the sum on rows with
    # mask 1 (and its scaled logit returned), every column in it elsewhere; filtered cells enter as logit 0
    logits = results[0][2].astype(np.float64)
    np.testing.assert_allclose(logits, raw * 30.0 * results[0][1][None].astype(np.float64), rtol=1e-5)
    rows = np.arange(N)
    target_cell = np.zeros((N, S), dtype=bool)
    target_cell[rows[mask > 0], target[mask > 0]] = True
    filtered = np.zeros((N, S), dtype=bool) if threshold is None else (logits > threshold) & ~target_cell
    values = np.where(filtered, 0.0, logits)
    expected = np.log(np.where(target_cell, 0.0, np.exp(values)).sum(axis=1))
    for k in (0, 1):
        np.testing.assert_allclose(results[k][3], expected, rtol=1e-5, err_msg=f"lse_others, {fused, plain}[{k}]")
        np.testing.assert_array_equal(results[k][9], np.where(mask > 0, results[k][2][rows, target], 0.0))
    if threshold is not None:       # filtered: above the threshold and not a target; no gradient
        grad = results[0][4]
        assert 0.1 < filtered.mean() < 0.9
        assert (grad[filtered] == 0).all() and (results[1][4][filtered] == 0).all()


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
    from mxnet_pfc import CombinedMarginLoss, PartialFC
    from reference import loss_and_grads, sgd_momentum

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


def test_a_nan_target_logit_stays_nan_in_both_paths(both):
    """A row whose only non-finite cell is its target: its target_scos must be NaN (its lse_others finite),
    so that the loss the host computes from them is NaN and the loss check stops the step."""
    logits = np.random.default_rng(1).uniform(-0.5, 0.5, size=(3, 5)).astype(np.float32)
    logits[1, 2] = np.nan
    target, mask = nd.array([0, 2, 4], dtype="int32"), nd.array([1, 1, 0])
    for ops in both:
        _, lse_others, target_scos = ops.scale_lse(nd.array(logits), nd.ones((5,)), target, mask, 0.3 * 64)
        lse_others, target_scos = lse_others.asnumpy(), target_scos.asnumpy()
        assert np.isnan(target_scos[1]) and np.isfinite(lse_others).all(), (ops.name, target_scos, lse_others)
        assert np.isfinite(target_scos[[0, 2]]).all() and target_scos[2] == 0, ops.name


def subcenter_inputs(rng, N: int, S: int, K: int):
    """(cos (N, S, K) float64, logits (N, S * K) = cos * |w|, inv_norm (S * K,), grad (N, S)), float32 but cos, with
    a third of the classes' largest cosine held by two sub-centers (a tie, also between later ones). 1 / |w| is a
    power of two, so that logits * inv_norm gives cos back exactly and the ties stay ties."""
    cos = rng.uniform(-1, 1, size=(N, S, K)).astype(np.float32).astype(np.float64)
    if K > 1:
        for i, c in zip(*np.nonzero(rng.random((N, S)) < 1 / 3)):
            first, second = np.sort(rng.choice(K, 2, replace=False))
            cos[i, c, first] = cos[i, c, second] = cos[i, c].max()
    inv_norm = 2.0 ** rng.integers(-2, 3, size=S * K)
    logits = (cos.reshape(N, S * K) / inv_norm).astype(np.float32)
    return cos, logits, inv_norm.astype(np.float32), rng.normal(size=(N, S)).astype(np.float32)


@pytest.mark.parametrize("N, S, K", [(9, 700, 3), (4, 5, 2), (3, 300, 4), (5, 7, 1)])  # S > a routing block (256)
def test_subcenter_pooling_and_routing_match_their_mxnet_twin_and_float64(both, N, S, K):
    """pfc_subcenter_pool and pfc_subcenter_route against MXNetOps' and float64 (HeadOps' docstrings), with ties
    in the max: the first of the tied sub-centers wins (numpy's argmax and torch.max's index), in both paths.
    The fused routing writes the rows' gradient into logits; the pooling and the other inputs are only read."""
    cos, logits, inv_norm, grad = subcenter_inputs(np.random.default_rng(S + K), N, S, K)
    winner = cos.argmax(axis=2)
    assert K == 1 or (np.sort(cos, axis=2)[:, :, -1] == np.sort(cos, axis=2)[:, :, -2]).any()   # ties present
    expected_rows = np.zeros((N, S, K))
    np.put_along_axis(expected_rows, winner[:, :, None], grad[:, :, None], axis=2)     # to the winner only
    expected_rows = expected_rows.reshape(N, S * K) * inv_norm
    expected_radial = inv_norm * (expected_rows * cos.reshape(N, S * K)).sum(axis=0)
    for ops in both:
        arr = dict(logits=nd.array(logits), inv_norm=nd.array(inv_norm), grad=nd.array(grad))
        out = (nd.zeros((N, S)), nd.zeros((N, S), dtype="int32"))
        pooled, arg = ops.subcenter_pool(arr["logits"], arr["inv_norm"], K, out)
        assert pooled is out[0] and arg is out[1], ops.name         # written into out
        np.testing.assert_array_equal(pooled.asnumpy(), cos.max(axis=2), err_msg=ops.name)
        np.testing.assert_array_equal(arg.asnumpy(), winner, err_msg=ops.name)
        np.testing.assert_array_equal(arr["logits"].asnumpy(), logits, err_msg=ops.name)    # the pooling only reads
        grad_rows, radial = ops.subcenter_route(arr["logits"], arr["inv_norm"], arg, arr["grad"])
        if ops.name == "fused":
            assert grad_rows is arr["logits"]                       # in place
        np.testing.assert_array_equal(grad_rows.asnumpy(), expected_rows, err_msg=ops.name)
        np.testing.assert_allclose(radial.asnumpy(), expected_radial, rtol=1e-5, atol=1e-6, err_msg=ops.name)
        for name in ("inv_norm", "grad"):
            np.testing.assert_array_equal(arr[name].asnumpy(), locals()[name], err_msg=f"{ops.name} wrote {name}")
        np.testing.assert_array_equal(arg.asnumpy(), winner, err_msg=f"{ops.name} wrote winner")


def test_a_nan_sub_center_makes_its_class_nan_in_both_paths(both):
    """A NaN row's cosine wins its class's max (the first NaN), so that the loss check sees it (2.9), wherever
    it sits among the K; other classes are untouched."""
    cos, logits, inv_norm, _ = subcenter_inputs(np.random.default_rng(7), 3, 4, 3)
    for i, c, k in [(0, 0, 0), (1, 1, 2), (2, 2, 1), (2, 2, 2)]:
        logits[i, c * 3 + k] = np.nan
    for ops in both:
        pooled, arg = ops.subcenter_pool(nd.array(logits), nd.array(inv_norm), 3,
                                         (nd.zeros((3, 4)), nd.zeros((3, 4), dtype="int32")))
        pooled, arg = pooled.asnumpy(), arg.asnumpy()
        nan_cells = [(0, 0, 0), (1, 1, 2), (2, 2, 1)]
        for i, c, k in nan_cells:
            assert np.isnan(pooled[i, c]) and arg[i, c] == k, (ops.name, i, c, pooled[i, c], arg[i, c])
        finite = np.ones((3, 4), dtype=bool)
        finite[tuple(np.array(nan_cells)[:, :2].T)] = False
        np.testing.assert_array_equal(pooled[finite], cos.max(axis=2)[finite], err_msg=ops.name)


def test_a_winner_outside_its_class_is_refused_before_any_write(both):
    fused, _ = both
    _, logits, inv_norm, grad = subcenter_inputs(np.random.default_rng(8), 2, 3, 2)
    for bad in (2, -1):
        winner = np.zeros((2, 3), dtype=np.int32)
        winner[1, 2] = bad
        rows, inv, bad_winner = nd.array(logits), nd.array(inv_norm), nd.array(winner, dtype="int32")
        with pytest.raises(mx.base.MXNetError, match=rf"pfc_subcenter_route: winner\[1, 2\] = {bad} is outside"):
            fused.subcenter_route(rows, inv, bad_winner, nd.array(grad))[1].wait_to_read()
        np.testing.assert_array_equal(rows.asnumpy(), logits)


@pytest.mark.parametrize("margin", ["arcface", "cosface", "combined"])
def test_the_host_margin_matches_the_reference_formula(margin):
    """CombinedMarginLoss.target_logit (float64, on the host after collective 2) against the test's own
    formula on both branches (ArcFace's fallback past pi included); NaN and Inf cosines pass through, and
    global_softmax then gives a non-finite loss."""
    from mxnet_pfc import CombinedMarginLoss
    from mxnet_pfc.head.partial_fc import global_softmax
    from reference import target_logit

    m = CombinedMarginLoss.from_name(margin, s=30.0)
    c = np.linspace(-1.0, 1.0, 201)[1:-1]
    f, df = m.target_logit(c)
    ref_f, ref_df = target_logit(c, *m.as_tuple())
    assert f.dtype == df.dtype == np.float64
    np.testing.assert_allclose(f, ref_f, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(df, ref_df, rtol=1e-12, atol=1e-12)
    for bad in (np.nan, np.inf, -np.inf):
        f, df = m.target_logit(np.array([0.5, bad]))
        assert np.isfinite(f[0]) and not np.isfinite(f[1]) and not np.isfinite(df[1]), (bad, f, df)
        parts = np.array([[[1.0, 2.0], [0.0, 0.0]], [[3.0, 1.0], [15.0, 30.0 * bad]]])   # (W=2, 2, N=2)
        assert not np.isfinite(global_softmax(parts, np.ones(2), m, 2)[1]), bad
