"""The training module end to end on a linear backbone: W ranks equal one float64 model.

The backbone's gradient comes from the head's gradient through the FC layer;
Horovod averages over ranks and the optimizer rescales by the world size, so the
update must be that of one SGD step on the global mean loss. Checked against a
float64 numpy computation (tests/reference.py) over two steps with momentum,
weight decay (not on the bias, as MXNet's SGD does) and a learning-rate change.

With gradient accumulation, K micro-batches of N must be one step on the K x N
batch: the mean loss over all of it, one update of backbone and centers.
"""
import numpy as np
import pytest

from launch import run_ranks
from reference import loss_and_grads, sgd_momentum

IMAGE = 4             # inputs 3 x 4 x 4 = 48 features
D, C, N = 8, 23, 12   # embedding, classes, global batch (divisible by 1, 2, 3)
MARGIN = (16.0, 1.0, 0.3, 0.1)
MOMENTUM, WD, LRS = 0.9, 5e-4, (0.05, 0.02)


def make_inputs(rng, grad_accum=1):
    inputs = dict(fc_weight=rng.normal(0, 0.2, (D, 3 * IMAGE * IMAGE)), fc_bias=rng.normal(0, 0.1, D),
                  centers=rng.normal(0, 1, (C, D)), image_size=IMAGE, margin=np.array(MARGIN), rate=1.0,
                  momentum=MOMENTUM, wd=WD, lrs=np.array(LRS), grad_accum=grad_accum)
    for step in range(len(LRS)):        # a step's samples: K micro-batches of N
        inputs[f"x{step}"] = rng.uniform(0, 255, (grad_accum * N, 3, IMAGE, IMAGE))
        inputs[f"y{step}"] = rng.integers(0, C, grad_accum * N)
    return {k: np.asarray(v, dtype=np.float32) if np.asarray(v).dtype == np.float64 else v for k, v in inputs.items()}


def reference(inputs):
    """Losses, backbone, centers and their momentum after the steps, in float64: one step
    per global batch, however many micro-batches the module cuts it into."""
    W, b, centers = (inputs[k].astype(np.float64) for k in ("fc_weight", "fc_bias", "centers"))
    mom_W, mom_b, mom_c = np.zeros_like(W), np.zeros_like(b), np.zeros_like(centers)
    losses = []
    for step, lr in enumerate(LRS):
        x = inputs[f"x{step}"].astype(np.float64).reshape(len(inputs[f"y{step}"]), -1)
        embeddings = x @ W.T + b
        loss, d_emb, d_centers = loss_and_grads(embeddings, inputs[f"y{step}"], centers, *MARGIN)
        losses.append(loss)
        W, mom_W = sgd_momentum(W, mom_W, d_emb.T @ x, lr, MOMENTUM, WD)
        b, mom_b = sgd_momentum(b, mom_b, d_emb.sum(axis=0), lr, MOMENTUM, 0.0)    # no decay on biases
        centers, mom_c = sgd_momentum(centers, mom_c, d_centers, lr, MOMENTUM, WD)
    return np.array(losses), W, b, centers, mom_c


@pytest.mark.parametrize("world, grad_accum", [(2, 1), (3, 1), (1, 3), (3, 2)])
def test_module_step_matches_float64(tmp_path, world, grad_accum):
    inputs = make_inputs(np.random.default_rng(world), grad_accum)
    np.savez(tmp_path / "inputs.npz", **inputs)
    proc = run_ranks(world, ["tests/module_worker.py", tmp_path / "inputs.npz", tmp_path], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    losses, W, b, centers, momentum = reference(inputs)
    got_centers, got_momentum = np.zeros_like(centers), np.zeros_like(momentum)
    for rank in range(world):
        out = np.load(tmp_path / f"rank{rank}.npz")
        np.testing.assert_allclose(out["losses"], losses, rtol=1e-4)
        np.testing.assert_allclose(out["fc_weight"], W, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(out["fc_bias"], b, rtol=1e-4, atol=1e-6)
        start = int(out["class_start"])
        got_centers[start:start + len(out["centers"])] = out["centers"]
        got_momentum[start:start + len(out["centers"])] = out["momentum"]
        if world > 1:       # the backbone's gradients are reduced once per step, not per micro-batch
            assert list(out["reductions"]) == [2, 2], out["reductions"]       # fc_weight, fc_bias
    np.testing.assert_allclose(got_centers, centers, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(got_momentum, momentum, rtol=1e-4, atol=1e-7)
    # the update moved the backbone: the test would notice a missing or doubled gradient
    assert np.abs(W - inputs["fc_weight"]).max() > 1e-3


def test_added_gradients_of_the_real_backbone_equal_the_sum():
    """grad_req "add" through r18-lite's convolutions, BatchNorm and PReLU (oneDNN on CPU): two
    backward passes of the same batch hold twice one pass's gradients (gradient accumulation
    relies on MXNet adding, not overwriting, in every layer)."""
    import mxnet as mx

    import symbols

    symbol = symbols.get_symbol("r18-lite", 128)
    data = mx.nd.array(np.random.default_rng(0).uniform(0, 255, (4, 3, 112, 112)))
    out_grad = mx.nd.array(np.random.default_rng(1).normal(size=(4, 128)))
    grads = {}
    for req in ("write", "add"):
        module = mx.mod.Module(symbol, data_names=["data"], label_names=None, context=mx.cpu())
        module.bind(data_shapes=[("data", data.shape)], for_training=True, grad_req=req)
        mx.random.seed(5)
        module.init_params(mx.init.Xavier())
        for grad in (g for gs in module._exec_group.grad_arrays for g in gs):
            grad[:] = 0
        for _ in range(1 if req == "write" else 2):
            module.forward(mx.io.DataBatch([data]), is_train=True)
            module.backward(out_grads=[out_grad])
        grads[req] = {name: module._exec_group.grad_arrays[i][0].asnumpy()
                      for i, name in enumerate(module._exec_group.param_names)}
    assert len(grads["add"]) > 50
    for name, once in grads["write"].items():
        np.testing.assert_allclose(grads["add"][name], 2 * once, rtol=1e-4, atol=1e-6 * max(1, np.abs(once).max()),
                                   err_msg=name)
