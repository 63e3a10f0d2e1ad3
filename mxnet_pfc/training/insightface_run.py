"""The files of a run of InsightFace's MXNet Partial FC (recognition/partial_fc/mxnet), read to go on here.

Its train_memory.py splits C classes over W ranks by ceiling: with n = ceil(C / W),
rank r holds classes [r x n, (r + 1) x n) as rows 0 .. n-1 of its memory bank (the
last rank's rows past class C - 1 are never used). MemoryBank.save writes each
rank's centers and their momentum into the run's folder as `R_centers.param` and
`R_centers_mom.param`: mx.nd.save of one unnamed float32 (n, D) array. The
momentum is MXNet's sgd_mom_update state, as ours (memory_bank.py). Its backbone is
`model-symbol.json` + `model-0000.params`, and `model_average-*` with parameters
averaged over ranks (callbacks.py, CallBackModelSave); --pretrained reads either.

The files do not say C: only that the W ranks hold n rows each, which fits any
C in ((n - 1) W, n W]. A class count whose ceiling split gives that n is
accepted; any other is refused, naming the range.
"""
from __future__ import annotations

import os

import numpy as np

from mxnet_pfc.head.memory_bank import assemble_rows
from mxnet_pfc.runtime.errors import CheckpointError
from mxnet_pfc.runtime.mxnet_files import load_arrays

FILES = {"centers": "{rank}_centers.param", "momentum": "{rank}_centers_mom.param"}


def files_of(folder: str, rank: int) -> "dict[str, str]":
    return {kind: os.path.join(folder, name.format(rank=rank)) for kind, name in FILES.items()}


def is_run_folder(folder: str) -> bool:
    """Whether `folder` holds a Partial FC run's center files (rank 0's)."""
    return os.path.isfile(files_of(folder, 0)["centers"])


def world_size_of(folder: str) -> int:
    """The number of ranks whose center and momentum files are in `folder` (0 .. W-1, both kinds, no gap)."""
    world = 0
    while os.path.isfile(files_of(folder, world)["centers"]):
        world += 1
    missing = [os.path.basename(path) for rank in range(world) for path in files_of(folder, rank).values()
               if not os.path.isfile(path)]
    stray = sorted(name for name in os.listdir(folder)
                   if name.endswith("_centers.param") and name.split("_")[0].isdigit()
                   and int(name.split("_")[0]) >= world)
    if missing or stray:
        raise CheckpointError(f"{folder}: the Partial FC center files of ranks 0..{world - 1} are incomplete"
                              + (f" (missing {', '.join(missing[:4])})" if missing else "")
                              + (f" (and {', '.join(stray[:4])} beyond a gap)" if stray else ""))
    return world


def read_center_rows(folder: str, num_classes: int, embedding_size: int, class_start: int,
                     num_local: int) -> "tuple[np.ndarray, np.ndarray]":
    """(centers, momentum) float32 of classes [class_start, class_start + num_local) from a Partial FC run's
    files, whatever its number of ranks; only the files holding those classes are read."""
    world = world_size_of(folder)
    rows_per_rank = -(-num_classes // world)
    shards = [[rank * rows_per_rank, max(0, min(rows_per_rank, num_classes - rank * rows_per_rank))]
              for rank in range(world)]

    def read_shard(kind: str, old_rank: int):
        file = files_of(folder, old_rank)[kind]
        saved = load_arrays(file, CheckpointError)
        if isinstance(saved, dict) or len(saved) != 1:
            raise CheckpointError(f"{file}: not a Partial FC memory bank file (expected one unnamed array, "
                                  f"found {len(saved)}{' named' if isinstance(saved, dict) else ''})")
        saved = saved[0]
        if saved.ndim != 2 or saved.shape[1] != embedding_size:
            raise CheckpointError(f"{file}: its {kind} have shape {saved.shape}: {saved.shape[-1]}-d, this "
                                  f"run's embedding_size is {embedding_size}")
        if saved.shape[0] != rows_per_rank:       # ceil(C / W) = n holds for C in ((n - 1) W, n W]
            held = saved.shape[0]
            raise CheckpointError(
                f"{folder}: its {world} ranks hold {held} rows each, which fits a run of "
                f"{(held - 1) * world + 1}..{held * world} classes; this run has num_classes = {num_classes} "
                f"({rows_per_rank} rows per rank on {world} ranks)")
        return saved.asnumpy(), file

    return assemble_rows(shards, class_start, num_local, embedding_size, 1, read_shard)
