"""Rows of vectors scaled to length 1: the one rule the head's searches and the data's cleaning share."""
from __future__ import annotations

import numpy as np


def unit_rows(rows: np.ndarray, dtype=np.float64) -> np.ndarray:
    """`rows` (..., D) scaled to length 1 in `dtype`; a zero row stays zero (its cosine with anything is 0)."""
    rows = np.asarray(rows, dtype=dtype)
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    return rows / np.where(norms > 0, norms, 1)
