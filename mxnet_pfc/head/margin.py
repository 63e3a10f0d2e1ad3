"""The combined margin of ArcFace / CosFace / SphereFace-style losses.

Target logit  f(c) = s * (cos(m1 * acos(c) + m2) - m3),  other logits s * c.

When m1 * acos(c) + m2 exceeds pi the main formula stops decreasing in the
angle; there we use f(c) = s * (c - m3 - m2 * sin(m2)), the branch
InsightFace's reference uses with "easy margin" off. For ArcFace
(m1=1, m2=0.5, m3=0) the whole curve then decreases monotonically in the
angle. With m2 = 0 (CosFace) and m1 <= 1 the branch is never taken.

docs/DESIGN.md section 2.3 derives f and df/dc. The fused CPU kernel
pfc_scale_lse (kernels/pfc_kernels.cc, `Margin`) evaluates the same formula
inside its log-sum-exp pass; tests/test_kernels.py checks the two agree.
"""
from __future__ import annotations

import math

import mxnet as mx

nd = mx.nd

# The losses by name, the one table of them (the trainer's --loss presets are
# built from it): scale s and margins m1, m2, m3.
PRESETS = {
    "arcface": dict(s=64.0, m1=1.0, m2=0.5, m3=0.0),
    "cosface": dict(s=64.0, m1=1.0, m2=0.0, m3=0.4),
    "combined": dict(s=64.0, m1=1.0, m2=0.3, m3=0.2),
    # CosFace with half the scale and margin: starts learning within a few hundred steps on
    # 10^3 classes, where s = 64, m = 0.4 stays at chance that long (the synthetic default)
    "cosface-small": dict(s=32.0, m1=1.0, m2=0.0, m3=0.2),
}

# sin(theta) below this is treated as this value in d f / d c (the derivative
# of the main branch has 1/sin(theta), infinite at c = +-1).
_MIN_SIN = 1e-6


class CombinedMarginLoss:
    """The margin applied to the target logit; the rest of the loss is in PartialFC."""

    def __init__(self, s: float = PRESETS["arcface"]["s"], m1: float = PRESETS["arcface"]["m1"],
                 m2: float = PRESETS["arcface"]["m2"], m3: float = PRESETS["arcface"]["m3"]):
        """ArcFace's margins unless others are given."""
        for name, value in (("s", s), ("m1", m1), ("m2", m2), ("m3", m3)):
            if not math.isfinite(value):
                raise ValueError(f"margin parameter {name} must be finite, got {value}")
        if s <= 0:
            raise ValueError(f"margin scale s must be positive, got {s}")
        if m1 <= 0:
            raise ValueError(f"margin m1 must be positive, got {m1}")
        self.s, self.m1, self.m2, self.m3 = float(s), float(m1), float(m2), float(m3)
        # Fallback branch for angles where m1 * theta + m2 > pi.
        self.theta_limit = (math.pi - self.m2) / self.m1
        self.fallback_shift = self.m2 * math.sin(self.m2)

    @classmethod
    def from_name(cls, name: str, s: "float | None" = None) -> "CombinedMarginLoss":
        """The named preset of PRESETS; `s` replaces its scale when given."""
        if name not in PRESETS:
            raise ValueError(f"unknown margin {name!r}; choose one of {sorted(PRESETS)}")
        preset = dict(PRESETS[name])
        if s is not None:
            preset["s"] = s
        return cls(**preset)

    def as_tuple(self) -> tuple:
        return (self.s, self.m1, self.m2, self.m3)

    def __repr__(self) -> str:
        return f"CombinedMarginLoss(s={self.s}, m1={self.m1}, m2={self.m2}, m3={self.m3})"

    def target_logit(self, cos_t: nd.NDArray) -> "tuple[nd.NDArray, nd.NDArray]":
        """(f, df/dc) for target cosines cos_t (any shape); values clipped to [-1, 1]."""
        c = nd.clip(cos_t, -1.0, 1.0)
        if self.m1 == 1.0 and self.m2 == 0.0:  # CosFace and plain softmax: linear in c
            return self.s * (c - self.m3), nd.full(c.shape, self.s, ctx=c.context, dtype=c.dtype)
        theta = nd.arccos(c)
        angle = self.m1 * theta + self.m2
        main = nd.cos(angle) - self.m3
        sin_theta = nd.maximum(nd.sin(theta), _MIN_SIN)
        main_grad = self.m1 * nd.sin(angle) / sin_theta
        in_range = theta <= self.theta_limit
        f = nd.where(in_range, main, c - self.m3 - self.fallback_shift)
        grad = nd.where(in_range, main_grad, nd.ones_like(c))
        return self.s * f, self.s * grad
