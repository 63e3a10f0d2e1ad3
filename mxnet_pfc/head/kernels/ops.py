"""The head's memory-bound steps behind one interface (HeadOps): fused C++ CPU kernels or MXNet ops.

Both implementations are checked against the same float64 reference.
`head_ops(ctx)` picks the fused kernels for CPU contexts when they build (g++
and the lib_api.h that ships with mxnet; build.py), and the MXNet op
compositions otherwise (GPU contexts, no compiler, or MXNET_PFC_KERNELS=0).

docs/DESIGN.md sections 2.3-2.6 give the math each step computes, 2.9 the NaN handling.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from mxnet_pfc.head.kernels.build import load_fused

nd = mx.nd


@dataclass(frozen=True)
class HardNegatives:
    """CurricularFace's modulation of hard negatives (docs/DESIGN.md 2.12): a non-target cell of row i whose scaled
    logit L = s * cos exceeds threshold[i] (scaled units, (N,) float32 on the step's context) enters the softmax
    as L * (t + L / s) = s * cos * (t + cos); its derivative in cos is s * (t + 2 cos)."""
    t: float
    threshold: nd.NDArray
    s: float


class HeadOps(ABC):
    """The memory-bound steps of one head step, as both implementations do them.

    Arrays are float32 NDArrays on one context (index and target int32). Each
    method says what it writes in place and what it returns; an argument it
    does not name is only read. `index` is sorted and unique (the sampler's); the fused kernels check it,
    the targets and the sub-center winners before touching a row (a bad one: an MXNetError naming the op and
    the index).
    """

    name: str

    @abstractmethod
    def inv_norm(self, weight):
        """Returns 1 / |weight[r]| for every row r (R,)."""

    @abstractmethod
    def logits(self, xh, weight, index, out):
        """Writes xh . weight[index]^T (cos * |w|, N x S) into `out`; returns (out, 1 / |weight[index]| (S,))."""

    @abstractmethod
    def scale_lse(self, logits, col_scale, target, mask, threshold=None, hard=None):
        """Scales `logits` (N, S) in place by col_scale (S,) per column; returns (logits, lse_others, target_scos),
        each (N,): the row's log-sum-exp over its columns other than the target (all columns where mask is 0;
        -1e30 for a row with no column left) and the target's scaled logit, unmargined (0 where mask is 0). The
        margin is the host's (docs/DESIGN.md 2.3-2.4). threshold (scaled units) or None: inter-class filtering of
        the non-target columns (2.10); hard (HardNegatives) or None: their modulation (2.12); not both."""

    @abstractmethod
    def softmax_grad(self, logits, lse, inv_norm, target, mask, target_grad, s, n, threshold=None, hard=None):
        """Returns (grad, b): grad (N, S) = d loss / d cos * inv_norm, the target cells set to target_grad where
        mask is 1, and b (S,) = sum_i grad[i, j] * cos[i, j] (docs/DESIGN.md 2.5). `logits` is consumed: it may
        hold grad afterwards (the fused kernel writes it there), so use only the returned grad. threshold and
        hard: as for scale_lse."""

    @abstractmethod
    def sgd_rows(self, weight, mom, grad, coef, index, lr, momentum, wd):
        """Momentum SGD of the rows `index` of weight and mom (R, D), in place; returns None. With row k's gradient
        g = grad[k] - coef[k] * w (the radial term), w = weight[index[k]]: mom = momentum * mom - lr * (g + wd * w),
        w += mom (docs/DESIGN.md 2.6); other rows stay. `grad` (S, D) is scratch: it may be overwritten (the MXNet
        ops subtract the radial term there)."""

    @abstractmethod
    def center_step(self, grad, xh, coef, index, weight, mom, lr, momentum, wd):
        """Returns the embeddings' gradient grad . weight[index] (N, D), with the centers before the update, and
        does sgd_rows with the centers' gradient grad^T . xh (S, D): weight and mom rows `index` change in
        place. grad (N, S) is the output of softmax_grad."""

    @abstractmethod
    def subcenter_pool(self, logits, inv_norm, K, out):
        """Sub-center ArcFace's pooling (docs/DESIGN.md 2.12). logits (N, S * K) = cos * |w| of K rows per class,
        class-major, inv_norm (S * K,) their 1 / |w|. Writes into out = (cos (N, S) float32, winner (N, S) int32)
        and returns them: cos[i, c] = max_k logits[i, c*K + k] * inv_norm[c*K + k], winner[i, c] the k that gave
        it; a tie goes to the first of the tied rows (torch.max's index), a NaN to the first NaN (it wins over
        every number, so that the loss check sees it)."""

    @abstractmethod
    def subcenter_route(self, logits, inv_norm, winner, grad):
        """Sub-center ArcFace's routing (docs/DESIGN.md 2.12): returns (grad_rows (N, S * K), radial (S * K,)) from
        the classes' gradient grad (N, S) = d loss / d cos (softmax_grad with inv_norm 1) and subcenter_pool's
        inputs and winner. grad_rows[i, c*K + k] = grad[i, c] * inv_norm[c*K + k] where k = winner[i, c], else
        0: the gradient for cos * |w| of the rows, as center_step takes it; radial[r] = inv_norm[r] * sum_i
        grad_rows[i, r] * logits[i, r] * inv_norm[r], the rows' radial coefficients. `logits` is consumed (the
        fused kernel writes grad_rows there), so use only the returned grad_rows."""


def head_ops(ctx: mx.Context, fused: "bool | None" = None) -> HeadOps:
    """FusedOps on CPU when they load (or when fused=True), else MXNetOps."""
    if fused is None:
        fused = ctx.device_type == "cpu" and load_fused()
    elif fused and not (ctx.device_type == "cpu" and load_fused()):
        raise RuntimeError("fused kernels requested but unavailable for " + str(ctx))
    return FusedOps() if fused else MXNetOps()


def take_rows(weight: nd.NDArray, index: nd.NDArray) -> nd.NDArray:
    """weight[index]; the array itself (no copy) when index, sorted and unique, holds every row."""
    return weight if index.shape[0] == weight.shape[0] else nd.take(weight, index)


def set_rows(table: nd.NDArray, index: nd.NDArray, values: nd.NDArray) -> None:
    """table[index] = values in place, along the first axis (for repeated indices one value wins)."""
    nd._internal._scatter_set_nd(lhs=table, rhs=values, indices=index.reshape((1, -1)), shape=table.shape,
                                 out=table)


def center_gradients(grad: nd.NDArray, xh: nd.NDArray, weight: nd.NDArray, index: nd.NDArray):
    """(rows, grad . rows, grad^T . xh) for the centers `index` of weight, as MXNet products: the
    embeddings' gradient and the centers' gradient without its radial term (docs/DESIGN.md section 2.5)."""
    rows = take_rows(weight, index)
    return rows, nd.dot(grad, rows), nd.dot(grad, xh, transpose_a=True)


def _filtered(logits: nd.NDArray, threshold: float) -> nd.NDArray:
    """1 where inter-class filtering applies: above the threshold and finite (NaN compares
    false; +Inf is kept so that the loss check sees it, as in the fused kernels)."""
    return (logits > threshold) * (logits < np.inf)


def _filter_attrs(threshold: "float | None") -> dict:
    """The kernels' inter-class filter attribute: absent when filtering is off."""
    return {} if threshold is None else {"threshold": repr(float(threshold))}


def _hard_args(hard: "HardNegatives | None") -> "tuple[list, dict]":
    """The kernels' hard-negative input and attributes: none when the modulation is off."""
    return ([], {}) if hard is None else ([hard.threshold], {"hard_t": repr(float(hard.t)), "s": repr(float(hard.s))})


def _modulated(logits: nd.NDArray, hard: HardNegatives) -> "tuple[nd.NDArray, nd.NDArray]":
    """(the hard negatives' modulated logits L * (t + L / s), 1 where a cell is hard): the cells above their row's
    threshold and finite, as in the fused kernels (the target cells are the caller's)."""
    is_hard = _filtered(nd.broadcast_sub(logits, hard.threshold.reshape((-1, 1))), 0.0)
    value = nd.where(is_hard, logits * (hard.t + logits / hard.s), logits)
    return value, is_hard


class FusedOps(HeadOps):
    """The C++ kernels of pfc_kernels.cc (CPU)."""

    name = "fused"

    def inv_norm(self, weight):
        return nd.pfc_inv_norm(weight)

    def scale_lse(self, logits, col_scale, target, mask, threshold=None, hard=None):
        extra, attrs = _hard_args(hard)
        lse_others, target_scos = nd.pfc_scale_lse(logits, col_scale, target, mask, *extra,
                                                   **_filter_attrs(threshold), **attrs)
        return logits, lse_others, target_scos

    def softmax_grad(self, logits, lse, inv_norm, target, mask, target_grad, s, n, threshold=None, hard=None):
        extra, attrs = _hard_args(hard)
        attrs.pop("s", None)
        b = nd.pfc_softmax_grad(logits, lse, inv_norm, target, mask, target_grad, *extra, s=s, inv_n=1.0 / n,
                                **_filter_attrs(threshold), **attrs)
        return logits, b

    def sgd_rows(self, weight, mom, grad, coef, index, lr, momentum, wd):
        nd.pfc_sgd_rows(weight, mom, grad, coef, index, lr=lr, momentum=momentum, wd=wd)

    def logits(self, xh, weight, index, out):
        inv = nd.empty((index.shape[0],), ctx=weight.context)
        nd.pfc_logits(xh, weight, index, out=[out, inv])
        return out, inv

    def center_step(self, grad, xh, coef, index, weight, mom, lr, momentum, wd):
        return nd.pfc_center_step(grad, xh, coef, index, weight, mom, lr=lr, momentum=momentum, wd=wd)

    def subcenter_pool(self, logits, inv_norm, K, out):
        nd.pfc_subcenter_pool(logits, inv_norm, K=K, out=list(out))
        return out

    def subcenter_route(self, logits, inv_norm, winner, grad):
        K = logits.shape[1] // grad.shape[1]
        radial = nd.pfc_subcenter_route(logits, inv_norm, winner, grad, K=K)
        return logits, radial


class MXNetOps(HeadOps):
    """The same steps composed of MXNet operators (any context)."""

    name = "mxnet"

    def __init__(self):
        self._ones = {}

    def _ones_col(self, n, ctx):
        if (n, ctx) not in self._ones:
            self._ones[(n, ctx)] = nd.ones((n, 1), ctx=ctx)
        return self._ones[(n, ctx)]

    def inv_norm(self, weight):
        # A gemv with ones is far faster than nd.norm's reduction on CPU.
        squares = nd.dot(nd.square(weight), self._ones_col(weight.shape[1], weight.context))
        return 1.0 / nd.sqrt(squares.reshape((-1,)))

    @staticmethod
    def _set_targets(matrix, target, mask, values):
        rows = nd.arange(matrix.shape[0], ctx=matrix.context, dtype="int32")
        values = nd.where(mask, values, nd.pick(matrix, target, axis=1))
        nd._internal._scatter_set_nd(lhs=matrix, rhs=values, indices=nd.stack(rows, target),
                                     shape=matrix.shape, out=matrix)

    def scale_lse(self, logits, col_scale, target, mask, threshold=None, hard=None):
        logits = nd.broadcast_mul(logits, col_scale.reshape((1, -1)), out=logits)
        others = logits.copy()
        if threshold is not None:       # filtered cells enter the sum as logit 0
            others = nd.where(_filtered(others, threshold), nd.zeros_like(others), others)
        if hard is not None:
            others = _modulated(others, hard)[0]
        # The target cells leave the sum as -1e30, not -inf: a row whose only column is its
        # target (one sampled center) then gets log-sum-exp -1e30, as in the fused kernel,
        # where -inf would make its max shift inf - inf = NaN.
        self._set_targets(others, target, mask, nd.full(mask.shape, -1e30, ctx=mask.context))
        top = nd.max(others, axis=1)
        lse_others = top + nd.log(nd.sum(nd.exp(nd.broadcast_sub(others, top.reshape((-1, 1)))), axis=1))
        target_scos = nd.where(mask, nd.pick(logits, target, axis=1), nd.zeros_like(lse_others))
        return logits, lse_others, target_scos

    def softmax_grad(self, logits, lse, inv_norm, target, mask, target_grad, s, n, threshold=None, hard=None):
        value, is_hard = _modulated(logits, hard) if hard is not None else (logits, None)
        grad = nd.exp(nd.broadcast_sub(value, lse.reshape((-1, 1))))
        grad = nd.broadcast_mul(grad, (s / n * inv_norm).reshape((1, -1)), out=grad)
        if threshold is not None:       # a filtered cell was a constant 0: no gradient (targets set below)
            grad = nd.where(_filtered(logits, threshold), nd.zeros_like(grad), grad)
        if hard is not None:            # d (s c (t + c)) / d c = s (t + 2 c)
            grad = grad * nd.where(is_hard, hard.t + 2.0 * logits / s, nd.ones_like(logits))
        self._set_targets(grad, target, mask, target_grad)
        ones = self._ones_col(logits.shape[0], logits.context)
        b = nd.dot(grad * logits, ones, transpose_a=True).reshape((-1,)) / s
        return grad, b

    def logits(self, xh, weight, index, out):
        rows = take_rows(weight, index)
        return nd.dot(xh, rows, transpose_b=True, out=out), self.inv_norm(rows)

    def center_step(self, grad, xh, coef, index, weight, mom, lr, momentum, wd):
        rows, grad_xh, center_grad = center_gradients(grad, xh, weight, index)
        self._sgd(weight, mom, center_grad, coef, rows, index, lr, momentum, wd)
        return grad_xh

    def sgd_rows(self, weight, mom, grad, coef, index, lr, momentum, wd):
        self._sgd(weight, mom, grad, coef, take_rows(weight, index), index, lr, momentum, wd)

    @staticmethod
    def _subcenter_cos(logits, inv_norm, K):
        """The K (N, S) arrays of the rows' cosines, sub-center k's of every class in the k-th. As column slices:
        MXNet's reductions and argmax over a last axis of K are 3-10x slower on CPU."""
        per_class = nd.broadcast_mul(logits, inv_norm.reshape((1, -1))).reshape((logits.shape[0], -1, K))
        return [nd.slice_axis(per_class, axis=2, begin=k, end=k + 1).reshape(per_class.shape[:2]) for k in range(K)]

    def subcenter_pool(self, logits, inv_norm, K, out):
        each = self._subcenter_cos(logits, inv_norm, K)
        best, winner = each[0], nd.zeros_like(each[0])
        for k, value in enumerate(each[1:], start=1):
            # the kernel's rule: a larger value, or a NaN over a number; a tie keeps the earlier row
            takes = (value > best) + (value != value) * (best == best)
            best = nd.where(takes, value, best)
            winner = nd.where(takes, nd.full(winner.shape, k, ctx=winner.context), winner)
        cos, arg = out
        best.copyto(cos)
        winner.astype("int32").copyto(arg)
        return out

    def subcenter_route(self, logits, inv_norm, winner, grad):
        K = logits.shape[1] // grad.shape[1]
        winner = winner.astype("float32")
        picked = nd.stack(*[(winner == k) * grad for k in range(K)], axis=2).reshape(logits.shape)
        grad_rows = nd.broadcast_mul(picked, inv_norm.reshape((1, -1)), out=picked)
        cos_rows = nd.broadcast_mul(logits, inv_norm.reshape((1, -1)))
        ones = self._ones_col(logits.shape[0], logits.context)
        radial = nd.dot(grad_rows * cos_rows, ones, transpose_a=True).reshape((-1,)) * inv_norm   # a gemv: over rows
        return grad_rows, radial

    @staticmethod
    def _sgd(weight, mom, grad, coef, rows, index, lr, momentum, wd):
        """sgd_rows with rows = weight[index] already taken (center_step has them)."""
        grad -= nd.broadcast_mul(rows, coef.reshape((-1, 1)))
        if index.shape[0] == weight.shape[0]:     # sorted, unique, every row: a dense update
            nd.sgd_mom_update(weight, grad, mom, lr=lr, momentum=momentum, wd=wd, out=weight)
        else:
            sparse = nd.sparse.row_sparse_array((grad, index.astype("int64")), shape=weight.shape,
                                                ctx=weight.context)
            nd.sgd_mom_update(weight, sparse, mom, lr=lr, momentum=momentum, wd=wd,
                              lazy_update=True, out=weight)
