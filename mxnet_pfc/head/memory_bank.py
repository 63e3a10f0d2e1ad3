"""One rank's memory bank: its share of the class centers, their momentum, and their SGD.

Rank r owns the contiguous classes [class_start, class_start + num_local) of the
class table (`sampler.shard_range`). The bank keeps their centers as `weight` and
their momentum as `weight_mom`, updates only the rows a step used, and writes
and reads them for checkpoints. With K sub-centers per class (sub-center
ArcFace) a class has K rows, class-major: local class c holds rows c*K .. c*K + K - 1,
all on the rank that owns the class (insightface's layout). A checkpoint saved on W ranks loads onto any
other number of ranks: each rank reads its new range from whichever saved
shards hold it (docs/DESIGN.md, section 5).
"""
from __future__ import annotations

import os

import mxnet as mx
import numpy as np

from mxnet_pfc.head.kernels.ops import HeadOps, center_gradients, set_rows
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.runtime.errors import CheckpointError

nd = mx.nd


def shard_overlaps(shards: "list[list[int]]", start: int, count: int) -> "list[tuple[int, int, int, int]]":
    """Where rows [start, start + count) of the class table lie in saved shards.

    shards[r] = (class_start, num_local) of old rank r. Returns (old_rank,
    row_in_old_shard, row_in_new_range, rows) pieces covering the new range.
    """
    pieces, covered = [], 0
    for old_rank, (old_start, old_count) in enumerate(shards):
        lo, hi = max(start, old_start), min(start + count, old_start + old_count)
        if lo < hi:
            pieces.append((old_rank, lo - old_start, lo - start, hi - lo))
            covered += hi - lo
    if covered != count:
        raise CheckpointError(f"the saved shards cover {covered} of the {count} classes [{start}, {start + count})")
    return pieces


def shard_files(folder: str, rank: int) -> "dict[str, str]":
    """The files of rank `rank`'s bank in a checkpoint folder: {"centers": path, "momentum": path}."""
    return {kind: os.path.join(folder, f"{kind}-rank{rank:05d}.npy") for kind in ("centers", "momentum")}


HOST_CHUNK_BYTES = 16 << 20     # the most a save or a fill copies between the bank and the host at once


def chunk_rows(array) -> int:
    """Rows of `array` (2-d) in one host copy of at most HOST_CHUNK_BYTES."""
    return max(1, HOST_CHUNK_BYTES // (array.shape[1] * 4))


def write_npy(path: str, array: nd.NDArray) -> None:
    """np.save's file of float32 `array` (byte for byte), copied to the host a block of rows at a time.

    np.save(path, array.asnumpy()) would hold a host copy of the whole array: at 10^7 classes
    per host, gigabytes above training's high-water mark while a checkpoint is written.
    """
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                                 "fortran_order": False, "shape": tuple(array.shape)})
        step = chunk_rows(array)
        for start in range(0, array.shape[0], step):
            array[start:start + step].asnumpy().tofile(f)     # host copy: a sync point


class MemoryBank:
    """Centers and momentum of this rank's classes, with momentum SGD of given rows.

    The update is MXNet's sgd_mom_update on the given rows only:
    mom = momentum * mom - lr * (grad + wd * w); w += mom. `lr` may change
    between steps. `ops` is the head's kernel set (fused C++ or MXNet ops).
    """

    def __init__(self, num_classes: int, embedding_size: int, rank: int, world_size: int, ctx: mx.Context,
                 ops: HeadOps, lr: float = 0.1, momentum: float = 0.9, wd: float = 5e-4, init_std: float = 0.01,
                 subcenters: int = 1):
        self.num_classes, self.embedding_size = int(num_classes), int(embedding_size)
        self.subcenters = int(subcenters)       # K rows per class
        self.rank, self.world_size, self.ctx, self.ops = rank, world_size, ctx, ops
        self.class_start, self.num_local = shard_range(self.num_classes, rank, world_size)
        self.lr, self.momentum, self.wd = float(lr), float(momentum), float(wd)
        self.weight = nd.random.normal(0.0, init_std, shape=(self.num_local * self.subcenters, self.embedding_size),
                                       ctx=ctx, dtype="float32")
        self.weight_mom = nd.zeros_like(self.weight)
        self._held = None       # buffers (gradient, radial, used) for hold(), allocated on first use
        self._holding = False   # whether hold() has added gradients since the last update

    def __repr__(self) -> str:
        return (f"MemoryBank(rank {self.rank}/{self.world_size}: classes [{self.class_start}, "
                f"{self.class_start + self.num_local}) of {self.num_classes}, D={self.embedding_size}"
                + (f", {self.subcenters} sub-centers each" if self.subcenters > 1 else "") + ")")

    @property
    def nbytes(self) -> int:
        """Bytes of centers and momentum together (what a checkpoint writes for this rank)."""
        return 2 * self.weight.size * 4

    def rows_of(self, classes: np.ndarray) -> np.ndarray:
        """The rows (int32, sorted if `classes` is) of local classes `classes`: c*K .. c*K + K - 1 for each."""
        K = self.subcenters
        classes = np.asarray(classes, dtype=np.int64)
        return (classes[:, None] * K + np.arange(K)).reshape(-1).astype(np.int32)

    def logits(self, xh: nd.NDArray, index: nd.NDArray, out: nd.NDArray) -> "tuple[nd.NDArray, nd.NDArray]":
        """(xh . w^T into out (N, S), 1 / |w| (S,)) for the rows w of `index` (sorted, unique)."""
        return self.ops.logits(xh, self.weight, index, out)

    def backward(self, index: nd.NDArray, grad: nd.NDArray, xh: nd.NDArray, radial: nd.NDArray,
                 update: bool = True) -> nd.NDArray:
        """The embeddings' gradient grad . w, and momentum SGD of the centers w of `index`.

        grad (N, S) is the loss gradient for cos * |w| (pfc_softmax_grad); the centers'
        gradient is grad^T . xh - radial * w, radial (S,) the coefficient of the
        normalisation's radial term (docs/DESIGN.md section 2.5). One pass over the
        rows (ops.center_step) unless gradients are accumulated: with update=False
        the gradient is held (hold) and the centers stay; the next update applies
        every held gradient.
        """
        if update and not self._holding:
            return self.ops.center_step(grad, xh, radial, index, self.weight, self.weight_mom,
                                        self.lr, self.momentum, self.wd)
        _, grad_xh, center_grad = center_gradients(grad, xh, self.weight, index)
        if update:
            index, center_grad, radial = self._take_held(index, center_grad, radial)
            self.ops.sgd_rows(self.weight, self.weight_mom, center_grad, radial, index,
                              self.lr, self.momentum, self.wd)
        else:
            self.hold(index, center_grad, radial)
        return grad_xh

    def hold(self, index: nd.NDArray, grad: nd.NDArray, radial: nd.NDArray) -> None:
        """Add a micro-batch's gradient of the rows `index` to those held for the next update.

        Gradient accumulation: the centers do not move between the micro-batches
        of an optimizer step. Both terms of the gradient are linear in the loss and
        the rows stay put, so their sums give the step's gradient exactly. The sums
        live in a buffer the size of the centers, allocated on first use (docs/DESIGN.md section 2.11).
        """
        if self._held is None:
            rows = self.weight.shape[0]
            self._held = (nd.zeros_like(self.weight), nd.zeros((rows,), ctx=self.ctx), nd.zeros((rows,), ctx=self.ctx))
        held_grad, held_radial, used = self._held
        for total, part in ((held_grad, grad), (held_radial, radial)):
            set_rows(total, index, nd.take(total, index) + part)
        set_rows(used, index, nd.ones(index.shape, ctx=self.ctx))
        self._holding = True

    def _take_held(self, index, grad, radial):
        """(index, grad, radial) of the held micro-batches plus this one; the buffer is cleared."""
        self.hold(index, grad, radial)
        held_grad, held_radial, used = self._held
        index = nd.array(np.flatnonzero(used.asnumpy()), ctx=self.ctx, dtype="int32")    # host sync: once a step
        taken = nd.take(held_grad, index), nd.take(held_radial, index)
        for total in (held_grad, held_radial, used):       # only the rows used were written
            set_rows(total, index, nd.zeros((index.shape[0], *total.shape[1:]), ctx=self.ctx))
        self._holding = False
        return (index, *taken)

    def save(self, folder: str) -> "list[str]":
        """Write this rank's centers and momentum into `folder`; returns the paths (host copies: sync points)."""
        files = shard_files(folder, self.rank)
        write_npy(files["centers"], self.weight)
        write_npy(files["momentum"], self.weight_mom)
        return list(files.values())

    def load(self, folder: str, shards: "list[list[int]]") -> None:
        """Fill centers and momentum with this rank's classes from the shards saved in `folder`.

        shards[r] = (class_start, num_local) of saved rank r, on any number of
        ranks: only the rows this rank owns are read, a block at a time straight
        into the bank (no host copy of the whole bank). The saved bank must have
        this bank's number of sub-centers (the caller checks state.json's).
        """
        read_shard = saved_shard_reader(folder, shards, self.embedding_size, self.subcenters)
        for kind, target in (("centers", self.weight), ("momentum", self.weight_mom)):
            def put(row: int, values: np.ndarray, target=target) -> None:
                target[row:row + len(values)]._sync_copyfrom(values)        # into the bank's rows (a view)
            copy_saved_rows(shards, self.class_start, self.num_local, self.subcenters, kind, read_shard, put,
                            chunk_rows(target))

    def set_all(self, centers: np.ndarray, momentum: np.ndarray) -> None:
        """This rank's centers and momentum from host arrays of the bank's shape."""
        for target, rows in ((self.weight, centers), (self.weight_mom, momentum)):
            if rows.shape != target.shape:
                raise ValueError(f"{rows.shape} rows for a bank of {target.shape}")
            # a block at a time, straight into the bank's rows (a view): never a second copy of the whole
            # bank (nd.array(rows) was one, and MXNet's pool keeps freed blocks of an NDArray per block)
            step = chunk_rows(target)
            for start in range(0, len(rows), step):
                target[start:start + step]._sync_copyfrom(rows[start:start + step])


def copy_saved_rows(shards: "list[list[int]]", class_start: int, num_local: int, subcenters: int, kind: str,
                    read_shard, put, block_rows: int) -> None:
    """The saved rows of `kind` ('centers' or 'momentum') of classes [class_start, class_start + num_local),
    K rows each, from saved shards on any number of ranks (shards[r] = (class_start, num_local) of saved
    rank r), handed over a block of at most `block_rows` rows at a time: put(row, values), `values` float32,
    the new range's rows from `row` on. read_shard(kind, r) -> (saved rank r's rows of `kind`, its file)
    returns them checked for shape and type. Only the rows needed are read; a NaN or infinite one is
    refused naming its file."""
    K = subcenters
    for old_rank, old_row, new_row, rows in shard_overlaps(shards, class_start, num_local):
        saved, file = read_shard(kind, old_rank)
        for start in range(0, rows * K, block_rows):
            first, count = old_row * K + start, min(block_rows, rows * K - start)
            values = np.asarray(saved[first:first + count], dtype=np.float32)
            if not np.isfinite(values).all():
                raise CheckpointError(f"{file}: non-finite values (NaN or inf) in its {kind}")
            put(new_row * K + start, values)


def assemble_kind(shards: "list[list[int]]", class_start: int, num_local: int, embedding_size: int,
                  subcenters: int, read_shard, kind: str) -> np.ndarray:
    """The rows of `kind` ('centers' or 'momentum') float32 of classes [class_start, class_start + num_local),
    K rows each, as a host array: copy_saved_rows into it."""
    target = np.empty((num_local * subcenters, embedding_size), dtype=np.float32)

    def put(row: int, values: np.ndarray) -> None:
        target[row:row + len(values)] = values
    copy_saved_rows(shards, class_start, num_local, subcenters, kind, read_shard, put, chunk_rows(target))
    return target


def assemble_rows(shards: "list[list[int]]", class_start: int, num_local: int, embedding_size: int,
                  subcenters: int, read_shard) -> "tuple[np.ndarray, np.ndarray]":
    """(centers, momentum) float32 of classes [class_start, class_start + num_local), K rows each, as host
    arrays."""
    return tuple(assemble_kind(shards, class_start, num_local, embedding_size, subcenters, read_shard, kind)
                 for kind in ("centers", "momentum"))


class FileRows:
    """The rows of a checked 2-d float32 .npy file, read from the file when sliced (plain reads: the pages of
    np.load's memory map would count as the process's memory until it is closed, up to a whole shard)."""

    def __init__(self, file: str, offset: int, shape: "tuple[int, int]"):
        self.file, self.offset, self.shape = file, offset, shape

    def __getitem__(self, rows: slice) -> np.ndarray:
        start, stop, _ = rows.indices(self.shape[0])
        width = self.shape[1]
        count = max(0, stop - start) * width
        values = np.fromfile(self.file, dtype=np.float32, count=count, offset=self.offset + start * width * 4)
        if values.size != count:
            raise CheckpointError(f"{self.file}: shorter than its header says ({self.shape} float32 rows)")
        return values.reshape(-1, width)


def saved_shard_reader(folder: str, shards: "list[list[int]]", embedding_size: int, subcenters: int):
    """read_shard(kind, r) -> (FileRows of saved rank r's `kind` in checkpoint `folder`, its file) for
    copy_saved_rows, each file checked (np.load's header reader: never unpickles) against state.json's shards."""
    def read_shard(kind: str, old_rank: int):
        file = shard_files(folder, old_rank)[kind]
        try:
            saved = np.load(file, mmap_mode="r")
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{file}: {error}") from None
        expected = (shards[old_rank][1] * subcenters, embedding_size)
        if saved.shape != expected or saved.dtype != np.float32:
            raise CheckpointError(f"{file}: {saved.dtype} array of shape {saved.shape}; state.json's shards "
                                  f"give saved rank {old_rank} float32 rows of shape {expected}")
        if np.isfortran(saved):
            raise CheckpointError(f"{file}: its rows are stored in Fortran order; a checkpoint's are in C order")
        return FileRows(file, saved.offset, expected), file

    return read_shard


def read_saved_rows(folder: str, shards: "list[list[int]]", class_start: int, num_local: int, embedding_size: int,
                    subcenters: int = 1) -> "tuple[np.ndarray, np.ndarray]":
    """assemble_rows from the shard files a checkpoint saved in `folder` (only the rows needed are read)."""
    return assemble_rows(shards, class_start, num_local, embedding_size, subcenters,
                         saved_shard_reader(folder, shards, embedding_size, subcenters))


def read_saved_centers(folder: str, shards: "list[list[int]]", class_start: int, num_local: int,
                       embedding_size: int, subcenters: int = 1) -> np.ndarray:
    """The centers alone of read_saved_rows (a search or a judgement of images needs no momentum: half the
    reading)."""
    return assemble_kind(shards, class_start, num_local, embedding_size, subcenters,
                         saved_shard_reader(folder, shards, embedding_size, subcenters), "centers")
