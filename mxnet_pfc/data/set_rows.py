"""How a batch is split between several training sets: each set's rows of every rank's batch.

Without MXNet, so that the planner (mxnet_pfc/plan.py) sizes each set's head as the trainer will
(data/iterators.SetsIter reads them; head/set_heads.py trains them).
"""
from __future__ import annotations

import numpy as np

from mxnet_pfc.data.errors import DataError


def rows_per_set(batch_size: int, sizes: "list[int]", shares: "list[float] | None" = None) -> "list[int]":
    """Each set's rows of a rank's batch of `batch_size`: in proportion to `shares` (default: the sets' sizes),
    rounded by largest remainder so that they sum to batch_size, at least 1 each."""
    shares = [float(n) for n in (sizes if shares is None else shares)]
    if len(shares) != len(sizes) or any(not np.isfinite(v) or v <= 0 for v in shares):
        raise DataError(f"set shares {shares}: one positive number per set ({len(sizes)})")
    if batch_size < len(sizes):
        raise DataError(f"a batch of {batch_size} per rank cannot hold a row of each of {len(sizes)} sets")
    exact = [batch_size * v / sum(shares) for v in shares]
    rows = [max(1, int(x)) for x in exact]
    while sum(rows) > batch_size:           # the floors of 1 took rows: from the set furthest above its share
        rows[max((i for i in range(len(rows)) if rows[i] > 1), key=lambda i: rows[i] - exact[i])] -= 1
    while sum(rows) < batch_size:           # largest remainder
        rows[max(range(len(rows)), key=lambda i: exact[i] - rows[i])] += 1
    return rows
