"""Face image files embedded with a model, as verification embeds its pairs, and the threshold a
training's final verification found for the model (the embed command's library)."""
from __future__ import annotations

import os
import sys

import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE, ImageError, WrongSize, decode_face, read_file
from mxnet_pfc.data.folders import IMAGE_SUFFIXES
from mxnet_pfc.eval.verification import embed_pairs
from mxnet_pfc.models.inference import Embedder
from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.files import RecordFileError, read_json
from mxnet_pfc.runtime.run_folder import ModelFiles, RunFolder, split_prefix


class EmbedError(PfcError, ValueError):
    """An input of the embed command that cannot be used."""


def read_face(path: str, size: int = FACE_SIZE, resize: bool = False) -> np.ndarray:
    """RGB float32 (3, size, size), 0..255, decoded by data.faces (strict); other sizes refused unless resize."""
    try:
        face = decode_face(read_file(path), path, size, resize)
    except WrongSize as error:
        raise EmbedError(f"{error}, or pass --resize") from None
    except ImageError as error:
        raise EmbedError(str(error)) from None
    return face.transpose(2, 0, 1).astype(np.float32)


def image_paths(inputs: "list[str]") -> "list[str]":
    """Files as given; folders searched recursively for images, in sorted order."""
    paths = []
    for item in inputs:
        if os.path.isdir(item):
            found = sorted(os.path.join(root, name) for root, _, names in os.walk(item) for name in names
                           if name.lower().endswith(IMAGE_SUFFIXES))
            if not found:
                raise EmbedError(f"{item}: no images ({', '.join(IMAGE_SUFFIXES)}) in this folder")
            paths += found
        else:
            paths.append(item)
    return paths


def embed_files(embedder: Embedder, paths: "list[str]", resize: bool, chunk: int = 512) -> np.ndarray:
    """L2-normalised embeddings (n, D) of image files, read a chunk at a time, with a progress bar."""
    out = []
    with tqdm(total=len(paths), desc="embed", unit="img", file=sys.stderr, disable=len(paths) < 2 * chunk) as bar:
        for start in range(0, len(paths), chunk):
            images = np.stack([read_face(p, resize=resize) for p in paths[start:start + chunk]])
            embeddings, _ = embed_pairs(embedder, images, embedder.batch_size, bar.update)
            out.append(embeddings.astype(np.float32))
    return np.concatenate(out)


def default_threshold(model: str) -> float:
    """Cosine threshold of the training's final verification, stored next to the model (its first set's)."""
    prefix = RunFolder(model).model if os.path.isdir(model) else split_prefix(model)[0]
    path = ModelFiles(prefix).verification
    try:
        results = read_json(path)           # bounded: a file someone else may have written
        threshold = float(next(iter(results.values()))["cosine_threshold"])
    except (OSError, RecordFileError, AttributeError, TypeError, ValueError, StopIteration, KeyError):
        threshold = float("nan")
    if not -1.0 <= threshold <= 1.0:
        raise EmbedError(f"no threshold: pass --threshold, or keep {path} (written by training) next to "
                         "the model")
    return threshold
