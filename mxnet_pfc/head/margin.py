"""The margins the head accepts (Margin): the combined margin of ArcFace / CosFace /
SphereFace-style losses (CombinedMarginLoss), AdaFace, ElasticFace, MagFace, CurricularFace
and sub-center ArcFace (their classes below; LOSSES names every preset; docs/losses.md).

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

import inspect
import math
from dataclasses import dataclass

import numpy as np

from mxnet_pfc.runtime.errors import quoted

# sin(theta) below this is treated as this value in d f / d c (the derivative
# of the main branch has 1/sin(theta), infinite at c = +-1).
_MIN_SIN = 1e-6


class MarginParameterError(ValueError):
    """A margin's parameter is out of range; `param` names it (the trainer names its configuration field)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _require_numbers(loss: str, **params) -> None:
    """Each parameter a finite number, or MarginParameterError naming it."""
    for name, value in params.items():
        if (not isinstance(value, (int, float, np.floating, np.integer)) or isinstance(value, bool)
                or not math.isfinite(value)):
            raise MarginParameterError(name, f"{loss} parameter {name} must be a finite number, got {value!r}")


class Margin:
    """What the head asks of a margin (partial_fc.global_softmax calls it once per forward_backward).

    target_logit(cos_t, norms) -> (f_t, df_t): float64 arrays (N,), the target logit of every row
    of the global batch and its derivative in cos_t, given the rows' target cosines and the
    norms |x| of their raw (un-normalised) embeddings, both identical on every rank. A margin
    with running statistics updates them in this call (once per call, the same on every rank);
    state() / load_state(state) are those statistics (a dict of floats, {} if none).
    KIND and PARAM_NAMES name the margin and the values of as_tuple() (checked equal across ranks).
    CONFIG_PREFIX names the trainer's fields of its PARAM_NAMES other than s (config.py): PREFIX_NAME;
    s is margin_s for every margin. CONFIG_PARAMS (all of PARAM_NAMES unless given) are the parameters that
    are fields, CONFIG_HELP says each but s in a sentence for --help; the constructor's annotations and defaults
    (the published values, LOSSES below) are the fields' types and defaults. config.py builds its loss fields
    from these (config_fields): a new loss is added in this module only.

    A loss that depends on the embeddings' norms beyond the target logit (MagFace) sets USES_NORM and
    gives norm_terms(cos_t, norms) -> (penalty, d penalty / d norm, d f_t / d norm), each (N,): the head adds
    the mean penalty to the loss and d loss / d |x| along each embedding (the radial part of its gradient).

    A loss that reshapes the hard negatives (CurricularFace) sets HARD_NEGATIVES and gives
    hard_negatives(cos_t) -> (threshold (N,), t): called before the log-sum-exp with every row's target
    cosine (one more collective), it updates the margin's statistic and says which non-target cells are hard
    (cos above the row's threshold) and the t of their value cos * (t + cos).

    A loss with several centers per class (sub-center ArcFace) has `subcenters` = K > 1: the head keeps K rows
    per class and gives the margin each class's largest cosine over them.
    """

    KIND = 0.0
    PARAM_NAMES: "tuple[str, ...]" = ()
    CONFIG_PREFIX = ""
    CONFIG_FIELDS: "dict[str, str]" = {}    # a parameter's field where it is not PREFIX_NAME
    CONFIG_HELP: "dict[str, str]" = {}      # --help's sentence of each of CONFIG_PARAMS but s (SCALE_HELP)
    USES_NORM = False
    HARD_NEGATIVES = False
    subcenters = 1
    s: float

    def target_logit(self, cos_t: np.ndarray, norms: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        raise NotImplementedError

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, name) for name in self.PARAM_NAMES)

    def state(self) -> dict:
        return {}

    def load_state(self, state: dict) -> None:
        if state:
            raise ValueError(f"{type(self).__name__} has no state, got {quoted(sorted(state))}")

    def norm_terms(self, cos_t: np.ndarray, norms: np.ndarray) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
        raise NotImplementedError

    def hard_negatives(self, cos_t: np.ndarray) -> "tuple[np.ndarray, float]":
        raise NotImplementedError

    def _scaled(self, cos_t: np.ndarray, f: np.ndarray, grad: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        """(s * f, s * grad), with a NaN or infinite cosine's row giving s * cos_t in both: passed on, so that the
        loss check sees it (a margin's clip would turn +-Inf into +-1)."""
        finite = np.isfinite(cos_t)
        scaled = self.s * cos_t
        return np.where(finite, self.s * f, scaled), np.where(finite, self.s * grad, scaled)


class CombinedMarginLoss(Margin):
    """The margin applied to the target logit; the rest of the loss is in PartialFC."""

    KIND = 0.0
    PARAM_NAMES = ("s", "m1", "m2", "m3")
    CONFIG_PREFIX = "margin"
    CONFIG_HELP = {
        "m1": "Multiplicative angular margin m1 (SphereFace; 1 = none) of the combined-margin losses.",
        "m2": "Additive angular margin m2 in radians (ArcFace; 0 = none) of the combined-margin losses.",
        "m3": "Additive cosine margin m3 (CosFace; 0 = none) of the combined-margin losses.",
    }

    def __init__(self, s: float = 64.0, m1: float = 1.0, m2: float = 0.5, m3: float = 0.0, fallback: bool = True):
        """ArcFace's margins unless others are given. fallback=False drops the branch past pi (sub-center
        ArcFace's official code has none): f = s * (cos(m1 * theta + m2) - m3) at every angle."""
        _require_numbers("margin", s=s, m1=m1, m2=m2, m3=m3)
        if s <= 0:
            raise MarginParameterError("s", f"margin scale s must be positive, got {s}")
        if m1 <= 0:
            raise MarginParameterError("m1", f"margin m1 must be positive, got {m1}")
        self.s, self.m1, self.m2, self.m3 = float(s), float(m1), float(m2), float(m3)
        # Fallback branch for angles where m1 * theta + m2 > pi.
        self.fallback = bool(fallback)
        self.theta_limit = (math.pi - self.m2) / self.m1 if self.fallback else math.inf
        self.fallback_shift = self.m2 * math.sin(self.m2)

    @classmethod
    def from_name(cls, name: str, s: "float | None" = None) -> "CombinedMarginLoss":
        """The named combined-margin preset of LOSSES; `s` replaces its scale when given."""
        names = [name for name, (kind, _) in LOSSES.items() if kind is cls]
        if name not in names:
            raise ValueError(f"unknown margin {name!r}; choose one of {sorted(names)}")
        return make_margin(name, **({} if s is None else {"s": s}))

    def __repr__(self) -> str:
        return f"CombinedMarginLoss(s={self.s}, m1={self.m1}, m2={self.m2}, m3={self.m3})"

    def target_logit(self, cos_t: np.ndarray, norms: "np.ndarray | None" = None) -> "tuple[np.ndarray, np.ndarray]":
        """(f, df/dc) in float64 for target cosines cos_t (any shape); values clipped to [-1, 1].
        The norms are not used.

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
        return self._scaled(cos_t, f, grad)


class AdaFaceMargin(Margin):
    """AdaFace (Kim et al. 2022), following the official mk-minchul/AdaFace head.py
    (commit c60eaa78, lines cited below), with its statistics over the GLOBAL batch.

    eps = 1e-3 (head.py:61) everywhere the official code uses self.eps. For every row i:
      safe_norm_i = clip(|x_i|, 0.001, 100), detached: no gradient flows into the norm (head.py:83-84)
      running statistics, updated BEFORE use (head.py:87-91), batch_mean starting at 20 and
      batch_std at 100 (head.py:67-69):
        batch_mean = t_alpha * mean(safe_norm) + (1 - t_alpha) * batch_mean
        batch_std  = t_alpha * std(safe_norm)  + (1 - t_alpha) * batch_std     (std unbiased, N - 1)
      scaler_i = clip((safe_norm_i - batch_mean) / (batch_std + eps) * h, -1, 1)   (head.py:93-95)
      g_angular = -m * scaler_i,  g_add = m + m * scaler_i                     (head.py:103-116)
      theta = arccos(clip(c, -1 + eps, 1 - eps))                               (head.py:81, 107)
      theta_m = clip(theta + g_angular, eps, pi - eps)                         (head.py:108)
      f_t = s * (cos(theta_m) - g_add)                                          (head.py:109-119)

    The batch statistics: the official head takes them over the batch the module sees (one
    process's); here the batch is the global one (every rank holds all N norms, from the gathered
    embeddings), so they are identical on every rank, as in the author's Partial FC port
    (CVLface run_v1/classifiers/partial_fc/partial_fc.py:176-191). A global batch of one row has
    no unbiased std (the official code gives NaN); it is refused.

    df_t: the official autograd of head.py (not the straight-through s of the CVLface port):
      df_t/dc = s * sin(theta_m) / sin(theta)  where -1 + eps <= c <= 1 - eps and eps <= theta + g_angular <= pi - eps,
              = 0 where a clamp binds (torch's clamp passes the gradient on the closed interval).
    (sin(theta) >= sin(eps') > 0.0447 inside the clamp, so no division by zero.)
    The official head also clamps the non-target cosines to +-(1 - eps) (head.py:81); this head does
    not (the non-target logits are s * cos): they differ only for a non-target cosine beyond 0.999.

    Calls: the head calls target_logit once per forward_backward, so the running statistics move
    once per global batch -- once per micro-batch under gradient accumulation (micro_batches = K
    moves them K times per optimizer step), as the official head moves them at every forward.
    The running statistics are state() / load_state().
    """

    KIND = 1.0
    PARAM_NAMES = ("s", "m", "h", "t_alpha")
    CONFIG_PREFIX = "adaface"
    CONFIG_HELP = {
        "m": "AdaFace's margin m (--loss adaface).",
        "h": "AdaFace's h: how far the norm, in batch standard deviations, moves the margin (--loss adaface).",
        "t_alpha": "AdaFace's momentum of the running mean and std of the feature norms (--loss adaface).",
    }
    EPS = 1e-3                  # head.py:61
    NORM_CLIP = (0.001, 100.0)  # head.py:83
    INITIAL = {"batch_mean": 20.0, "batch_std": 100.0}   # head.py:67-69

    def __init__(self, s: float = 64.0, m: float = 0.4, h: float = 0.333, t_alpha: float = 0.01):
        _require_numbers("AdaFace", s=s, m=m, h=h, t_alpha=t_alpha)
        if s <= 0:
            raise MarginParameterError("s", f"AdaFace scale s must be positive, got {s}")
        if m < 0:
            raise MarginParameterError("m", f"AdaFace margin m must be >= 0, got {m}")
        if h <= 0:
            raise MarginParameterError("h", f"AdaFace h must be positive (h = 0 makes it CosFace), got {h}")
        if not 0.0 < t_alpha <= 1.0:
            raise MarginParameterError("t_alpha", f"AdaFace t_alpha must be in (0, 1], got {t_alpha}")
        self.s, self.m, self.h, self.t_alpha = float(s), float(m), float(h), float(t_alpha)
        self.batch_mean = self.INITIAL["batch_mean"]
        self.batch_std = self.INITIAL["batch_std"]

    def __repr__(self) -> str:
        return (f"AdaFaceMargin(s={self.s}, m={self.m}, h={self.h}, t_alpha={self.t_alpha}; "
                f"batch_mean={self.batch_mean:.6g}, batch_std={self.batch_std:.6g})")

    def state(self) -> dict:
        return {"batch_mean": self.batch_mean, "batch_std": self.batch_std}

    def load_state(self, state: dict) -> None:
        if set(state) != set(self.INITIAL):
            raise ValueError(f"AdaFace state must have {sorted(self.INITIAL)}, got {quoted(sorted(state))}")
        values = {k: float(v) for k, v in state.items()}
        bad = [k for k, v in values.items() if not math.isfinite(v)]
        if bad:
            raise ValueError(f"AdaFace state {bad[0]} must be finite, got {quoted(values[bad[0]])}")
        self.batch_mean, self.batch_std = values["batch_mean"], values["batch_std"]

    def target_logit(self, cos_t: np.ndarray, norms: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        """(f, df/dc) in float64 for the global batch's target cosines and embedding norms (N,);
        updates the running statistics first (once per call). Non-finite cosines are passed on
        as s * cos_t (the loss check reports them)."""
        eps = self.EPS
        cos_t = np.asarray(cos_t, dtype=np.float64)
        norms = np.asarray(norms, dtype=np.float64)
        if norms.shape != cos_t.shape or norms.ndim != 1:
            raise ValueError(f"AdaFace needs one norm per target cosine, got {norms.shape} and {cos_t.shape}")
        if norms.size < 2:
            raise ValueError("AdaFace needs a global batch of at least 2 rows (the unbiased std of the norms)")
        safe = np.clip(norms, *self.NORM_CLIP)
        a = self.t_alpha
        self.batch_mean = a * float(safe.mean()) + (1.0 - a) * self.batch_mean
        self.batch_std = a * float(safe.std(ddof=1)) + (1.0 - a) * self.batch_std
        scaler = np.clip((safe - self.batch_mean) / (self.batch_std + eps) * self.h, -1.0, 1.0)
        g_angular = -self.m * scaler
        g_add = self.m + self.m * scaler
        with np.errstate(invalid="ignore"):
            c = np.clip(cos_t, -1.0 + eps, 1.0 - eps)
            theta = np.arccos(c)
            shifted = theta + g_angular
            theta_m = np.clip(shifted, eps, math.pi - eps)
            live = (cos_t >= -1.0 + eps) & (cos_t <= 1.0 - eps) & (shifted >= eps) & (shifted <= math.pi - eps)
        f = np.cos(theta_m) - g_add
        grad = np.where(live, np.sin(theta_m) / np.sin(theta), 0.0)
        return self._scaled(cos_t, f, grad)


class ElasticFaceMargin(Margin):
    """ElasticFace (Boutros et al. 2022): the margin of each row drawn from N(m, std), following the
    official fdbtrs/ElasticFace utils/losses.py.

      angular (ElasticArcFace):  f_t = s * cos(arccos(clip(c, -1, 1)) + m_i)
      cosine  (ElasticCosFace):  f_t = s * (c - m_i)
    with m_i ~ N(m, std), one draw per row of the global batch at every call. The "+" variants
    (plus=True) sort the draws ascending and give row i the sorted draw at position rank_i, where
    rank_i is row i's position in the rows sorted by target cosine, descending (the official
    margin[argsort(-cos_t)]: the permutation is applied as it is, not inverted).
    No fallback past pi (the official code has none); the draws carry no gradient.

    The draws are keyed by (seed, call, row): call counts the calls of target_logit over the run
    (state(), so a resume continues them) and row is the index in the global batch, so they are the
    same on every rank, on any world size with the same global batch, and after a resume.
    """

    KIND = 2.0
    PARAM_NAMES = ("s", "m", "std", "angular", "plus", "seed")
    CONFIG_PREFIX = "elastic"
    CONFIG_PARAMS = ("s", "m", "std")
    CONFIG_HELP = {
        "m": "ElasticFace's mean margin: angular (elasticface-arc*) or cosine (elasticface-cos*).",
        "std": "ElasticFace's standard deviation of the per-sample margin (--loss elasticface-*).",
    }

    def __init__(self, s: float = 64.0, m: float = 0.5, std: float = 0.05, angular: bool = True,
                 plus: bool = False, seed: int = 0):
        _require_numbers("ElasticFace", s=s, m=m, std=std)
        if s <= 0:
            raise MarginParameterError("s", f"ElasticFace scale s must be positive, got {s}")
        if std < 0:
            raise MarginParameterError("std", f"ElasticFace std must be >= 0, got {std}")
        if isinstance(seed, bool) or int(seed) != seed or seed < 0:
            raise MarginParameterError("seed", f"ElasticFace seed must be a non-negative integer, got {seed!r}")
        self.s, self.m, self.std = float(s), float(m), float(std)
        self.angular, self.plus, self.seed = bool(angular), bool(plus), int(seed)
        self.calls = 0

    def __repr__(self) -> str:
        name = "ElasticArcFace" if self.angular else "ElasticCosFace"
        return f"ElasticFaceMargin({name}{'+' if self.plus else ''}, s={self.s}, m={self.m}, std={self.std})"

    def state(self) -> dict:
        return {"calls": self.calls}

    def load_state(self, state: dict) -> None:
        calls = state.get("calls") if set(state) == {"calls"} else None
        if not isinstance(calls, int) or isinstance(calls, bool) or calls < 0:
            raise ValueError(f"ElasticFace state must be {{'calls': a non-negative integer}}, got {quoted(state)}")
        self.calls = calls

    def draws(self, call: int, rows: int) -> np.ndarray:
        """The margins of call `call` for a global batch of `rows` rows (float64), in the official order."""
        generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, call])))
        return generator.normal(self.m, self.std, size=rows)

    def target_logit(self, cos_t: np.ndarray, norms: "np.ndarray | None" = None) -> "tuple[np.ndarray, np.ndarray]":
        """(f, df/dc) in float64 for the global batch's target cosines (N,); one call = one draw of N
        margins. Non-finite cosines are passed on as s * cos_t."""
        cos_t = np.asarray(cos_t, dtype=np.float64)
        margins = self.draws(self.calls, cos_t.size)
        self.calls += 1
        if self.plus:
            # official: margin sorted ascending, then indexed by the descending sort order of cos_t
            order = np.argsort(-np.nan_to_num(cos_t, nan=-np.inf), kind="stable")
            margins = np.sort(margins)[order]
        c = np.clip(cos_t, -1.0, 1.0)
        if self.angular:
            with np.errstate(invalid="ignore"):
                theta = np.arccos(c)
            f = np.cos(theta + margins)
            grad = np.sin(theta + margins) / np.maximum(np.sin(theta), _MIN_SIN)
        else:
            f, grad = c - margins, np.ones_like(c)
        return self._scaled(cos_t, f, grad)


class MagFaceMargin(Margin):
    """MagFace (Meng et al. 2021), following the official IrvingMeng/MagFace models/magface.py (commit 99bae61,
    lines cited below) and its training setting run/run.sh (lambda_g = 35).

    For every row, with a = clip(|x|, l_a, u_a) (magface.py:88; not detached, so the gradient through the
    norm is zero outside [l_a, u_a]) and c = clip(cos_t, -1, 1) (magface.py:95):
      m(a) = (u_m - l_m) / (u_a - l_a) * (a - l_a) + l_m                      (magface.py:57-62)
      easy_margin (the official default, magface.py:75, 98-99):
          f_t = s * cos(arccos(c) + m(a))   where c > 0,   s * c   elsewhere
      easy_margin=False (magface.py:100-104):
          f_t = s * cos(arccos(c) + m(a))   where c > cos(pi - m(a)),   s * (c - m(a) * sin(pi - m(a))) elsewhere
      loss = mean cross-entropy + lambda_g * mean g(a),  g(a) = a / u_a^2 + 1 / a    (magface.py:125-127,
                                                                                     run/trainer.py:198-199)
    The margin's dependence on a is trained (d f_t / d a = -s * sin(theta + m) * m'(a) on the margined branch),
    as is g's: both give the radial part of the embedding's gradient (norm_terms). Everything is over the
    global batch: every rank has every row's norm and target cosine, so nothing is lost between ranks.
    d f_t / d c = s * sin(theta + m) / sin(theta) on the margined branch (sin(theta) at least 1e-6), s elsewhere.
    """

    KIND = 3.0
    PARAM_NAMES = ("s", "l_a", "u_a", "l_m", "u_m", "lambda_g", "easy_margin")
    CONFIG_PREFIX = "magface"
    CONFIG_PARAMS = ("s", "l_a", "u_a", "l_m", "u_m", "lambda_g")
    CONFIG_HELP = {
        "l_a": "MagFace's smallest feature norm l_a: norms are clipped to [l_a, u_a] (--loss magface).",
        "u_a": "MagFace's largest feature norm u_a (--loss magface).",
        "l_m": "MagFace's margin at norm l_a (--loss magface).",
        "u_m": "MagFace's margin at norm u_a (--loss magface).",
        "lambda_g": "MagFace's weight of the norm regulariser g(a) = a / u_a^2 + 1 / a (--loss magface).",
    }
    USES_NORM = True

    def __init__(self, s: float = 64.0, l_a: float = 10.0, u_a: float = 110.0, l_m: float = 0.45, u_m: float = 0.8,
                 lambda_g: float = 35.0, easy_margin: bool = True):
        _require_numbers("MagFace", s=s, l_a=l_a, u_a=u_a, l_m=l_m, u_m=u_m, lambda_g=lambda_g)
        if s <= 0:
            raise MarginParameterError("s", f"MagFace scale s must be positive, got {s}")
        if l_a <= 0:
            raise MarginParameterError("l_a", f"MagFace l_a (the smallest norm) must be positive, got {l_a}")
        if u_a <= l_a:
            raise MarginParameterError("u_a", f"MagFace u_a must be above l_a ({l_a}), got {u_a}")
        if l_m < 0:
            raise MarginParameterError("l_m", f"MagFace l_m must be >= 0, got {l_m}")
        if u_m < l_m:
            raise MarginParameterError("u_m", f"MagFace u_m must be at least l_m ({l_m}), got {u_m}")
        if lambda_g < 0:
            raise MarginParameterError("lambda_g", f"MagFace lambda_g must be >= 0, got {lambda_g}")
        self.s, self.l_a, self.u_a, self.l_m, self.u_m = float(s), float(l_a), float(u_a), float(l_m), float(u_m)
        self.lambda_g, self.easy_margin = float(lambda_g), bool(easy_margin)
        self.slope = (self.u_m - self.l_m) / (self.u_a - self.l_a)

    def __repr__(self) -> str:
        return (f"MagFaceMargin(s={self.s}, a in [{self.l_a}, {self.u_a}], m in [{self.l_m}, {self.u_m}], "
                f"lambda_g={self.lambda_g}{'' if self.easy_margin else ', easy_margin=False'})")

    def min_lambda_g(self) -> float:
        """The smallest lambda_g for which the paper's convergence argument holds (run/trainer.py:95-100 prints
        it: s * k * u_a^2 * l_a^2 / (u_a^2 - l_a^2), k the margin's slope); 22.6 with the defaults."""
        return self.s * self.slope * self.u_a ** 2 * self.l_a ** 2 / (self.u_a ** 2 - self.l_a ** 2)

    def _branches(self, cos_t, norms):
        """(c, theta, m(a), whether the margined branch applies, whether a is inside [l_a, u_a])."""
        cos_t = np.asarray(cos_t, dtype=np.float64)
        norms = np.asarray(norms, dtype=np.float64)
        if norms.shape != cos_t.shape or norms.ndim != 1:
            raise ValueError(f"MagFace needs one norm per target cosine, got {norms.shape} and {cos_t.shape}")
        a = np.clip(norms, self.l_a, self.u_a)
        inside = (norms >= self.l_a) & (norms <= self.u_a)
        margin = self.slope * (a - self.l_a) + self.l_m
        c = np.clip(cos_t, -1.0, 1.0)
        with np.errstate(invalid="ignore"):
            theta = np.arccos(c)
            margined = c > 0 if self.easy_margin else c > np.cos(math.pi - margin)
        return cos_t, c, theta, margin, margined, a, inside

    def target_logit(self, cos_t: np.ndarray, norms: np.ndarray) -> "tuple[np.ndarray, np.ndarray]":
        cos_t, c, theta, margin, margined, _, _ = self._branches(cos_t, norms)
        other = c if self.easy_margin else c - margin * np.sin(math.pi - margin)
        f = np.where(margined, np.cos(theta + margin), other)
        grad = np.where(margined, np.sin(theta + margin) / np.maximum(np.sin(theta), _MIN_SIN), 1.0)
        return self._scaled(cos_t, f, grad)

    def norm_terms(self, cos_t: np.ndarray, norms: np.ndarray) -> "tuple[np.ndarray, np.ndarray, np.ndarray]":
        """(lambda_g * g(a), its derivative in |x|, d f_t / d |x|), each (N,) float64; the derivatives are zero
        where the clamp of a binds."""
        _, _, theta, margin, margined, a, inside = self._branches(cos_t, norms)
        penalty = self.lambda_g * (a / self.u_a ** 2 + 1.0 / a)
        dpenalty = np.where(inside, self.lambda_g * (1.0 / self.u_a ** 2 - 1.0 / a ** 2), 0.0)
        if self.easy_margin:
            dmargin = np.where(margined, -np.sin(theta + margin), 0.0)
        else:
            # the fallback s * (c - m sin(pi - m)) = s * (c - m sin m) also depends on m
            dmargin = np.where(margined, -np.sin(theta + margin), -(np.sin(margin) + margin * np.cos(margin)))
        df_t = np.where(inside, self.s * dmargin * self.slope, 0.0)
        return penalty, dpenalty, df_t


class CurricularFaceMargin(Margin):
    """CurricularFace (Huang et al. 2020), following the official HuangYG123/CurricularFace head/metrics.py
    (class CurricularFace, commit 68c8727, lines cited below), with t over the GLOBAL batch.

    For every row, c = clip(cos_t, -1, 1) (metrics.py:89), theta = arccos(c):
      t = t_alpha * mean(c) + (1 - t_alpha) * t      over the global batch, t starting at 0, updated BEFORE use,
                                                     no gradient (metrics.py:82, 100-101; t_alpha 0.01 there,
                                                     Tencent/TFace's port uses 0.1)
      hard negatives: non-target cells with cos > cos(theta + m) (the raw formula even past pi - m,
                      metrics.py:95-96) enter as cos * (t + cos), derivative t + 2 cos (metrics.py:102)
      f_t = s * cos(theta + m)  where c > cos(pi - m),  s * (c - m * sin(m)) elsewhere   (metrics.py:97)
    The target cell is never modulated (metrics.py:103 overwrites it). The official head takes t from one
    process's batch; here every rank has every row's target cosine (collective "pfc.target_cos" before the
    log-sum-exp), as Tencent/TFace's distributed CurricularFace does, so t is the global batch's and the same
    on every rank. state() is {"t": t}.
    """

    KIND = 4.0
    PARAM_NAMES = ("s", "m", "t_alpha")
    CONFIG_PREFIX = "curricular"
    CONFIG_HELP = {
        "m": "CurricularFace's additive angular margin m (--loss curricularface).",
        "t_alpha": "CurricularFace's momentum of t, the running mean target cosine (0.01 in the official code, "
                   "0.1 in Tencent/TFace's) (--loss curricularface).",
    }
    HARD_NEGATIVES = True

    def __init__(self, s: float = 64.0, m: float = 0.5, t_alpha: float = 0.01):
        _require_numbers("CurricularFace", s=s, m=m, t_alpha=t_alpha)
        if s <= 0:
            raise MarginParameterError("s", f"CurricularFace scale s must be positive, got {s}")
        if not 0.0 <= m < math.pi:
            raise MarginParameterError("m", f"CurricularFace margin m must be in [0, pi), got {m}")
        if not 0.0 < t_alpha <= 1.0:
            raise MarginParameterError("t_alpha", f"CurricularFace t_alpha must be in (0, 1], got {t_alpha}")
        self.s, self.m, self.t_alpha = float(s), float(m), float(t_alpha)
        self.t = 0.0
        self.fallback_limit = math.cos(math.pi - self.m)      # metrics.py:79
        self.fallback_shift = math.sin(math.pi - self.m) * self.m    # metrics.py:80

    def __repr__(self) -> str:
        return f"CurricularFaceMargin(s={self.s}, m={self.m}, t_alpha={self.t_alpha}; t={self.t:.6g})"

    def state(self) -> dict:
        return {"t": self.t}

    def load_state(self, state: dict) -> None:
        t = state.get("t") if set(state) == {"t"} else None
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise ValueError(f"CurricularFace state must be {{'t': a finite number}}, got {quoted(state)}")
        self.t = float(t)

    def hard_negatives(self, cos_t: np.ndarray) -> "tuple[np.ndarray, float]":
        """(each row's hard-negative threshold cos(theta + m) (N,), t), t updated first from the rows' target
        cosines (N,), the global batch's."""
        c = np.clip(np.asarray(cos_t, dtype=np.float64), -1.0, 1.0)
        self.t = self.t_alpha * float(c.mean()) + (1.0 - self.t_alpha) * self.t
        with np.errstate(invalid="ignore"):
            threshold = c * math.cos(self.m) - np.sqrt(1.0 - c * c) * math.sin(self.m)
        return threshold, self.t

    def target_logit(self, cos_t: np.ndarray, norms: "np.ndarray | None" = None) -> "tuple[np.ndarray, np.ndarray]":
        cos_t = np.asarray(cos_t, dtype=np.float64)
        c = np.clip(cos_t, -1.0, 1.0)
        with np.errstate(invalid="ignore"):
            theta = np.arccos(c)
            margined = c > self.fallback_limit
        f = np.where(margined, np.cos(theta + self.m), c - self.fallback_shift)
        grad = np.where(margined, np.sin(theta + self.m) / np.maximum(np.sin(theta), _MIN_SIN), 1.0)
        return self._scaled(cos_t, f, grad)


class SubCenterArcFace(CombinedMarginLoss):
    """Sub-center ArcFace (Deng et al. 2020), following insightface's recognition/subcenter_arcface (commit
    7fadd42; train_parall.py lines 120-178, sample_config.py line 31): K centers per class (K = 3), rows
    class-major (row c * K + k), a class's cosine the largest over its K sub-centers (taken BEFORE the margin,
    for every class), then ArcFace's margin (s = 64, m = 0.5) on the target's with no fallback past pi - m
    (train_parall.py:149-171 has none). The gradient of a class's cosine goes to the sub-center that gave it.
    The head keeps a class's K rows on the rank that owns the class (memory_bank.py).
    """

    KIND = 5.0
    PARAM_NAMES = ("s", "m1", "m2", "m3", "subcenters")
    CONFIG_PREFIX = "margin"
    CONFIG_FIELDS = {"subcenters": "subcenter_k"}
    CONFIG_HELP = {**CombinedMarginLoss.CONFIG_HELP,
                   "subcenters": "Sub-center ArcFace's centers per class K; the memory bank holds K rows per class "
                                 "(--loss subcenter-arcface, which also takes margin_m1..m3)."}

    def __init__(self, s: float = 64.0, m1: float = 1.0, m2: float = 0.5, m3: float = 0.0, subcenters: int = 3):
        if isinstance(subcenters, bool) or not isinstance(subcenters, (int, np.integer)) or not 1 <= subcenters <= 64:
            raise MarginParameterError("subcenters", f"sub-center ArcFace's subcenters (K) must be an integer in "
                                                     f"[1, 64], got {subcenters!r}")
        super().__init__(s, m1, m2, m3, fallback=False)
        self.subcenters = int(subcenters)

    def __repr__(self) -> str:
        return f"SubCenterArcFace(K={self.subcenters}, s={self.s}, m1={self.m1}, m2={self.m2}, m3={self.m3})"


# The losses by name, the one table of them (the trainer's --loss presets are built from it):
# name: (margin class, the parameters that differ from the class's defaults, which are the published ones).
LOSSES = {
    "arcface": (CombinedMarginLoss, {}),
    "cosface": (CombinedMarginLoss, dict(m2=0.0, m3=0.4)),
    "combined": (CombinedMarginLoss, dict(m2=0.3, m3=0.2)),
    # CosFace with half the scale and margin: starts learning within a few hundred steps on
    # 10^3 classes, where s = 64, m = 0.4 stays at chance that long (the synthetic default)
    "cosface-small": (CombinedMarginLoss, dict(s=32.0, m2=0.0, m3=0.2)),
    "adaface": (AdaFaceMargin, {}),
    # ElasticFace's config/config.py: std 0.05 (arc, cos), 0.0175 (arc+), 0.02 (cos+); m 0.5 (arc), 0.35 (cos)
    "elasticface-arc": (ElasticFaceMargin, {}),
    "elasticface-arc+": (ElasticFaceMargin, dict(std=0.0175, plus=True)),
    "elasticface-cos": (ElasticFaceMargin, dict(m=0.35, angular=False)),
    "elasticface-cos+": (ElasticFaceMargin, dict(m=0.35, std=0.02, angular=False, plus=True)),
    "magface": (MagFaceMargin, {}),
    "curricularface": (CurricularFaceMargin, {}),
    "subcenter-arcface": (SubCenterArcFace, {}),
}


def preset_params(name: str) -> dict:
    """Every constructor parameter of loss `name` (LOSSES), the class's defaults filled in."""
    kind, params = LOSSES[name]
    defaults = {p.name: p.default for p in inspect.signature(kind).parameters.values()}
    return {**defaults, **params}


def config_params(kind: type) -> "tuple[str, ...]":
    """The parameters of margin class `kind` that are the trainer's configuration fields."""
    return getattr(kind, "CONFIG_PARAMS", kind.PARAM_NAMES)


def config_field(kind: type, param: str) -> str:
    """The trainer's configuration field of parameter `param` of margin class `kind`."""
    return "margin_s" if param == "s" else kind.CONFIG_FIELDS.get(param, f"{kind.CONFIG_PREFIX}_{param}")


SCALE_HELP = "Scale s of the logits (the norm the cosines are multiplied by), for every loss."


@dataclass(frozen=True)
class ConfigField:
    """A margin parameter as a field of the trainer's configuration (and an option of its --help)."""
    type: str               # the constructor's annotation: 'float' or 'int'
    default: "float | int"  # the constructor's default: the published value
    help: str


def config_fields() -> "dict[str, ConfigField]":
    """Every configuration field of a margin parameter, by name, in the order of LOSSES' classes; a field that
    classes share (margin_s, margin_m1..m3) is stated by the first (test_loss_presets: they agree)."""
    found = {}
    for kind, _ in LOSSES.values():
        signature = inspect.signature(kind).parameters
        for param in config_params(kind):
            field = config_field(kind, param)
            if field not in found:
                found[field] = ConfigField(signature[param].annotation, signature[param].default,
                                           SCALE_HELP if param == "s" else kind.CONFIG_HELP[param])
    return found


def make_margin(name: str, **params) -> Margin:
    """The margin of loss `name` (LOSSES), `params` replacing its preset's values."""
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; choose one of {', '.join(LOSSES)}")
    kind, _ = LOSSES[name]
    return kind(**{**preset_params(name), **params})
