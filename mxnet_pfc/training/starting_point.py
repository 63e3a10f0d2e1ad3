"""Where a fresh run starts: the backbone's parameters (--pretrained) and the class centers (--init_centers).

A run resumed from a checkpoint starts from the checkpoint and ignores both.
Reading (`read_starting_point`) happens in setup, before any collective, so that
a missing or mismatched file is agreed on by every rank and stops the run before
step 1; applying (`apply_starting_point`) fills the module and the memory bank
once they exist, and makes sure every rank started from the same files.

- --pretrained PREFIX[,EPOCH] names MXNet parameters: PREFIX-EPOCH.params
  (InsightFace's model zoo: model-symbol.json + model-0000.params; the MXNet
  Partial FC's model / model_average), a checkpoint folder of this project (its
  rank-averaged backbone) or a run's output folder (its exported model, else its
  latest checkpoint). Parameters are matched by name and filed by the network's
  own role for them (argument or auxiliary state); a matching name of another
  shape stops the run naming it, and so does a file with none of the network's.
  The network's parameters the file lacks keep their random start (a warning
  lists them), as the log lists the file's that the network does not use.
- --init_centers FOLDER: a checkpoint (or a run's output folder: its latest) of
  this project, on any number of ranks, or the folder of a run of InsightFace's
  MXNet Partial FC (insightface_run.py); centers and momentum, re-sharded.
- --init_centers imprint: one pass over the training set before step 1 under
  the starting backbone (`imprint`).
- Several sets: one of these for every set (a folder then holds a run of as
  many sets, each head read from its own), or one per set, comma-separated.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import zlib
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from tqdm import tqdm

import symbols
from mxnet_pfc.data.records import DataError, decode_item
from mxnet_pfc.head.memory_bank import read_saved_rows
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.models.inference import ModelError, load_backbone, model_of_run_folder
from mxnet_pfc.runtime import checkpoints, comm, logs, watchdog
from mxnet_pfc.runtime.errors import CheckpointError, ConfigError, quoted, short
from mxnet_pfc.runtime.mxnet_files import load_params
from mxnet_pfc.runtime.run_folder import ModelFiles, RunFolder, split_prefix
from mxnet_pfc.training import insightface_run
from mxnet_pfc.training.config import INIT_IMPRINT, INIT_RANDOM, init_centers_of

log = logging.getLogger(logs.ROOT_LOGGER)

IMPRINT_BLOCK = 1 << 14      # classes per allreduce of the imprint pass: bounds its buffers to 16k x (D + 1) floats


@dataclass(frozen=True)
class Pretrained:
    """The parameters --pretrained gives this network, and what the log says about them."""
    source: str
    arg_params: dict
    aux_params: dict
    loaded: "tuple[str, ...]"
    kept_random: "tuple[str, ...]"      # the network's parameters the file does not hold
    unused: "tuple[str, ...]"           # the file's parameters the network does not have

    def describe(self) -> str:
        def some(names):
            return ", ".join(map(short, names[:6])) + (f" ... ({len(names)})" if len(names) > 6 else "")
        line = f"pretrained backbone: {len(self.loaded)} parameters loaded from {self.source}"
        if self.kept_random:
            line += (f"; {len(self.kept_random)} of the network's {len(self.loaded) + len(self.kept_random)} are "
                     f"not in the file and keep their random start: {some(self.kept_random)}")
        if self.unused:
            line += f"; {len(self.unused)} in the file not used by this network: {some(self.unused)}"
        return line


@dataclass(frozen=True)
class InitialCenters:
    """This rank's starting centers and momentum (bank-shaped), and where they came from."""
    source: str
    centers: np.ndarray
    momentum: np.ndarray


@dataclass(frozen=True)
class StartingPoint:
    """What a fresh run starts from, beyond random: None for each part left random."""
    pretrained: "Pretrained | None" = None
    centers: "tuple[InitialCenters | None, ...]" = ()     # each set's, set 0 first (None: random or imprinted)
    imprint: "tuple[bool, ...]" = ()                      # each set's: imprinted before step 1

    def sources(self) -> str:
        """Which files it was read from: the same on every rank, or the ranks did not start alike."""
        return "|".join([self.pretrained.source if self.pretrained else ""]
                        + [centers.source if centers else "" for centers in self.centers])


def read_starting_point(cfg, rank: int, world: int, symbol: mx.sym.Symbol, subcenters: int) -> StartingPoint:
    """This rank's reading of --pretrained and --init_centers (no collective): a StartingPoint, or a
    ConfigError or CheckpointError naming the file and what does not fit."""
    pretrained = read_pretrained(cfg.pretrained, symbol, (cfg.batch_size, 3, cfg.image_size, cfg.image_size)) \
        if cfg.pretrained else None
    classes = [cfg.num_classes, *cfg.extra_classes]
    starts = init_centers_of(cfg)
    one_for_all = len(starts) == 1
    starts = starts * len(classes) if one_for_all else starts
    centers = []
    for number, (start, count) in enumerate(zip(starts, classes)):
        if start in (INIT_RANDOM, INIT_IMPRINT):
            centers.append(None)
            continue
        if not os.path.isdir(start):
            raise ConfigError(f"init_centers = {quoted(start)}: not {INIT_RANDOM} or {INIT_IMPRINT}, and no "
                              "such folder")
        class_start, num_local = shard_range(count, rank, world)
        centers.append(read_centers(start, count, cfg.embedding_size, subcenters, class_start, num_local,
                                    set_number=number if one_for_all else 0,
                                    sets=len(classes) if one_for_all else 1))
    if INIT_IMPRINT in starts and subcenters > 1:
        raise ConfigError(f"init_centers = {INIT_IMPRINT!r}: imprinting gives one center per class, and sub-center "
                          f"ArcFace's {subcenters} centers of a class must differ; start them at random")
    return StartingPoint(pretrained, tuple(centers), tuple(start == INIT_IMPRINT for start in starts))


def pretrained_params(spec: str) -> "tuple[dict, dict, str]":
    """(arg_params, aux_params, a description) of what `spec` names (see the module docstring)."""
    try:
        path = model_of_run_folder(spec) if os.path.isdir(spec) and not checkpoints.is_checkpoint(spec) else spec
    except ModelError as error:
        raise ConfigError(f"pretrained = {quoted(spec)}: {error}") from None
    if checkpoints.is_checkpoint(path):
        arg_params, aux_params = load_backbone(path, 0, same_world=False, average=True)
        return arg_params, aux_params, f"checkpoint {path} (rank-averaged backbone)"
    prefix, epoch = split_prefix(path)
    file = ModelFiles(prefix).params(epoch)
    if not os.path.isfile(file):
        raise ConfigError(f"pretrained = {quoted(spec)}: no such file {short(file)} (give PREFIX or PREFIX,EPOCH for "
                          "PREFIX-EPOCH.params, a checkpoint folder or a run's output folder)")
    arg_params, aux_params = load_params(file, ConfigError)
    return arg_params, aux_params, file


def read_pretrained(spec: str, symbol: mx.sym.Symbol, data_shape: tuple) -> Pretrained:
    """The parameters of `spec` that this network has, matched by name, checked by shape, type and value,
    and filed as the network files them (argument or auxiliary state, whichever the file said)."""
    arg_params, aux_params, source = pretrained_params(spec)
    arg_shapes, aux_shapes = symbols.parameter_shapes(symbol, data_shape)
    wanted = {**arg_shapes, **aux_shapes}
    both = sorted(set(arg_params) & set(aux_params))
    if both:
        raise ConfigError(f"pretrained = {quoted(spec)}: {source} names {', '.join(map(short, both[:3]))} both arg: "
                          "and aux:")
    given = {**arg_params, **aux_params}
    mismatched = [f"{name} {tuple(given[name].shape)} in the file, {wanted[name]} in the network"
                  for name in sorted(set(wanted) & set(given)) if tuple(given[name].shape) != wanted[name]]
    if mismatched:
        raise ConfigError(f"pretrained = {quoted(spec)}: {len(mismatched)} parameter(s) of {source} do not fit the "
                          f"network's shapes: {'; '.join(mismatched[:5])}{' ...' if len(mismatched) > 5 else ''}")
    loaded = sorted(set(wanted) & set(given))
    if not loaded:
        raise ConfigError(f"pretrained = {quoted(spec)}: {source} holds none of the network's parameters (the "
                          f"file: {', '.join(map(short, sorted(given)[:4]))} ...; the network: "
                          f"{', '.join(sorted(wanted)[:4])} ...)")
    not_float = [f"{name} ({np.dtype(given[name].dtype).name})" for name in loaded
                 if np.dtype(given[name].dtype).kind != "f"]
    if not_float:
        raise ConfigError(f"pretrained = {quoted(spec)}: parameters of {source} are not floating point: "
                          f"{', '.join(not_float[:5])}")
    non_finite = [name for name in loaded if not np.isfinite(given[name].asnumpy()).all()]
    if non_finite:
        raise ConfigError(f"pretrained = {quoted(spec)}: non-finite values (NaN or inf) in {', '.join(non_finite[:5])} "
                          f"of {source}")
    return Pretrained(source, {n: given[n] for n in loaded if n in arg_shapes},
                      {n: given[n] for n in loaded if n in aux_shapes}, tuple(loaded),
                      tuple(sorted(set(wanted) - set(given))), tuple(sorted(set(given) - set(wanted))))


def read_centers(folder: str, num_classes: int, embedding_size: int, subcenters: int, class_start: int,
                 num_local: int, set_number: int = 0, sets: int = 1) -> InitialCenters:
    """This rank's starting centers from `folder`: a checkpoint of this project (or a run folder's latest)
    or a run of InsightFace's MXNet Partial FC, checked against this run's classes and width. With
    `sets` > 1 the checkpoint holds a run of as many sets, and set `set_number`'s head is read."""
    where = f"init_centers = {quoted(folder)}"
    path = folder
    if not checkpoints.is_checkpoint(path) and os.path.isdir(RunFolder(path).checkpoints):
        newest = checkpoints.latest(RunFolder(path).checkpoints)
        path = newest.path if newest is not None else path
    if checkpoints.is_checkpoint(path):
        state = checkpoints.State.read(path)
        heads = state.heads()
        if len(heads) != sets:
            raise CheckpointError(f"{where}: checkpoint {path} holds the heads of {len(heads)} set(s), and this run "
                                  f"starts {sets} set(s) from it: name one folder per set, comma-separated")
        saved_classes, shards = heads[set_number]
        problems = checkpoints.head_mismatches(dataclasses.replace(state, num_classes=saved_classes), num_classes,
                                               embedding_size, subcenters)
        if problems:
            which = f" (set {set_number})" if sets > 1 else ""
            raise CheckpointError(f"{where}: checkpoint {path}{which} does not fit: " + "; ".join(problems))
        centers, momentum = read_saved_rows(checkpoints.head_folder(path, set_number), shards, class_start, num_local,
                                            embedding_size, subcenters)
        which = f", its set {set_number}" if sets > 1 else ""
        return InitialCenters(f"checkpoint {path} ({state.world_size} rank(s){which})", centers, momentum)
    if insightface_run.is_run_folder(folder):
        if sets > 1:
            raise ConfigError(f"{where}: a run of InsightFace's Partial FC holds one set's centers, and this run "
                              f"starts {sets} sets from it: name one folder per set, comma-separated")
        if subcenters > 1:
            raise CheckpointError(f"{where}: InsightFace's Partial FC keeps one center per class, this run "
                                  f"{subcenters}")
        centers, momentum = insightface_run.read_center_rows(folder, num_classes, embedding_size, class_start,
                                                             num_local)
        return InitialCenters(f"InsightFace Partial FC run {folder} ({insightface_run.world_size_of(folder)} "
                              "rank(s))", centers, momentum)
    raise ConfigError(f"{where}: the folder holds no checkpoint (state.json), no checkpoints/ of a run, and no "
                      f"center files of InsightFace's Partial FC ({insightface_run.FILES['centers'].format(rank=0)})")


def apply_starting_point(point: StartingPoint, module, heads: list, sources: list, cfg, rank: int,
                         world: int) -> None:
    """Fill the module and the memory banks from `point` (every rank; collectives). `heads` are the sets'
    heads (PartialFC, set 0 first), `sources` their training images (imprinting reads them).

    Every rank read the files itself: the ranks agree that they read the same ones (a run folder still
    being written could give them different latest checkpoints), and the backbone is then broadcast from
    rank 0, so that copies of a file that differ between hosts cannot start the ranks apart.
    """
    fingerprint = zlib.crc32(point.sources().encode())
    if len({int(row[0]) for row in comm.gather_rows([float(fingerprint)])}) > 1:
        raise ConfigError(f"the ranks started from different files (this rank: {quoted(point.sources())}); a run "
                          "folder still being written? Name a checkpoint folder instead")
    with comm.fail_together("loading the starting point"):
        if point.pretrained is not None:
            arg_params, aux_params = module.get_params()       # the random start, the same on every rank
            for current, given in ((arg_params, point.pretrained.arg_params),
                                   (aux_params, point.pretrained.aux_params)):
                current.update({name: value.astype(current[name].dtype) for name, value in given.items()})
            module.set_params(arg_params, aux_params)
            (log.warning if point.pretrained.kept_random else log.info)(point.pretrained.describe())
        for number, (head, centers) in enumerate(zip(heads, point.centers)):
            if centers is not None:
                head.bank.set_all(centers.centers, centers.momentum)
                log.info(f"{f'set {number}: ' if len(heads) > 1 else ''}class centers and their momentum from "
                         f"{centers.source}")
    if point.pretrained is not None:
        arg_params, aux_params = module.get_params()
        comm.broadcast_parameters(arg_params)
        comm.broadcast_parameters(aux_params)
        module.set_params(arg_params, aux_params)
    for number, (head, source, imprinted) in enumerate(zip(heads, sources, point.imprint)):
        if imprinted:
            if len(heads) > 1 and rank == 0:
                log.info(f"imprinting the centers of set {number}")
            imprint(module, head.bank, source, cfg, rank, world)


def imprint(module, bank, source, cfg, rank: int, world: int) -> None:
    """Each class's center: the normalised sum of its images' normalised embeddings under the current
    backbone (module.embed: inference mode, no mirroring); classes without an image keep their random
    center; momentum stays zero.

    Rank r embeds images r, r + W, r + 2W ... of the set, in the order of their classes, block by block of
    IMPRINT_BLOCK classes of one owner: each block's sums reach the owner in one allreduce, so no rank
    holds more than one block's sums, whatever the number of classes. A block is embedded inside an
    agreement, so a damaged image on one rank stops every rank instead of leaving them in the allreduce.
    """
    started, num_classes = time.time(), bank.num_classes
    positions = np.arange(rank, len(source), world)
    with comm.fail_together("imprinting: reading the training set's labels"):
        labels = np.empty(len(positions), dtype=np.int64)
        for j, i in enumerate(positions):
            _, label, where = source.read(int(i))
            if not (0 <= label < num_classes and label == int(label)):
                raise DataError(f"{where} has label {label}, outside the classes [0, {num_classes})")
            labels[j] = int(label)
    order = np.argsort(labels, kind="stable")
    positions, labels = positions[order], labels[order]
    progress = tqdm(total=len(positions), desc="imprint", unit="image", disable=rank != 0, mininterval=5,
                    file=sys.stderr, dynamic_ncols=True)
    imprinted, width = 0, bank.embedding_size
    centers = bank.weight.asnumpy()
    for owner in range(world):
        owner_start, owner_count = shard_range(num_classes, owner, world)
        for first in range(owner_start, owner_start + owner_count, IMPRINT_BLOCK):
            last = min(first + IMPRINT_BLOCK, owner_start + owner_count)
            lo, hi = np.searchsorted(labels, [first, last])
            with comm.fail_together(f"imprinting classes {first}..{last - 1}"):
                block = _embedded_block(module, source, positions[lo:hi], cfg, first, last - first, num_classes)
            total = comm.allreduce(mx.nd.array(block), name=f"imprint.{first}").asnumpy()
            if owner == rank:
                seen = np.flatnonzero(total[:, width] > 0)
                vectors = total[seen, :width]
                centers[first - owner_start + seen] = vectors / np.maximum(
                    np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
                imprinted += len(seen)
            progress.update(hi - lo)
            watchdog.progress()
    progress.close()
    bank.set_all(centers, bank.weight_mom.asnumpy())
    log.info(f"imprinted centers: {imprinted:,} of this rank's {bank.num_local:,} classes have training images "
             f"(the rest keep random centers); {len(positions):,} images embedded on this rank in "
             f"{time.time() - started:.1f} s")


def _embedded_block(module, source, positions: np.ndarray, cfg, first: int, count: int,
                    num_classes: int) -> np.ndarray:
    """(count, D + 1) float32: for classes first .. first + count - 1, the sum of this rank's images'
    normalised embeddings (images at `positions`, all of those classes) and, in the last column, 1 where
    this rank has an image of the class."""
    width = cfg.embedding_size
    sums = np.zeros((count, width + 1), np.float64)
    batch = cfg.batch_size
    for at in range(0, len(positions), batch):
        items = [decode_item(*source.read(int(i)), num_classes, (cfg.image_size, cfg.image_size))
                 for i in positions[at:at + batch]]
        images = np.stack([image for image, _ in items]).transpose(0, 3, 1, 2).astype(np.float32)
        embeddings = module.embed(images).astype(np.float64)
        embeddings /= np.maximum(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12)
        rows = np.array([label for _, label in items], dtype=np.int64) - first
        np.add.at(sums, rows, np.concatenate([embeddings, np.ones((len(rows), 1))], axis=1))
    sums[:, width] = sums[:, width] > 0
    return sums.astype(np.float32)
