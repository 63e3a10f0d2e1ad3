"""The most similar classes of another set, by the cosine of their centers, without gathering the centers.

Each rank holds a shard of set A's centers and a shard of set B's (the heads' memory banks, rows of
their own classes). For each of its A classes it finds the k B classes of highest cosine, over every
rank's B shard: in turn, each rank broadcasts its B shard in blocks of at most `block_rows` rows, and
every rank compares its A rows with the block in hand, keeping a running top k. No rank holds more than
one block of another rank's centers at a time; every B row crosses the network once (W broadcasts of
its shard), and the work is |A| x |B| x D multiply-adds split over the ranks (docs/DESIGN.md 2.14).
"""
from __future__ import annotations

from typing import Callable

import mxnet as mx
import numpy as np

from mxnet_pfc.runtime import comm
from mxnet_pfc.runtime.vectors import unit_rows


def merge_top(best_cos: np.ndarray, best_id: np.ndarray, cos: np.ndarray, ids: np.ndarray, k: int):
    """The k largest of (best, new) per row, by cosine then by the lower class id, in decreasing order."""
    all_cos = np.concatenate([best_cos, cos], axis=1)
    all_id = np.concatenate([best_id, np.broadcast_to(ids, cos.shape)], axis=1)
    order = np.lexsort((all_id, -all_cos), axis=1)[:, :k]
    return np.take_along_axis(all_cos, order, 1), np.take_along_axis(all_id, order, 1)


SCORE_BYTES = 64 << 20      # of cosines computed at once: A rows are taken in chunks of this many bytes' worth
SAMPLE = 2048               # a block's first columns whose k-th best bounds which of its cosines are looked at


def merge_candidates(best_cos: np.ndarray, best_id: np.ndarray, cos: np.ndarray, first_id: int, k: int):
    """merge_top of (best, a chunk of cosines whose columns are the ids first_id, first_id + 1, ...), looking only
    at the cosines that can enter a row's top k: those at least the k-th best so far, or at least the k-th
    best of the chunk's first SAMPLE columns (the k-th best of the union is at least either). Comparing and
    picking them is a fraction of the cost of a top k over every column (argpartition: twice the product)."""
    n, columns = cos.shape
    bar = best_cos[:, -1].copy()
    if min(columns, SAMPLE) > k:
        sample = min(columns, SAMPLE)
        bar = np.maximum(bar, np.partition(cos[:, :sample], sample - k, axis=1)[:, sample - k])
    row, column = np.nonzero(cos >= bar[:, None])
    rows = np.concatenate([np.repeat(np.arange(n), k), row])
    all_cos = np.concatenate([best_cos.ravel(), cos[row, column]])
    all_id = np.concatenate([best_id.ravel(), column + first_id])
    order = np.lexsort((all_id, -all_cos, rows))         # by row, then best first, ties to the lower id
    rows = rows[order]
    keep = np.arange(len(rows)) - np.searchsorted(rows, rows) < k     # each row's first k (it has at least k)
    return all_cos[order][keep].reshape(n, k), all_id[order][keep].reshape(n, k)


def block_top(a: mx.nd.NDArray, block: mx.nd.NDArray, take: int) -> "tuple[np.ndarray, np.ndarray | None]":
    """(cosines, their rows in the block) of the `take` best block rows for each row of `a`, computed on a's
    context; every row (None) when `take` is the whole block."""
    cos = mx.nd.dot(a, block, transpose_b=True)
    if take == block.shape[0]:
        return cos.asnumpy(), None          # a host sync point, as every block's is
    values, rows = mx.nd.topk(cos, axis=1, k=take, ret_typ="both", dtype="int64")
    return values.asnumpy(), rows.asnumpy()


def most_similar(local_a: np.ndarray, local_b: np.ndarray, b_start: int, k: int, block_rows: int = 65536,
                 progress: "Callable[[int], None] | None" = None,
                 ctx: "mx.Context | None" = None) -> "tuple[np.ndarray, np.ndarray]":
    """(cosines (n_a, k), B class ids (n_a, k)) of this rank's A rows' k most similar B classes, best first.

    Collective: every rank calls it, with its own shards; `b_start` is the class id of local_b's first row
    (B's shards are contiguous and in rank order, as the memory banks hold them). Fewer than k B classes in
    all: the missing places hold cosine -inf and id -1. Each block is compared with the A rows a chunk at a
    time (SCORE_BYTES of cosines). With `ctx` (a GPU), the products and each chunk's top k are computed there
    (the blocks still travel through host memory); without, by NumPy."""
    a = unit_rows(local_a, np.float32)
    width = a.shape[1]
    a_on_ctx = mx.nd.array(a, ctx=ctx) if ctx is not None and len(a) else None
    shards = [(int(n), int(s)) for n, s in comm.gather_rows([len(local_b), b_start])]
    best_cos = np.full((len(a), k), -np.inf, dtype=np.float32)
    best_id = np.full((len(a), k), -1, dtype=np.int64)
    mine = unit_rows(local_b, np.float32)
    for owner, (count, start) in enumerate(shards):
        for first in range(0, count, block_rows):
            rows = min(block_rows, count - first)
            block = mine[first:first + rows] if owner == comm.rank() else np.zeros((rows, width), np.float32)
            block = comm.broadcast(mx.nd.array(block, dtype="float32"), root_rank=owner,
                                   name=f"search.{owner}.{first}")
            if a_on_ctx is not None:
                block_on_ctx = block.as_in_context(ctx)
            else:
                block = block.asnumpy()         # the products by NumPy: the block on the host
            step = max(1, SCORE_BYTES // (4 * rows))
            for lo in range(0, len(a), step):
                hi = min(lo + step, len(a))
                if a_on_ctx is not None:
                    cos, part = block_top(a_on_ctx[lo:hi], block_on_ctx, min(k, rows))
                    ids = part + start + first if part is not None else np.broadcast_to(
                        np.arange(start + first, start + first + rows), cos.shape)
                    best_cos[lo:hi], best_id[lo:hi] = merge_top(best_cos[lo:hi], best_id[lo:hi], cos, ids, k)
                else:
                    best_cos[lo:hi], best_id[lo:hi] = merge_candidates(best_cos[lo:hi], best_id[lo:hi],
                                                                       a[lo:hi] @ block.T, start + first, k)
            if progress is not None:
                progress(rows)
    return best_cos, best_id
