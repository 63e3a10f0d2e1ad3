"""The float64 reference itself is checked against finite differences."""
import numpy as np
import pytest

from reference import loss_and_grads

MARGINS = {"arcface": (64.0, 1.0, 0.5, 0.0), "cosface": (64.0, 1.0, 0.0, 0.4),
           "combined": (30.0, 0.9, 0.4, 0.15)}


@pytest.mark.parametrize("threshold", [0.0, 0.2])
@pytest.mark.parametrize("name", sorted(MARGINS))
def test_reference_gradients_match_finite_differences(name, threshold):
    s, m1, m2, m3 = MARGINS[name]
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(6, 5)), rng.normal(size=(7, 5))
    labels = rng.integers(0, 7, size=6)
    loss, dx, dw = loss_and_grads(x, labels, w, s, m1, m2, m3, threshold)
    if threshold:       # some negatives are filtered, and that changes the loss
        cos = (x / np.linalg.norm(x, axis=1, keepdims=True)) @ (w / np.linalg.norm(w, axis=1, keepdims=True)).T
        cos[np.arange(6), labels] = -1
        assert (cos > threshold).sum() >= 5 and loss != loss_and_grads(x, labels, w, s, m1, m2, m3)[0]
    eps = 1e-6
    for arr, grad in ((x, dx), (w, dw)):
        for idx in [(0, 0), (3, 2), (5, 4), (2, 1)]:
            old = arr[idx]
            arr[idx] = old + eps
            up = loss_and_grads(x, labels, w, s, m1, m2, m3, threshold)[0]
            arr[idx] = old - eps
            down = loss_and_grads(x, labels, w, s, m1, m2, m3, threshold)[0]
            arr[idx] = old
            assert abs((up - down) / (2 * eps) - grad[idx]) < 1e-5 * max(1.0, abs(grad[idx]))
