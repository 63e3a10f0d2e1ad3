"""Where a fresh run starts: the backbone's parameters (--pretrained) and the class centers (--init_centers).

A run resumed from a checkpoint starts from the checkpoint and ignores both.
Reading (`read_start`) happens in setup, before any collective, so that a missing
or mismatched file is agreed on by every rank and stops the run before step 1;
applying (`apply_start`) fills the module and the memory bank once they exist.

- --pretrained PREFIX[,EPOCH] names MXNet parameters: PREFIX-EPOCH.params
  (InsightFace's model zoo: model-symbol.json + model-0000.params; the MXNet
  Partial FC's model / model_average), a checkpoint folder of this project (its
  rank-averaged backbone) or a run's output folder (its exported model, else its
  latest checkpoint). Parameters are matched by name; a matching name of another
  shape stops the run naming it, and so does a file with none of the network's.
  The network's parameters the file lacks keep their random start; the log lists both.
- --init_centers FOLDER: a checkpoint (or a run's output folder: its latest) of
  this project, on any number of ranks, or the folder of a run of InsightFace's
  MXNet Partial FC (insightface_run.py); centers and momentum, re-sharded.
- --init_centers imprint: one pass over the training set before step 1 under
  the starting backbone (`imprint`).
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.records import decode_item
from mxnet_pfc.head.memory_bank import read_saved_rows
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.models.inference import ModelError, model_of_run_folder, split_prefix
from mxnet_pfc.runtime import comm, logs, watchdog
from mxnet_pfc.runtime.errors import CheckpointError, ConfigError, load_params
from mxnet_pfc.runtime.run_folder import ModelFiles, RunFolder
from mxnet_pfc.training import checkpoint, insightface_run

log = logging.getLogger(logs.ROOT_LOGGER)

IMPRINT_CHUNK = 1 << 16      # classes per allreduce of the imprint pass: bounds its buffer to 64k x (D + 1) floats


@dataclass(frozen=True)
class Pretrained:
    """The parameters --pretrained gives this network, and what the log says about them."""
    source: str
    arg_params: dict
    aux_params: dict
    loaded: "tuple[str, ...]"
    initialised: "tuple[str, ...]"      # the network's parameters the file does not hold
    unused: "tuple[str, ...]"           # the file's parameters the network does not have

    def describe(self) -> str:
        def some(names):
            return ", ".join(names[:6]) + (f" ... ({len(names)})" if len(names) > 6 else "")
        line = f"pretrained backbone: {len(self.loaded)} parameters loaded from {self.source}"
        if self.initialised:
            line += f"; {len(self.initialised)} initialised at random: {some(self.initialised)}"
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
class Start:
    """What a fresh run starts from, beyond random: None for each part left random."""
    pretrained: "Pretrained | None" = None
    centers: "InitialCenters | None" = None
    imprint: bool = False


def read_start(cfg, rank: int, world: int, symbol: mx.sym.Symbol, subcenters: int) -> Start:
    """This rank's reading of --pretrained and --init_centers (no collective): a Start, or a ConfigError or
    CheckpointError naming the file and what does not fit."""
    pretrained = read_pretrained(cfg.pretrained, symbol, (cfg.batch_size, 3, cfg.image_size, cfg.image_size)) \
        if cfg.pretrained else None
    centers = None
    if cfg.init_centers not in ("random", "imprint"):
        if not os.path.isdir(cfg.init_centers):
            raise ConfigError(f"init_centers = {cfg.init_centers!r}: not random or imprint, and no such folder")
        start, count = shard_range(cfg.num_classes, rank, world)
        centers = read_centers(cfg.init_centers, cfg.num_classes, cfg.embedding_size, subcenters, start, count)
    if cfg.init_centers == "imprint" and subcenters > 1:
        raise ConfigError("init_centers = 'imprint': imprinting gives one center per class, and sub-center "
                          f"ArcFace's {subcenters} centers of a class must differ; start them at random")
    return Start(pretrained, centers, cfg.init_centers == "imprint")


def pretrained_params(spec: str) -> "tuple[dict, dict, str]":
    """(arg_params, aux_params, a description) of what `spec` names (see the module docstring)."""
    try:
        if os.path.isdir(spec) and not checkpoint.is_checkpoint(spec):
            spec = model_of_run_folder(spec)
        if checkpoint.is_checkpoint(spec):
            arg_params, aux_params = checkpoint.load_backbone(spec, 0, same_world=False, average=True)
            return arg_params, aux_params, f"checkpoint {spec} (rank-averaged backbone)"
        prefix, epoch = split_prefix(spec)
    except ModelError as error:
        raise ConfigError(f"pretrained = {spec!r}: {error}") from None
    file = ModelFiles(prefix).params(epoch)
    if not os.path.isfile(file):
        raise ConfigError(f"pretrained = {spec!r}: no such file {file} (give PREFIX or PREFIX,EPOCH for "
                          "PREFIX-EPOCH.params, a checkpoint folder or a run's output folder)")
    arg_params, aux_params = load_params(file, ConfigError)
    return arg_params, aux_params, file


def read_pretrained(spec: str, symbol: mx.sym.Symbol, data_shape: tuple) -> Pretrained:
    """The parameters of `spec` that this network has, matched by name and checked by shape."""
    arg_params, aux_params, source = pretrained_params(spec)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=data_shape)
    wanted = {**{n: s for n, s in zip(symbol.list_arguments(), arg_shapes) if n != "data"},
              **dict(zip(symbol.list_auxiliary_states(), aux_shapes))}
    given = {**arg_params, **aux_params}
    if set(arg_params) & set(aux_params):
        raise ConfigError(f"pretrained = {spec!r}: {source} names "
                          f"{', '.join(sorted(set(arg_params) & set(aux_params))[:3])} both arg: and aux:")
    mismatched = [f"{name} {tuple(given[name].shape)} in the file, {tuple(wanted[name])} in the network"
                  for name in sorted(set(wanted) & set(given)) if tuple(given[name].shape) != tuple(wanted[name])]
    if mismatched:
        raise ConfigError(f"pretrained = {spec!r}: {len(mismatched)} parameter(s) of {source} do not fit the "
                          f"network's shapes: {'; '.join(mismatched[:5])}{' ...' if len(mismatched) > 5 else ''}")
    loaded = sorted(set(wanted) & set(given))
    if not loaded:
        raise ConfigError(f"pretrained = {spec!r}: {source} holds none of the network's parameters (the file: "
                          f"{', '.join(sorted(given)[:4])} ...; the network: {', '.join(sorted(wanted)[:4])} ...)")
    not_float = [f"{name} ({np.dtype(given[name].dtype).name})" for name in loaded
                 if np.dtype(given[name].dtype).kind != "f"]
    if not_float:
        raise ConfigError(f"pretrained = {spec!r}: parameters of {source} are not floating point: "
                          f"{', '.join(not_float[:5])}")
    non_finite = [name for name in loaded if not np.isfinite(given[name].asnumpy()).all()]
    if non_finite:
        raise ConfigError(f"pretrained = {spec!r}: non-finite values (NaN or inf) in {', '.join(non_finite[:5])} "
                          f"of {source}")
    return Pretrained(source, {n: arg_params[n] for n in loaded if n in arg_params},
                      {n: aux_params[n] for n in loaded if n in aux_params}, tuple(loaded),
                      tuple(sorted(set(wanted) - set(given))), tuple(sorted(set(given) - set(wanted))))


def read_centers(folder: str, num_classes: int, embedding_size: int, subcenters: int, class_start: int,
                 num_local: int) -> InitialCenters:
    """This rank's starting centers from `folder`: a checkpoint of this project (or a run folder's latest)
    or a run of InsightFace's MXNet Partial FC, checked against this run's classes and width."""
    where = f"init_centers = {folder!r}"
    path = folder
    if not checkpoint.is_checkpoint(path) and os.path.isdir(RunFolder(path).checkpoints):
        newest = checkpoint.latest(RunFolder(path).checkpoints)
        path = newest.path if newest is not None else path
    if checkpoint.is_checkpoint(path):
        state = checkpoint.read_state(path)
        problems = []
        if state["num_classes"] != num_classes:
            problems.append(f"it has {state['num_classes']} classes, this run {num_classes} (num_classes)")
        if state["embedding_size"] != embedding_size:
            problems.append(f"its centers are {state['embedding_size']}-d, this run's embedding_size "
                            f"{embedding_size}")
        if state.get("subcenters", 1) != subcenters:
            problems.append(f"it has {state.get('subcenters', 1)} center(s) per class, this run {subcenters}")
        if problems:
            raise CheckpointError(f"{where}: checkpoint {path} does not fit: " + "; ".join(problems))
        centers, momentum = read_saved_rows(path, state["shards"], class_start, num_local, embedding_size,
                                            subcenters)
        return InitialCenters(f"checkpoint {path} ({state['world_size']} rank(s))", centers, momentum)
    if insightface_run.is_run_folder(folder):
        if subcenters > 1:
            raise CheckpointError(f"{where}: InsightFace's Partial FC keeps one center per class, this run "
                                  f"{subcenters}")
        centers, momentum = insightface_run.read_rows(folder, num_classes, embedding_size, class_start, num_local)
        return InitialCenters(f"InsightFace Partial FC run {folder} ({insightface_run.world_size_of(folder)} "
                              "rank(s))", centers, momentum)
    raise ConfigError(f"{where}: the folder holds no checkpoint (state.json), no checkpoints/ of a run, and no "
                      f"center files of InsightFace's Partial FC ({insightface_run.FILES['centers'].format(rank=0)})")


def apply_start(start: Start, module, head, source, cfg, rank: int, world: int) -> None:
    """Fill the module and the memory bank from `start` (every rank; imprinting runs collectives)."""
    with comm.fail_together("loading the starting point"):
        if start.pretrained is not None:
            arg_params, aux_params = module.get_params()       # the random start, the same on every rank
            for current, given in ((arg_params, start.pretrained.arg_params),
                                   (aux_params, start.pretrained.aux_params)):
                current.update({name: value.astype(current[name].dtype) for name, value in given.items()})
            module.set_params(arg_params, aux_params)
            log.info(start.pretrained.describe())
        if start.centers is not None:
            head.bank.set_all(start.centers.centers, start.centers.momentum)
            log.info(f"class centers and their momentum from {start.centers.source}")
    if start.imprint:
        imprint(module, head.bank, source, cfg, rank, world)


def imprint(module, bank, source, cfg, rank: int, world: int) -> None:
    """Each class's center: the normalised sum of its images' normalised embeddings under the current
    backbone (inference mode: BatchNorm's moving statistics, no mirroring); classes without an image keep
    their random center; momentum stays zero.

    Rank r embeds images r, r + W, r + 2W ... of the set; the sums reach the rank owning the class through
    allreduces of one owner's classes at a time (IMPRINT_CHUNK classes each), so no rank holds more than its
    own sums, the classes it saw, and one chunk.
    """
    started = time.time()
    positions = np.arange(rank, len(source), world)
    with comm.fail_together("imprinting: embedding the training images"):     # no collective inside
        labels_seen, sums = _embed_by_class(module, source, positions, cfg, rank)
    with comm.fail_together("imprinting: summing each class's embeddings on its owner"):
        imprinted = _reduce_to_owners(labels_seen, sums, bank, cfg.num_classes, world)
    log.info(f"imprinted centers: {imprinted:,} of this rank's {bank.num_local:,} classes have training images "
             f"(the rest keep random centers); {len(positions):,} images embedded on this rank in "
             f"{time.time() - started:.1f} s")


def _embed_by_class(module, source, positions: np.ndarray, cfg, rank: int) -> "tuple[np.ndarray, np.ndarray]":
    """(the classes of the images at `positions`, the sum of each class's normalised embeddings)."""
    batch = cfg.batch_size
    labels_seen, sums = np.zeros(0, np.int64), np.zeros((0, cfg.embedding_size), np.float64)
    pending_labels, pending = [], []
    progress = tqdm(total=len(positions), desc="imprint", unit="image", disable=rank != 0, mininterval=5,
                    file=sys.stderr, dynamic_ncols=True)
    for first in range(0, len(positions), batch):
        items = [decode_item(*source.read(int(i)), cfg.num_classes, (cfg.image_size, cfg.image_size))
                 for i in positions[first:first + batch]]
        images = np.stack([image for image, _ in items]).transpose(0, 3, 1, 2).astype(np.float32)
        count = len(images)
        if count < batch:               # the module is bound for full batches
            images = np.concatenate([images, np.zeros((batch - count, *images.shape[1:]), np.float32)])
        module.module.forward(mx.io.DataBatch([mx.nd.array(images)]), is_train=False)
        embeddings = module.module.get_outputs()[0].asnumpy()[:count].astype(np.float64)
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        pending.append(embeddings / np.maximum(norms, 1e-12))
        pending_labels.append(np.array([label for _, label in items], dtype=np.int64))
        if len(pending) >= 64 or first + batch >= len(positions):
            labels_seen, sums = _add_by_class(labels_seen, sums, np.concatenate(pending_labels),
                                              np.concatenate(pending))
            pending, pending_labels = [], []
        progress.update(count)
        watchdog.progress()
    progress.close()
    return labels_seen, sums


def _add_by_class(labels: np.ndarray, sums: np.ndarray, new_labels: np.ndarray, new_rows: np.ndarray):
    """(unique labels, per-label sums) of both sets of rows together."""
    all_labels = np.concatenate([labels, new_labels])
    unique, inverse = np.unique(all_labels, return_inverse=True)
    merged = np.zeros((len(unique), sums.shape[1]), np.float64)
    np.add.at(merged, inverse, np.concatenate([sums, new_rows]))
    return unique, merged


def _reduce_to_owners(labels: np.ndarray, sums: np.ndarray, bank, num_classes: int, world: int) -> int:
    """Sum every rank's per-class sums onto the class's owner and set its imprinted centers (collective:
    every rank runs the same allreduces, owner by owner, chunk by chunk); returns how many of this rank's
    classes were imprinted."""
    width = bank.embedding_size
    centers = bank.weight.asnumpy()
    imprinted = 0
    for owner in range(world):
        start, count = shard_range(num_classes, owner, world)
        for first in range(start, start + count, IMPRINT_CHUNK):
            last = min(first + IMPRINT_CHUNK, start + count)
            chunk = np.zeros((last - first, width + 1), np.float32)
            inside = (labels >= first) & (labels < last)
            chunk[labels[inside] - first, :width] = sums[inside]
            chunk[labels[inside] - first, width] = 1.0     # how many ranks saw the class: > 0 is what counts
            total = comm.allreduce(mx.nd.array(chunk), name=f"imprint.{first}").asnumpy()
            if owner == bank.rank:
                seen = np.flatnonzero(total[:, width] > 0)
                vectors = total[seen, :width]
                rows = first - start + seen
                centers[rows] = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
                imprinted += len(seen)
            watchdog.progress()
    bank.set_all(centers, bank.weight_mom.asnumpy())
    return imprinted
