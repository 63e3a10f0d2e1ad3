"""Partial FC: class centers sharded over ranks, sampled, with an exact margin softmax.

Each rank owns a contiguous range of classes (its "memory bank": centers and
their SGD momentum). One step, for the global batch of N = B x world_size rows:

  allgather      every rank's input header, labels and embeddings  (collective 1)
                 -> every rank checks every rank's input; bad input raises everywhere
  sample         every positive center of the batch + uniform negatives
  logits         s * cos against the sampled centers; per row the log-sum-exp
                 of the non-target columns and the target's s * cos
  allgather      every rank's (lse_others, s * cos_t) per row        (collective 2)
  margin, loss   on the host, in float64, identically on every rank: each row's
                 target cosine, its margined logit f_t, the exact softmax
                 denominator over all ranks' centers, the loss
  gradients      d loss / d embeddings, allreduced over ranks       (collective 3)
  update         momentum SGD of the sampled centers only

The parts: exchange.py checks and packs the inputs of collective 1;
memory_bank.py holds this rank's centers, momentum and their SGD; sampler.py
picks the centers a step uses; this module runs the step. docs/DESIGN.md section 2 has
the math; the code below follows its names. What a caller may rely on (the call, the
state, the errors) is told in docs/head.md.

The margin is applied on the host after collective 2, not in the logits kernel:
that collective gives every rank the target cosine of every row of the global
batch, which a margin depending on the sample or on batch statistics needs (the
adaptive-margin losses), at no cost beyond the 2 x N numbers it already carried.
"""
from __future__ import annotations

import logging

import mxnet as mx
import numpy as np

from mxnet_pfc.head import exchange
from mxnet_pfc.head.exchange import PartialFCInputError
from mxnet_pfc.head.kernels.ops import HardNegatives, head_ops
from mxnet_pfc.head.margin import Margin
from mxnet_pfc.head.memory_bank import MemoryBank
from mxnet_pfc.head.sampler import CenterSampler, num_sampled_centers, shard_range
from mxnet_pfc.runtime import comm, seeding
from mxnet_pfc.runtime.errors import PfcError

__all__ = ["PartialFC", "PartialFCInputError", "NonFiniteLossError"]

nd = mx.nd
log = logging.getLogger(__name__)

_MAX_MARGIN_PARAMS = 8      # the most parameters a margin has (its as_tuple), for the cross-rank check


class Workspace:
    """Persistent buffers for a step's large arrays, reused from step to step.

    A fresh 100 MB NDArray costs tens of milliseconds in page faults on CPU
    (MXNet's CPU pools do not keep them), more than the work done in it. Each
    name owns a flat buffer that grows to the largest shape asked for; get()
    returns a contiguous view of the requested shape. Views share the buffer's
    engine variable, so MXNet orders a step's writes after the last step's reads.
    """

    def __init__(self, ctx: mx.Context):
        self.ctx = ctx
        self._flat = {}

    def get(self, name: str, shape: tuple, dtype: str = "float32") -> nd.NDArray:
        size = int(np.prod(shape))
        flat = self._flat.get(name)
        if flat is None or flat.size < size or flat.dtype != np.dtype(dtype):
            flat = self._flat[name] = nd.empty((size,), ctx=self.ctx, dtype=dtype)
        return flat[:size].reshape(shape)


class NonFiniteLossError(PfcError, FloatingPointError):
    """The loss of a step is NaN or infinite; raised on every rank before any center moves."""


def global_softmax(parts: np.ndarray, norms: np.ndarray, margin: Margin,
                   mean_over: float) -> "tuple[np.ndarray, float, np.ndarray, np.ndarray, np.ndarray | None]":
    """(lse, loss, target_coef, df_t, norm_grad), each (N,) but loss, from every rank's (lse_others, target_scos)
    rows, in float64, for every row of the global batch (the same on every rank).

    parts (W, 2, N): rank r's log-sum-exp over its non-target columns and its scaled target
    logits s * cos_t (0 on rows whose label it does not own: each row has one owner); norms (N,):
    |x| of every row's raw embedding (from the gathered batch, the same on every rank). The
    margin (called once: a margin with running statistics moves them here) gives the target
    logit f_t and d f_t / d cos_t (df_t) of every row; lse is the log-sum-exp over all ranks'
    non-target columns and f_t, the loss the mean of lse - f_t over the N rows, and
    target_coef = (p_target - 1) / mean_over: the target cell's gradient before the margin's
    derivative df_t (docs/DESIGN.md section 2.4).

    A margin whose loss depends on the norms (Margin.USES_NORM: MagFace) adds its mean penalty to
    the loss, and norm_grad is d loss / d |x| of every row (its target logit's and its penalty's
    dependence on the norm); None for the others.
    """
    parts = np.asarray(parts, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):     # non-finite input is reported by the caller
        cos_t = parts[:, 1, :].sum(axis=0) / margin.s
        f_t, df_t = margin.target_logit(cos_t, norms)
        others = parts[:, 0, :]
        top = others.max(axis=0)
        lse = np.logaddexp(top + np.log(np.exp(others - top).sum(axis=0)), f_t)
        loss = float(np.mean(lse - f_t))
        target_coef = (np.exp(f_t - lse) - 1.0) / mean_over
        norm_grad = None
        if margin.USES_NORM:
            penalty, dpenalty, df_t_dnorm = margin.norm_terms(cos_t, norms)
            loss += float(np.mean(penalty))
            norm_grad = target_coef * df_t_dnorm + dpenalty / mean_over
    return lse, loss, target_coef, df_t, norm_grad


class PartialFC:
    """The sharded classification head: sampling and the three-collective step.

    Usable from any MXNet training loop::

        pfc = PartialFC(CombinedMarginLoss(64, 1, 0.5, 0), embedding_size=512,
                        num_classes=1_000_000, sample_rate=0.1, ctx=mx.cpu())
        loss, grad = pfc.forward_backward(local_embeddings, local_labels)

    Every rank must construct it with the same arguments and call
    forward_backward in lock step (it runs collectives). Its centers live in
    `pfc.bank` (memory_bank.MemoryBank), updated by momentum SGD with the
    gradient of the mean loss over the global batch; `lr` may be changed
    between steps.
    """

    def __init__(self, margin: Margin, embedding_size: int, num_classes: int,
                 sample_rate: float = 1.0, ctx: "mx.Context | None" = None, lr: float = 0.1,
                 momentum: float = 0.9, wd: float = 5e-4, init_std: float = 0.01,
                 seed: "int | None" = None, fused_kernels: "bool | None" = None,
                 interclass_filtering_threshold: float = 0.0):
        if not isinstance(margin, Margin):
            raise TypeError(f"margin must be a Margin (margin.make_margin(name) builds one of margin.LOSSES), "
                            f"got {type(margin).__name__}")
        if int(embedding_size) != embedding_size or embedding_size < 1:
            raise ValueError(f"embedding_size must be a positive integer, got {embedding_size}")
        if int(num_classes) != num_classes or num_classes < 1:
            raise ValueError(f"num_classes must be a positive integer, got {num_classes}")
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
        if not 0.0 <= interclass_filtering_threshold <= 1.0:
            raise ValueError(f"interclass_filtering_threshold must be in [0, 1] (0: off), "
                             f"got {interclass_filtering_threshold}")
        if interclass_filtering_threshold and margin.HARD_NEGATIVES:
            raise ValueError(f"interclass_filtering_threshold ({interclass_filtering_threshold}) and {margin} both "
                             "reshape the hard negatives: use one")
        self.margin = margin
        self.embedding_size = int(embedding_size)
        self.num_classes = int(num_classes)
        self.sample_rate = float(sample_rate)
        # Inter-class filtering (Partial FC v2, docs/DESIGN.md section 2.10): a negative whose cosine
        # exceeds T counts as cosine 0.
        self.filter_threshold = float(interclass_filtering_threshold)
        # the gradients (the embeddings' and the centers') are those of loss_weight x the mean loss: a set's
        # weight when several sets train one backbone (set_heads.py); the loss returned stays unweighted
        self.loss_weight = 1.0
        self.ctx = ctx if ctx is not None else mx.cpu()

        self.rank, self.world_size = comm.rank(), comm.size()
        self._check_same_config()
        if seed is not None:        # the trainer seeds for itself (seeding.py) and passes None
            seeding.seed_generators(seed, self.rank, step=0)
        self.ops = head_ops(self.ctx, fused_kernels)   # fused C++ kernels or MXNet ops
        self.bank = MemoryBank(self.num_classes, self.embedding_size, self.rank, self.world_size, self.ctx,
                               self.ops, lr=lr, momentum=momentum, wd=wd, init_std=init_std,
                               subcenters=margin.subcenters)
        self.num_sample = num_sampled_centers(self.bank.num_local, self.sample_rate)
        self.sampler = CenterSampler(self.bank.num_local, self.num_sample, self._draw_centers)
        self.sampled_index = None     # sorted local ids of the centers used by the last step
        self.workspace = Workspace(self.ctx)

    @property
    def lr(self) -> float:
        """The centers' learning rate (the bank's), settable between steps."""
        return self.bank.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.bank.lr = float(value)

    def __repr__(self) -> str:
        bank = self.bank
        return (f"PartialFC(rank {self.rank}/{self.world_size}, classes [{bank.class_start}, "
                f"{bank.class_start + bank.num_local}) of {self.num_classes}, "
                f"{self.num_sample} sampled, D={self.embedding_size}, {self.margin}"
                + (f", inter-class filtering above cosine {self.filter_threshold:g}" if self.filter_threshold else "")
                + ")")

    def _draw_centers(self, count: int) -> np.ndarray:
        """count uniform local class ids for the sampler, from MXNet's generator on ctx (seeding.py seeds it)."""
        return nd.random.randint(0, self.bank.num_local, shape=(count,), ctx=self.ctx, dtype="int32").asnumpy()

    def _check_same_config(self) -> None:
        """All ranks must agree on the head's shape and margin, or none can run."""
        # The margin's kind, then its parameters, padded to one length (gather_rows needs it on every rank).
        params = list(self.margin.as_tuple())
        mine = [self.num_classes, self.embedding_size, self.sample_rate, self.filter_threshold,
                self.margin.KIND, *params] + [0.0] * (_MAX_MARGIN_PARAMS - len(params))
        table = comm.gather_rows(mine)
        if any(row != table[0] for row in table):
            names = ["num_classes", "embedding_size", "sample_rate", "interclass_filtering_threshold",
                     "margin kind", *self.margin.PARAM_NAMES]
            if len({row[4] for row in table}) > 1:      # other kinds: their parameters are not comparable
                names = names[:5]
            diffs = [f"{name}: " + ", ".join(f"rank {r}={row[k]:g}" for r, row in enumerate(table))
                     for k, name in enumerate(names) if len({row[k] for row in table}) > 1]
            raise PartialFCInputError("PartialFC settings differ across ranks: " + "; ".join(diffs))

    def _gather_batch(self, embeddings, labels) -> "tuple[nd.NDArray, np.ndarray]":
        """Collective 1: every rank's embeddings (on ctx) and labels (int64, host), checked;
        raises on every rank if any rank's input is bad."""
        x, y, problem = exchange.convert_inputs(embeddings, labels, self.num_classes)
        gathered = comm.allgather(exchange.pack(x, y, problem, self.num_classes, self.ctx), name="pfc.batch")
        headers, batch = exchange.unpack(gathered, self.world_size, x, problem)
        exchange.raise_if_bad(headers, self.embedding_size, self.num_classes)
        if batch is None:   # every header fine, yet the layout is not regular: a bug, not input
            raise RuntimeError(f"gathered batch of {gathered.shape[0]} values does not match the headers")
        return batch

    def forward_backward(self, local_embeddings, local_labels, micro_batches: int = 1,
                         update: bool = True) -> "tuple[float, nd.NDArray]":
        """One step: loss over the global batch, its gradient for local_embeddings, SGD on centers.

        Returns (loss, grad): loss a float equal on every rank, grad (B, D) on the
        context of local_embeddings. Raises PartialFCInputError on every rank
        when any rank's inputs are invalid.

        Gradient accumulation: with micro_batches = K, this global batch is one of
        K whose mean loss is trained, so the gradients are those of that mean (1/K
        of this batch's); with update=False the centers' gradient is held
        (MemoryBank.hold) and the centers do not move; the call with update=True
        applies every held gradient in one SGD step. Each micro-batch samples its
        own negatives. The returned loss is this global batch's mean.

        The margin is called once per call (global_softmax): a margin with running statistics
        (AdaFaceMargin) moves them once per global batch, so K times per update under
        micro_batches = K, as the official AdaFace head moves them at every forward; a step
        that raises NonFiniteLossError leaves them as they were.
        """
        if int(micro_batches) != micro_batches or micro_batches < 1:
            raise ValueError(f"micro_batches must be a positive integer, got {micro_batches}")
        caller_ctx = local_embeddings.context if isinstance(local_embeddings, nd.NDArray) else mx.cpu()
        bank = self.bank
        s = self.margin.s
        n = bank.num_local

        x_all, labels_all = self._gather_batch(local_embeddings, local_labels)     # collective 1
        N, B = x_all.shape[0], x_all.shape[0] // self.world_size

        # The labels are on the host: sample there, then copy the sampled ids, each row's
        # column of its label (0 on rows of other ranks) and its mask in one piece.
        local = labels_all - bank.class_start
        in_shard = (local >= 0) & (local < n)
        index, target = self.sampler.sample(np.where(in_shard, local, n))
        S = index.shape[0]
        rows = bank.rows_of(index) if bank.subcenters > 1 else index[:0]    # K bank rows per sampled class
        step_ids = nd.array(np.concatenate([index, np.where(in_shard, target, 0), in_shard, rows]),
                            ctx=self.ctx, dtype="int32")
        index, target, mask = step_ids[:S], step_ids[S:S + N], step_ids[S + N:S + 2 * N].astype("float32")
        rows = step_ids[S + 2 * N:] if bank.subcenters > 1 else index
        self.sampled_index = index

        # Forward. cos * |w| against every sampled center, read block by block from the bank
        # (the sampled centers are never copied out), then scaled to scos = s * cos(theta).
        inv_x = self.ops.inv_norm(x_all).reshape((-1, 1))
        xh = nd.broadcast_mul(x_all, inv_x)
        if bank.subcenters > 1:
            scos, inv_w, pooled = self._pooled_logits(xh, rows, N, S)
        else:
            scos, inv_w = bank.logits(xh, index, out=self.workspace.get("logits", (N, S)))
        # Scaled in place. Per row: lse_others, the log-sum-exp of this rank's columns other
        # than the target (the target is never subtracted from a sum holding it: that loses
        # the other terms), and target_scos, the target's s * cos, unmargined (0 on rows of
        # other ranks). With inter-class filtering a non-target column whose s * cos exceeds
        # s * T counts as 0.
        threshold = s * self.filter_threshold if self.filter_threshold > 0 else None
        margin_state = self.margin.state()
        hard = self._hard_negatives(scos, inv_w, target, mask) if self.margin.HARD_NEGATIVES else None
        scos, lse_others, target_scos = self.ops.scale_lse(scos, s * inv_w, target, mask, threshold, hard)
        # Collective 2: every rank's (lse_others, target_scos). Every rank then has the target
        # cosine of every row and computes, identically, on the host in float64 (the loss is
        # needed there anyway): the margin, and the log-sum-exp over all ranks' columns with
        # the target entered as its margined logit (the "allreduce max, allreduce sum of exp"
        # of the method in one call).
        parts = comm.allgather(nd.stack(lse_others, target_scos).reshape((1, 2, N)), name="pfc.lse").asnumpy()
        mean_over = N * micro_batches / self.loss_weight    # the samples of the mean loss being trained, / its weight
        norms = 1.0 / inv_x.asnumpy().astype(np.float64).reshape(-1)   # |x| of every row (x_all: the same everywhere)
        lse, loss_value, target_coef, df_t, norm_grad = global_softmax(parts, norms, self.margin, mean_over)
        # The loss is the same on every rank, so every rank stops here together,
        # before any center moves (and with the margin's running statistics as they were).
        if not np.isfinite(loss_value):
            self.margin.load_state(margin_state)
            self._raise_nonfinite(loss_value, parts)

        # Backward. gs = d loss / d cos, divided column-wise by |w_j|; b_j = sum_i gs_ij cos_ij.
        # The target cell: (p_t - 1) / N * df_t, times inv_w (used on this rank's target rows only).
        lse, target_grad = nd.array(np.stack([lse, target_coef * df_t]), ctx=self.ctx, dtype="float32")
        grad_t = target_grad * nd.take(inv_w, target)
        gs, b = self.ops.softmax_grad(scos, lse, inv_w, target, mask, grad_t, s, mean_over, threshold, hard)
        # The embeddings' gradient and the centers' SGD, in one pass over the sampled rows
        # (b * inv_w scales the radial term of the normalisation: grad_w_j - coef_j * w_j);
        # with update=False the centers' gradient is held for the micro-batch that updates.
        if bank.subcenters > 1:     # each class's gradient to the sub-center that gave its cosine
            gs, center_radial = self._subcenter_grad(gs, pooled)
        else:
            center_radial = b * inv_w
        grad_xh = comm.allreduce(bank.backward(rows, gs, xh, center_radial, update), op="sum",
                                 name="pfc.grad")                                  # collective 3
        mine = slice(self.rank * B, (self.rank + 1) * B)
        gxh, xh_mine = grad_xh[mine], xh[mine]
        grad_x = nd.broadcast_mul(
            gxh - nd.broadcast_mul(xh_mine, nd.sum(gxh * xh_mine, axis=1, keepdims=True)), inv_x[mine])
        if norm_grad is not None:      # d loss / d |x| along x / |x|: the radial part (MagFace)
            grad_x = grad_x + nd.broadcast_mul(xh_mine, nd.array(norm_grad[mine].reshape(-1, 1), ctx=self.ctx))
        return loss_value, grad_x.as_in_context(caller_ctx)

    def _pooled_logits(self, xh, rows, N: int, S: int):
        """Sub-center ArcFace's forward: (class cosines (N, S) as logits with 1 / |w| = 1, ones (S,),
        pooled = (the rows' cos * |w| (N, S * K), their 1 / |w| (S * K,), each class's winning sub-center (N, S))).

        The bank's rows of the sampled classes (`rows`, K each, class-major) give cos * |w|; divided by |w|, the
        largest of a class's K cosines is its cosine (the margin and the softmax see classes), and the first of
        tied ones its winner (ops.subcenter_pool, docs/DESIGN.md 2.12)."""
        K = self.bank.subcenters
        cos_rows, inv_rows = self.bank.logits(xh, rows, out=self.workspace.get("subcenter_logits", (N, S * K)))
        cos, winner = self.ops.subcenter_pool(cos_rows, inv_rows, K, out=(
            self.workspace.get("logits", (N, S)), self.workspace.get("winner", (N, S), dtype="int32")))
        return cos, nd.ones((S,), ctx=self.ctx), (cos_rows, inv_rows, winner)

    def _subcenter_grad(self, gs, pooled):
        """(the rows' gradient for cos * |w| (N, S * K), the rows' radial coefficients (S * K,)) from the classes'
        gradient gs = d loss / d cos (N, S): each class's goes to the sub-center that gave its cosine
        (ops.subcenter_route; the rows' cos * |w| in `pooled` are consumed)."""
        cos_rows, inv_rows, winner = pooled
        return self.ops.subcenter_route(cos_rows, inv_rows, winner, gs)

    def _hard_negatives(self, logits, inv_w, target, mask) -> HardNegatives:
        """The margin's hard negatives (CurricularFace) for this step, from every row's target cosine: each rank
        has those of the rows whose label it owns (cos * |w| in `logits` times 1 / |w|, 0 elsewhere); the
        collective "pfc.target_cos" sums them (N floats), then the margin updates its statistic on the host."""
        mine = nd.pick(logits, target, axis=1) * nd.take(inv_w, target) * mask
        cos_t = comm.allreduce(mine, op="sum", name="pfc.target_cos").asnumpy()
        threshold, t = self.margin.hard_negatives(cos_t)
        scaled = nd.array(self.margin.s * threshold, ctx=self.ctx, dtype="float32")
        return HardNegatives(t=t, threshold=scaled, s=self.margin.s)

    def _raise_nonfinite(self, loss: float, parts: np.ndarray) -> None:
        """Name the ranks whose class shard gave non-finite logits (the embeddings were checked on entry)."""
        finite = np.isfinite(parts).reshape(self.world_size, -1).all(axis=1)
        ranks = [r for r in range(self.world_size) if not finite[r]]
        shards = "; ".join(f"rank {r} (classes {start}..{start + count - 1})"
                           for r in ranks for start, count in [shard_range(self.num_classes, r, self.world_size)])
        where = f"non-finite logits from the centers of {shards}" if ranks else "no single shard (overflow)"
        raise NonFiniteLossError(f"the loss is {loss}: {where}; stopped before updating the centers "
                                 f"(lower the learning rate, or resume from the last checkpoint)")
