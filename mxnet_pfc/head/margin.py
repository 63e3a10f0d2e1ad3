"""The combined margin of ArcFace / CosFace / SphereFace-style losses.

Target logit  f(c) = s * (cos(m1 * acos(c) + m2) - m3),  other logits s * c.

When m1 * acos(c) + m2 exceeds pi the main formula stops decreasing in the
angle; there we use f(c) = s * (c - m3 - m2 * sin(m2)), the branch
InsightFace's reference uses with "easy margin" off. For ArcFace
(m1=1, m2=0.5, m3=0) the whole curve then decreases monotonically in the
angle. With m2 = 0 (CosFace) and m1 <= 1 the branch is never taken.

docs/DESIGN.md section 2.4 derives f and df/dc. The head applies the margin on
the host, in float64, after collective 2 (partial_fc.global_softmax): by then
every rank has the target cosine of every row of the global batch, which a
per-sample or batch-statistic margin needs. tests/test_distributed.py checks it
against an independent float64 computation.
"""
from __future__ import annotations

import math

import numpy as np

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

    def target_logit(self, cos_t: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        """(f, df/dc) in float64 for target cosines cos_t (any shape); values clipped to [-1, 1].

        A NaN or infinite cosine gives f = df = s * cos_t: passed on, so that the loss check sees it
        (the clip would turn +-Inf into +-1)."""
        cos_t = np.asarray(cos_t, dtype=np.float64)
        c = np.clip(cos_t, -1.0, 1.0)
        if self.m1 == 1.0 and self.m2 == 0.0:  # CosFace and plain softmax: linear in c
            f, grad = c - self.m3, np.ones_like(c)
        else:
            with np.errstate(invalid="ignore"):     # NaN cosines: replaced below
                theta = np.arccos(c)
                angle = self.m1 * theta + self.m2
                in_range = theta <= self.theta_limit
            main_grad = self.m1 * np.sin(angle) / np.maximum(np.sin(theta), _MIN_SIN)
            f = np.where(in_range, np.cos(angle) - self.m3, c - self.m3 - self.fallback_shift)
            grad = np.where(in_range, main_grad, 1.0)
        finite = np.isfinite(cos_t)
        scaled = self.s * cos_t
        return np.where(finite, self.s * f, scaled), np.where(finite, self.s * grad, scaled)
