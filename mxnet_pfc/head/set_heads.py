"""Several training sets under one backbone: one Partial FC head per set, their losses weighted and summed.

Each rank's batch is the concatenation of a fixed number of rows of each set
(rows[s], the same on every rank), in set order; set s's labels are ids of its
own classes, 0 .. num_classes_s - 1. Head s, with its own class range sharded
over every rank, its own sample rate and memory bank, takes its set's rows of
the global batch (rows[s] x world rows) through the exact step of
partial_fc.py. The loss is sum_s weight_s x L_s, L_s the mean loss of set s's
rows; the embedding gradient is each head's, scaled by its weight, in the
batch's row order; each head's centers move by its own SGD (the weight scales
the gradient its centers get too: d(weight_s x L_s) / d w). docs/DESIGN.md
section 2.13 derives it and says why the weight reaches the centers.
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

from mxnet_pfc.head.partial_fc import PartialFC

nd = mx.nd


class SetHeads:
    """The heads of several sets over one batch, called as one PartialFC is (forward_backward, lr)."""

    def __init__(self, heads: "list[PartialFC]", rows: "list[int]", weights: "list[float] | None" = None):
        weights = [1.0] * len(heads) if weights is None else [float(w) for w in weights]
        if not heads or len(rows) != len(heads) or len(weights) != len(heads):
            raise ValueError(f"{len(heads)} heads, {len(rows)} row counts and {len(weights)} weights: one each per set")
        if any(int(n) != n or n < 1 for n in rows):
            raise ValueError(f"rows per set {rows}: every set needs at least one row of each rank's batch")
        if any(not np.isfinite(w) or w <= 0 for w in weights):
            raise ValueError(f"set weights {weights}: each must be a positive finite number")
        self.heads, self.rows, self.weights = list(heads), [int(n) for n in rows], weights
        self.set_losses = [float("nan")] * len(heads)     # each set's mean loss over the last step's micro-batches
        self._step_losses: "list[list[float]]" = []
        for head, weight in zip(self.heads, self.weights):
            head.loss_weight = weight        # scales the embeddings' gradient and the centers'

    def __repr__(self) -> str:
        return "; ".join(f"set {number}: {head}, {rows} rows of each rank's batch, loss weight {weight:g}"
                         for number, (head, rows, weight) in enumerate(zip(self.heads, self.rows, self.weights)))

    @property
    def embedding_size(self) -> int:
        return self.heads[0].embedding_size

    @property
    def batch_rows(self) -> int:
        """Rows of each rank's batch: the sets' rows together."""
        return sum(self.rows)

    @property
    def lr(self) -> float:
        return self.heads[0].lr

    @lr.setter
    def lr(self, value: float) -> None:
        for head in self.heads:
            head.lr = value

    def forward_backward(self, local_embeddings, local_labels, micro_batches: int = 1,
                         update: bool = True) -> "tuple[float, nd.NDArray]":
        """(sum_s weight_s x L_s, its gradient for local_embeddings); each head's SGD as in PartialFC
        (held under update=False, micro_batches as there). Rows: set 0's rows[0], then set 1's, ..."""
        if local_embeddings.shape[0] != self.batch_rows:
            raise ValueError(f"a batch of {local_embeddings.shape[0]} rows on this rank; the sets give "
                             f"{' + '.join(map(str, self.rows))} = {self.batch_rows}")
        labels = np.asarray(local_labels.asnumpy() if isinstance(local_labels, nd.NDArray) else local_labels)
        total, grads, start, losses = 0.0, [], 0, []
        for head, count, weight in zip(self.heads, self.rows, self.weights):
            loss, grad = head.forward_backward(local_embeddings[start:start + count], labels[start:start + count],
                                               micro_batches, update)
            total += weight * loss
            grads.append(grad)
            losses.append(loss)
            start += count
        self._step_losses.append(losses)
        if update:          # the step's last micro-batch
            self.set_losses = [float(v) for v in np.mean(self._step_losses, axis=0)]
            self._step_losses = []
        return total, nd.concat(*grads, dim=0)


def heads_of(head: "PartialFC | SetHeads") -> "list[PartialFC]":
    """The heads of a run's sets, set 0 first: a SetHeads' heads, or a single PartialFC."""
    return list(head.heads) if isinstance(head, SetHeads) else [head]
