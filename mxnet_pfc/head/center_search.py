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


def most_similar(local_a: np.ndarray, local_b: np.ndarray, b_start: int, k: int, block_rows: int = 65536,
                 progress: "Callable[[int], None] | None" = None) -> "tuple[np.ndarray, np.ndarray]":
    """(cosines (n_a, k), B class ids (n_a, k)) of this rank's A rows' k most similar B classes, best first.

    Collective: every rank calls it, with its own shards; `b_start` is the class id of local_b's first row
    (B's shards are contiguous and in rank order, as the memory banks hold them). Fewer than k B classes in
    all: the missing places hold cosine -inf and id -1."""
    a = unit_rows(local_a, np.float32)
    width = a.shape[1]
    shards = [(int(n), int(s)) for n, s in comm.gather_rows([len(local_b), b_start])]
    best_cos = np.full((len(a), k), -np.inf, dtype=np.float32)
    best_id = np.full((len(a), k), -1, dtype=np.int64)
    mine = unit_rows(local_b, np.float32)
    for owner, (count, start) in enumerate(shards):
        for first in range(0, count, block_rows):
            rows = min(block_rows, count - first)
            block = mine[first:first + rows] if owner == comm.rank() else np.zeros((rows, width), np.float32)
            block = comm.broadcast(mx.nd.array(block, dtype="float32"), root_rank=owner,
                                   name=f"search.{owner}.{first}").asnumpy()
            cos = a @ block.T
            take = min(k, rows)
            if take < rows:             # the block's own top k first: the merge then sorts 2k per row
                part = np.argpartition(-cos, take - 1, axis=1)[:, :take]
                cos, ids = np.take_along_axis(cos, part, 1), part + start + first
            else:
                ids = np.broadcast_to(np.arange(start + first, start + first + rows), cos.shape)
            best_cos, best_id = merge_top(best_cos, best_id, cos, ids, k)
            if progress is not None:
                progress(rows)
    return best_cos, best_id
