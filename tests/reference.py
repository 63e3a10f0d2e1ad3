"""Independent float64 numpy computation of the margin softmax and its SGD step.

Written from docs/DESIGN.md section 2 with dense matrices and an explicit one-hot,
sharing no code with mxnet_pfc. The gradients are derived by hand here and
checked against finite differences in test_reference.py.
"""
import numpy as np


def target_logit(c, s, m1, m2, m3):
    """(f, df/dc) for target cosines c, fallback c - m3 - m2 sin m2 where m1*theta + m2 > pi."""
    c = np.clip(c, -1.0, 1.0)
    theta = np.arccos(c)
    angle = m1 * theta + m2
    main = np.cos(angle) - m3
    main_grad = m1 * np.sin(angle) / np.maximum(np.sin(theta), 1e-6)
    in_range = angle <= np.pi
    f = np.where(in_range, main, c - m3 - m2 * np.sin(m2))
    g = np.where(in_range, main_grad, 1.0)
    return s * f, s * g


def loss_and_grads(x, labels, w, s, m1, m2, m3, filter_threshold=0.0):
    """Mean loss over rows of x (N, D) against centers w (C, D); grads for x and w.

    labels index rows of w. Returns (loss, dL/dx (N, D), dL/dw (C, D)).
    filter_threshold T > 0: inter-class filtering, every non-target cosine above T
    is replaced by the constant 0 (it adds exp(0) to the softmax, and has no gradient).
    """
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    N, C = x.shape[0], w.shape[0]
    xn = np.linalg.norm(x, axis=1, keepdims=True)
    wn = np.linalg.norm(w, axis=1, keepdims=True)
    xh, wh = x / xn, w / wn
    cos = xh @ wh.T
    onehot = np.zeros((N, C))
    onehot[np.arange(N), labels] = 1.0
    ct = cos[np.arange(N), labels]
    ft, dft = target_logit(ct, s, m1, m2, m3)
    kept = 1.0 - onehot
    if filter_threshold > 0:
        kept *= cos <= filter_threshold
    logits = s * cos * kept + onehot * ft[:, None]
    logits_max = logits.max(axis=1, keepdims=True)
    p = np.exp(logits - logits_max)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.mean(np.log(p[np.arange(N), labels]))
    dlogits = (p - onehot) / N
    dcos = dlogits * (s * kept + onehot * dft[:, None])
    dxh = dcos @ wh
    dwh = dcos.T @ xh
    dx = (dxh - xh * np.sum(dxh * xh, axis=1, keepdims=True)) / xn
    dw = (dwh - wh * np.sum(dwh * wh, axis=1, keepdims=True)) / wn
    return loss, dx, dw


def sgd_momentum(w, mom, grad, lr, momentum, wd):
    """MXNet's sgd_mom_update: mom = momentum*mom - lr*(grad + wd*w); w += mom."""
    mom = momentum * mom - lr * (grad + wd * w)
    return w + mom, mom


def assert_close(actual, expected, what, rtol):
    """|actual - expected| within rtol of expected's largest magnitude."""
    scale = np.abs(expected).max()
    err = np.abs(actual - expected).max()
    assert err <= rtol * scale, f"{what}: max error {err:.3g} vs scale {scale:.3g}"
