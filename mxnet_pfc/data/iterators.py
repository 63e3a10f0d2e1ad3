"""Training batches for one rank: from a RecordIO set, a folder of images, or random tensors for speed runs.

`open` picks one for a configuration. Each yields one `Batch(data, labels, epoch)` per optimizer
step: data is an NDArray (K x B, 3, H, W) of raw 0..255 float32 pixels on the CPU, labels an int64 numpy
array (K x B,), for K micro-batches of B images (K = 1 without gradient accumulation).
Each has num_images and steps_per_epoch, seek(step) and close(), and `source`: the
images by position (source.read(i)), None for random tensors.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple, Union

import mxnet as mx
import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.data.records import (
    DataError,
    check_identity_count,
    decode_item,
    open_records,
    read_property,
    read_record,
    unpack_image_record,
)
from mxnet_pfc.data.set_rows import rows_per_set  # noqa: F401  (re-exported: the sets' rows of a batch)

log = logging.getLogger(__name__)


def count_classes(rec_path: str) -> int:
    """The number of identities of a RecordIO set: its `property` file (InsightFace's
    `num_classes,112,112`) when there is one, else its header record."""
    count, _ = stated_classes(rec_path)
    if count is None and not os.path.exists(rec_path):
        raise DataError(f"{rec_path}: no such file")
    if count is None:
        raise DataError(f"{rec_path}: the set has no header record and no `property` file beside it, so its "
                        "number of identities is unknown: give it with --num_classes")
    return count


def stated_classes(rec_path: str) -> "tuple[int | None, str]":
    """(identities, the file that says so) of a RecordIO set: its `property` file, else its header
    record; (None, '') when it states none (no header) or does not exist yet."""
    folder = os.path.dirname(rec_path) or "."
    prop = os.path.join(folder, "property")
    if os.path.exists(prop):
        return read_property(folder)[0], prop
    if not os.path.exists(rec_path):
        return None, ""
    reader, records = open_records(rec_path)
    reader.close()
    return records.num_identities, f"{rec_path} (header record)"


class TrainingSet(NamedTuple):
    """One set a run trains on: a RecordIO set (kind 'rec', the path of train.rec) or an image folder
    (kind 'images', ROOT/<identity>/<image>)."""
    kind: str
    path: str

    def __str__(self) -> str:
        return f"{self.kind}:{self.path}"


SET_KINDS = ("rec", "images")


def training_sets(rec: str, images: str, extra_sets: "tuple[str, ...]" = ()) -> "list[TrainingSet]":
    """Every set of a run, set 0 first: --rec or --images, then the extra sets, each written KIND:PATH."""
    sets = [TrainingSet("rec", rec)] if rec else [TrainingSet("images", images)] if images else []
    for text in extra_sets:
        kind, _, path = str(text).partition(":")
        if kind not in SET_KINDS or not path:
            raise DataError(f"set {text!r}: expected rec:PATH or images:PATH")
        sets.append(TrainingSet(kind, path))
    return sets


class Batch(NamedTuple):
    data: mx.nd.NDArray
    labels: np.ndarray
    epoch: int


def steps_in_epoch(num_images: int, batch_size: int, world_size: int, micro_batches: int = 1) -> int:
    """Full global batches (optimizer steps) in one epoch; the tail that does not fill one is left out."""
    steps = num_images // (batch_size * world_size * micro_batches)
    if steps == 0:
        raise DataError(f"{num_images} images cannot fill one global batch of {batch_size} x {world_size} ranks"
                        + (f" x {micro_batches} micro-batches" if micro_batches > 1 else ""))
    return steps


def epoch_order(num_images: int, batch_size: int, rank: int, world_size: int, seed: int, epoch: int,
                micro_batches: int = 1) -> np.ndarray:
    """Positions (into the image list) that `rank` reads in `epoch`, shape (steps, micro_batches x batch_size).

    One permutation per epoch, the same on every rank (seeded by seed and epoch);
    each step's global batch is cut into micro_batches x world_size consecutive
    slices of batch_size (micro-batch k of rank r is slice k x world_size + r), so
    ranks never share an image within an epoch. The tail that does not fill a
    global batch is left out of that epoch: every rank runs the same number of
    steps, which the collectives need.
    """
    steps = steps_in_epoch(num_images, batch_size, world_size, micro_batches)
    # Generator.permutation(n) shuffles arange(n): the same shuffle of int32 positions is the same order at
    # half the memory (4 bytes an image for the moment it takes)
    order = np.arange(num_images, dtype=np.int32 if num_images < 2 ** 31 else np.int64)
    np.random.default_rng([seed, epoch]).shuffle(order)
    order = order[:steps * micro_batches * world_size * batch_size]
    return order.reshape(steps, micro_batches, world_size, batch_size)[:, :, rank].reshape(steps, -1)


def skip_draws(rng: np.random.Generator, count: int, chunk: int = 1 << 20) -> None:
    """Draw and drop `count` uniform numbers of `rng`, a chunk at a time (a resume late in an epoch of
    millions of images needs no array of them)."""
    for start in range(0, count, chunk):
        rng.random(min(chunk, count - start))


class ShardedIter:
    """This rank's shard of a list of encoded face images, decoded in background threads.

    The epoch logic (order, rank slices, mirroring, decoding, prefetch, the
    damaged-image policy) lives here once; a source only says how many images
    there are and how to read image i: `read(i) -> (encoded bytes, label,
    source name)`, where the name starts any error message about the image.
    A producer thread walks the epoch order and hands reading and decoding
    (faces.decode_face) to a pool of `threads` (a source whose reads are not
    thread-safe takes a lock); up to `prefetch` decoded batches wait in a
    queue, so the training loop does not wait when decoding keeps up. Images
    are RGB, randomly mirrored when rand_mirror. A damaged image stops the
    iterator with a DataError naming it.
    """

    def __init__(self, source, batch_size: int, num_classes: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, rand_mirror: bool = True, image_size: "tuple[int, int]" = (FACE_SIZE, FACE_SIZE),
                 threads: int = 2, prefetch: int = 4, micro_batches: int = 1):
        self.source = source
        self.batch_size, self.num_classes, self.micro_batches = batch_size, num_classes, micro_batches
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.rand_mirror, self.image_size = rand_mirror, tuple(image_size)
        self.steps_per_epoch = steps_in_epoch(self.num_images, batch_size, world_size, micro_batches)
        self._queue: queue.Queue = queue.Queue(maxsize=prefetch)
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode")
        self._start_step = 0
        self._producer = None          # started by the first batch asked for

    def seek(self, step: int) -> None:
        """Begin at global step `step` (epoch step // steps_per_epoch); before the first batch only."""
        if self._producer is not None:
            raise RuntimeError("seek() after reading started")
        self._start_step = int(step)

    @property
    def num_images(self) -> int:
        return len(self.source)

    @property
    def sources(self) -> list:
        """The images of each set trained (one here; SetsIter has several)."""
        return [self.source]

    def _load(self, args) -> "tuple[np.ndarray, float]":
        position, mirror = args
        image, label = decode_item(*self.source.read(int(position)), self.num_classes, self.image_size)
        return (image[:, ::-1] if mirror else image), label        # already RGB; the mirror is a view

    def _produce(self, epoch: int, skip: int) -> None:
        """Batches from step `skip` of `epoch` on (a resumed run skips what it has done)."""
        try:
            while not self._stop.is_set():
                mirror_rng = np.random.default_rng([self.seed, epoch, self.rank])
                order = epoch_order(self.num_images, self.batch_size, self.rank, self.world_size, self.seed, epoch,
                                    self.micro_batches)
                if self.rand_mirror:
                    skip_draws(mirror_rng, order[:skip].size)      # the draws of the skipped steps
                for positions in order[skip:]:
                    mirrors = mirror_rng.random(len(positions)) < 0.5 if self.rand_mirror else [False] * len(positions)
                    decoded = list(self._pool.map(self._load, zip(positions, mirrors)))
                    data = np.stack([image for image, _ in decoded])      # uint8 NHWC: the least work here
                    labels = np.array([label for _, label in decoded], dtype=np.int64)
                    if not self._put((data, labels, epoch)):
                        return
                epoch, skip = epoch + 1, 0
        except BaseException as error:      # handed to the training loop, which raises it
            self._put(error)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        if self._producer is None:
            self._producer = threading.Thread(target=self._produce, args=divmod(self._start_step, self.steps_per_epoch),
                                              daemon=True, name="images")
            self._producer.start()
        item = self._queue.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        data, labels, epoch = item
        # layout and float conversion run in MXNet's engine, off the Python threads
        images = mx.nd.array(data, dtype="uint8").transpose((0, 3, 1, 2)).astype("float32")
        return Batch(images, labels, epoch)

    def close(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


class RecordSource:
    """The image records of a RecordIO set, item i = the i-th image record in file order."""

    def __init__(self, rec_path: str):
        self.reader, self.records = open_records(rec_path)      # reads are thread-safe (os.pread)

    def __len__(self) -> int:
        return len(self.records.image_records)

    def read(self, i: int) -> "tuple[bytes, float, str]":
        key = int(self.records.image_records[i])
        raw = read_record(self.reader, key, self.records.rec_path)
        return unpack_image_record(raw, key, self.reader.offset(key), self.records.rec_path)


class RecordIter(ShardedIter):
    """This rank's shard of an InsightFace RecordIO set (see ShardedIter): the path of its train.rec, or the
    set opened already (a RecordSource)."""

    def __init__(self, rec_path: "str | RecordSource", batch_size: int, num_classes: int, *args, **options):
        source = rec_path if isinstance(rec_path, RecordSource) else RecordSource(rec_path)
        self.reader, self.records = source.reader, source.records
        check_identity_count(self.records, num_classes)
        super().__init__(source, batch_size, num_classes, *args, **options)


class FolderIter(ShardedIter):
    """This rank's shard of an image folder ROOT/<identity>/<image> (data/folders.py's index)."""

    def __init__(self, index, batch_size: int, num_classes: int, *args, **options):
        if index.num_classes > num_classes:
            raise DataError(f"{index.root}: holds {index.num_classes} identity folders, "
                            f"more than num_classes = {num_classes}")
        super().__init__(index, batch_size, num_classes, *args, **options)


class DummyIter:
    """Random images (drawn once) and uniformly random labels: speed runs at any identity count.

    The labels of step k depend only on (seed, rank, k), so a resumed run sees the same ones.
    """

    source = None       # no images to read by position
    sources = [None]

    def __init__(self, batch_size: int, num_classes: int, rank: int = 0, seed: int = 0,
                 image_size: "tuple[int, int]" = (FACE_SIZE, FACE_SIZE), steps_per_epoch: int = 1000,
                 micro_batches: int = 1, num_images: int = 0):
        rng = np.random.default_rng([seed, rank])
        self.num_images = num_images        # the set it stands for (the configuration's num_images)
        self.images_per_step = batch_size * micro_batches
        self.num_classes, self.steps_per_epoch = num_classes, steps_per_epoch
        self._data = mx.nd.array(rng.uniform(0, 255, size=(self.images_per_step, 3, *image_size)), dtype="float32")
        self._seed, self._rank = seed, rank
        self._step = 0

    def seek(self, step: int) -> None:
        self._step = int(step)

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        rng = np.random.default_rng([self._seed, self._rank, self._step])
        labels = rng.integers(0, self.num_classes, size=self.images_per_step, dtype=np.int64)
        epoch = self._step // self.steps_per_epoch
        self._step += 1
        return Batch(self._data, labels, epoch)

    def close(self) -> None:
        pass


class SetsIter:
    """Several sets' batches as one, for one head per set (head/set_heads.py): each micro-batch holds rows[s]
    images of set s per rank, set after set, with set s's own class ids as labels.

    Each set keeps its own order and epochs (a ShardedIter of batch size rows[s]); the run's epoch is the
    longest of theirs in steps (steps_per_epoch), so that every image of every set is seen at least once
    in an epoch, the sets shorter in steps starting their next epoch of their own within it. With rows in
    proportion to the sets' sizes (the default) their epochs are about as long. seek(step) positions every
    set at that step of its own order, so a resumed run reads what it would have read.
    """
    source = None       # the images are the sets': `sources`

    def __init__(self, sets: "list[ShardedIter]", micro_batches: int = 1):
        self.sets, self.micro_batches = list(sets), micro_batches
        self.sources = [it.source for it in self.sets]
        self.rows = [it.batch_size for it in self.sets]
        self.steps_per_epoch = max(it.steps_per_epoch for it in self.sets)
        self._step = 0

    @property
    def num_images(self) -> int:
        return sum(it.num_images for it in self.sets)

    def seek(self, step: int) -> None:
        for it in self.sets:
            it.seek(step)
        self._step = int(step)

    def __iter__(self):
        return self

    def __next__(self) -> Batch:
        batches = [next(it) for it in self.sets]
        parts, labels = [], []
        for k in range(self.micro_batches):           # micro-batch k: each set's k-th slice, in set order
            for batch, rows in zip(batches, self.rows):
                parts.append(batch.data[k * rows:(k + 1) * rows])
                labels.append(batch.labels[k * rows:(k + 1) * rows])
        epoch = self._step // self.steps_per_epoch
        self._step += 1
        return Batch(mx.nd.concat(*parts, dim=0), np.concatenate(labels), epoch)

    def close(self) -> None:
        for it in self.sets:
            it.close()


TrainingData = Union["RecordIter", "FolderIter", "DummyIter", "SetsIter"]      # what open gives: one interface


def open(cfg, rank: int, world: int, index=None, extra_indexes: "dict | None" = None) -> TrainingData:
    """This rank's training batches for configuration `cfg`: its --rec set, its --images folder (`index`,
    folders.load_index's), or random tensors standing for cfg.num_images images; with extra sets, every
    set's rows of each batch (SetsIter; `extra_indexes`: set number -> index of each --images set after
    the first)."""
    options = dict(seed=cfg.seed, image_size=(cfg.image_size, cfg.image_size), micro_batches=cfg.grad_accum)
    if cfg.extra_sets:
        return open_sets(cfg, rank, world, {0: index, **(extra_indexes or {})}, options)
    if cfg.rec:
        return RecordIter(cfg.rec, cfg.batch_size, cfg.num_classes, rank, world, threads=cfg.decode_threads,
                          **options)
    if cfg.images:
        return FolderIter(index, cfg.batch_size, cfg.num_classes, rank, world, threads=cfg.decode_threads, **options)
    return DummyIter(cfg.batch_size, cfg.num_classes, rank,
                     steps_per_epoch=steps_in_epoch(cfg.num_images, cfg.batch_size, world, cfg.grad_accum),
                     num_images=cfg.num_images, **options)


def open_sets(cfg, rank: int, world: int, indexes: dict, options: dict) -> SetsIter:
    """Several sets as one batch: each set's rows of every rank's batch (rows_per_set of the sets' image
    counts or cfg.set_shares), each set read by its own iterator with its own class count."""
    sets = training_sets(cfg.rec, cfg.images, cfg.extra_sets)
    classes = [cfg.num_classes, *cfg.extra_classes]
    sources = [RecordSource(spec.path) if spec.kind == "rec" else indexes[number]
               for number, spec in enumerate(sets)]
    rows = rows_per_set(cfg.batch_size, [len(source) for source in sources], list(cfg.set_shares) or None)
    iters = []
    try:
        for source, count, num_classes in zip(sources, rows, classes):
            kind = RecordIter if isinstance(source, RecordSource) else FolderIter
            iters.append(kind(source, count, num_classes, rank, world, threads=cfg.decode_threads, **options))
    except BaseException:
        for it in iters:
            it.close()
        raise
    return SetsIter(iters, cfg.grad_accum)
