"""The input exchange of a Partial FC step (collective 1), as functions without collectives or state.

Every rank sends one flat float32 vector: a header, its labels as exact
(hi, lo) pairs, its embeddings. The allgather concatenates the ranks' vectors;
every rank then reads every rank's header and finds the same problems, so bad
input on any rank raises the same error everywhere instead of a hang or a
wrong loss. Vectors of different lengths (a wrong width, another batch size)
still gather: the header says how long each is.

Nothing here runs a collective or keeps state; `partial_fc.PartialFC` does
the allgather. The vector is built on the host (a handful of numpy
operations instead of some thirty small device operators) and, after the
gather, only the headers and labels come back to the host.
Tests simulate W ranks by concatenating W packed vectors (docs/DESIGN.md,
section 2.1).
"""
from __future__ import annotations

import mxnet as mx
import numpy as np

from mxnet_pfc.runtime.errors import PfcError

nd = mx.nd

FLOAT32_EXACT_INT = 2 ** 24   # float32 holds every integer up to this, not beyond
LABEL_SPLIT = FLOAT32_EXACT_INT   # labels travel as hi * 2^24 + lo, both exact in float32

# One rank's header: what every rank needs to check every rank's input. The
# last two fields are the lengths of the label and embedding parts that follow.
HEADER = ("problem", "rows", "width", "labels", "label_ndim", "bad_labels", "nonfinite",
          "min_hi", "min_lo", "max_hi", "max_lo", "label_values", "embedding_values")

# Problems found while converting one rank's inputs; sent as a code so that
# every rank can raise the same message.
CONVERSION_PROBLEMS = {
    1: "embeddings must be a numeric array",
    2: "labels must be integers (or floats holding integers)",
    3: "float32 labels cannot hold class ids above 2^24 = 16777216 exactly: pass int64 labels",
}


class PartialFCInputError(PfcError, ValueError):
    """Inputs of a step were invalid on at least one rank; raised on every rank."""


def split_hi_lo(labels: np.ndarray) -> np.ndarray:
    """int64 values (< 2^48) -> float32 (n, 2) pairs (hi, lo), exactly."""
    labels = np.asarray(labels, dtype=np.int64)
    hi = np.floor_divide(labels, LABEL_SPLIT)
    return np.stack([hi, labels - hi * LABEL_SPLIT], axis=1).astype(np.float32)


def join_hi_lo(pairs: np.ndarray) -> np.ndarray:
    """Inverse of split_hi_lo: float32 (n, 2) -> int64 (n,)."""
    pairs = np.asarray(pairs).astype(np.int64)
    return pairs[:, 0] * LABEL_SPLIT + pairs[:, 1]


def convert_inputs(embeddings, labels, num_classes: int):
    """(float32 embeddings, int64 labels, problem code) as host arrays; code 0 when fine.

    The inputs are read on the host: the checks, the labels and the sampler
    that follows work there in numpy, not as dozens of small device operators.
    Float labels must hold exact integers; those that do not become -1 and
    are reported as out of range by the header check.
    """
    try:
        if isinstance(embeddings, nd.NDArray):
            x = embeddings.asnumpy().astype(np.float32, copy=False)    # host sync on the embeddings
        else:
            x = np.asarray(embeddings, dtype=np.float32)
    except (TypeError, ValueError):
        return None, None, 1
    y = labels.asnumpy() if isinstance(labels, nd.NDArray) else np.asarray(labels)
    if y.dtype.kind not in "iuf":
        return x, None, 2
    if y.dtype.kind == "f" and y.dtype.itemsize <= 4 and num_classes > FLOAT32_EXACT_INT:
        return x, None, 3
    if y.dtype.kind == "f":
        whole = np.isfinite(y) & (np.floor(y) == y) & (np.abs(y) < 2.0 ** 62)
        return x, np.where(whole, y, -1).astype(np.int64), 0
    return x, y.astype(np.int64), 0


def pack(x, labels, problem: int, num_classes: int, ctx: mx.Context) -> nd.NDArray:
    """This rank's part of the gathered batch: header, labels (hi, lo), embeddings, flat float32.

    Built on the host and copied to ctx once. Input that cannot be laid out (a
    problem code, wrong dimensions, an empty batch) sends the header alone.
    """
    shape = x.shape if x is not None else ()
    label_shape = labels.shape if labels is not None else ()
    rows = shape[0] if len(shape) == 2 else -1
    width = shape[1] if len(shape) == 2 else -1
    valid = problem == 0 and len(shape) == 2 and label_shape == (rows,) and rows > 0
    header = dict.fromkeys(HEADER, 0)
    header.update(problem=problem, rows=rows, width=width, labels=label_shape[0] if len(label_shape) == 1 else -1,
                  label_ndim=len(label_shape))
    if not valid:
        return nd.array(np.array(list(header.values()), dtype=np.float32), ctx=ctx)
    (min_hi, min_lo), (max_hi, max_lo) = split_hi_lo([labels.min(), labels.max()])
    header.update(bad_labels=int(((labels < 0) | (labels >= num_classes)).sum()),
                  nonfinite=int(x.size - np.isfinite(x).sum()), min_hi=min_hi, min_lo=min_lo,
                  max_hi=max_hi, max_lo=max_lo, label_values=2 * rows, embedding_values=rows * width)
    packed = np.concatenate([np.array(list(header.values()), dtype=np.float32),
                             split_hi_lo(labels).reshape(-1), x.reshape(-1)])
    return nd.array(packed, ctx=ctx, dtype="float32")


def packed_length(x, problem: int) -> int:
    """The length of this rank's packed vector when its input converted to a 2-D batch, else -1."""
    if problem or x is None or x.ndim != 2:
        return -1
    return len(HEADER) + 2 * x.shape[0] + x.size


def _values_after(header: list) -> int:
    """How many values follow a header in its rank's vector: its labels and embeddings."""
    fields = dict(zip(HEADER, header))
    return int(fields["label_values"]) + int(fields["embedding_values"])


def unpack(gathered: nd.NDArray, world_size: int, x, problem: int):
    """(headers, batch): every rank's header as a list, and the gathered batch.

    x and problem are this rank's own converted input. When every header
    declares this rank's length the layout is regular: only the headers and
    labels are copied to the host, and batch is (embeddings (W*rows, width) on
    the context of `gathered`, labels (W*rows,) int64 on the host). Otherwise
    the headers are walked one by one on the host and batch is None.
    """
    K = len(HEADER)
    per_rank = packed_length(x, problem)
    if per_rank > 0 and gathered.shape[0] == per_rank * world_size:
        rows, width = x.shape
        table = gathered.reshape((world_size, per_rank))
        host = table[:, :K + 2 * rows].asnumpy()     # host sync: the headers decide whether the step goes on
        headers = host[:, :K].tolist()
        # Rank 0's header is at 0; if each header declares this same length, the
        # next one is where the regular layout puts it (by induction). Equal
        # totals alone prove nothing: 53 + 43 + 33 == 3 * 43.
        if all(K + _values_after(h) == per_rank for h in headers):
            labels = join_hi_lo(host[:, K:].reshape((-1, 2)))
            return headers, (table[:, K + 2 * rows:].reshape((-1, width)), labels)
    host = gathered.asnumpy()
    headers, offset = [], 0
    while offset < host.shape[0]:
        header = host[offset:offset + K].tolist()
        headers.append(header)
        offset += K + _values_after(header)
    return headers, None


def input_problems(headers: list, embedding_size: int, num_classes: int) -> "list[str]":
    """Every problem the ranks' headers show, each naming its rank; empty when all is well."""
    problems = []
    for r, header in enumerate(headers):
        h = dict(zip(HEADER, header))
        if h["problem"]:
            problems.append(f"rank {r}: {CONVERSION_PROBLEMS[int(h['problem'])]}")
            continue
        b = h["rows"]
        if b < 0:
            problems.append(f"rank {r}: embeddings must be 2-D (batch, {embedding_size})")
        elif h["width"] != embedding_size:
            problems.append(f"rank {r}: embedding width {int(h['width'])} != embedding_size {embedding_size}")
        if h["label_ndim"] != 1 or h["labels"] != b:
            problems.append(f"rank {r}: labels must be 1-D with one label per embedding row")
        if b == 0:
            problems.append(f"rank {r}: empty batch")
        if h["bad_labels"] > 0:
            smallest = int(h["min_hi"]) * LABEL_SPLIT + int(h["min_lo"])
            largest = int(h["max_hi"]) * LABEL_SPLIT + int(h["max_lo"])
            problems.append(f"rank {r}: {int(h['bad_labels'])} labels outside [0, {num_classes}) "
                            f"(smallest {smallest}, largest {largest})")
        if h["nonfinite"] > 0:
            problems.append(f"rank {r}: {int(h['nonfinite'])} NaN/Inf values in the embeddings")
    rows = [int(h[HEADER.index("rows")]) for h in headers]
    if len({b for b in rows if b >= 0}) > 1:
        problems.append("batch sizes differ across ranks: " + ", ".join(f"rank {r}={b}" for r, b in enumerate(rows)))
    return problems


def raise_if_bad(headers: list, embedding_size: int, num_classes: int) -> None:
    """The same PartialFCInputError on every rank if any rank's header shows a problem."""
    problems = input_problems(headers, embedding_size, num_classes)
    if problems:
        raise PartialFCInputError("invalid PartialFC input: " + "; ".join(problems))
