"""python -m mxnet_pfc.embed MODEL ...: face embeddings from a trained model.

  embed MODEL IMAGE|FOLDER ... [--out emb.npy]   embeddings (emb.npy, one row per image,
                                                 and emb.txt, its paths; --force to replace)
  embed MODEL --pair A B [--threshold T]         cosine similarity, same or different
  embed MODEL --gallery DIR --probe IMAGE [-k 5] nearest identities (DIR: one
                                                 sub-folder of images per identity)

Faces must be aligned 112x112 crops, as in training (--resize to force others).
Each embedding is that of the image plus its mirror image, L2-normalised, as in
verification. MODEL is an exported prefix, a checkpoint folder or a training
output folder. The default threshold is the one the final verification of the
training found (PREFIX-verification.json next to the model).
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.data.folders import list_identities
from mxnet_pfc.eval.embedding import EmbedError, default_threshold, embed_files, image_paths
from mxnet_pfc.models.inference import Embedder, load_model
from mxnet_pfc.runtime.device import add_context_option, choose_context
from mxnet_pfc.runtime.errors import exit_status
from mxnet_pfc.runtime.files import atomic_path
from mxnet_pfc.runtime.options import cosine_threshold, positive_int


def output_files(out: str, force: bool) -> "tuple[str, str]":
    """(NAME.npy, NAME.txt) of `--out NAME[.npy]`: the embeddings and their image paths. A file of either name
    that exists is refused, naming it, unless `force`: the .txt is a name the user never typed."""
    embeddings = out if out.endswith(".npy") else out + ".npy"
    listing = embeddings[:-len(".npy")] + ".txt"
    for path in (embeddings, listing):
        if not force and os.path.lexists(path):
            raise EmbedError(f"{path} exists (--out {out} writes {embeddings} and {listing}): pass --force to "
                             "replace both, or choose another --out")
    return embeddings, listing


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.embed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="exported prefix[,epoch], checkpoint folder or training output folder")
    parser.add_argument("images", nargs="*", help="images or folders to embed")
    parser.add_argument("--out", default="embeddings.npy", metavar="NAME.npy",
                        help="the embeddings go to NAME.npy (one row per image) and the image paths, one a line "
                             "in the same order, to NAME.txt; neither may exist yet unless --force "
                             "(default %(default)s)")
    parser.add_argument("--force", action="store_true",
                        help="replace NAME.npy and NAME.txt of --out when they exist (default: refuse, naming them)")
    parser.add_argument("--pair", nargs=2, metavar=("A", "B"), help="compare two faces")
    parser.add_argument("--threshold", type=cosine_threshold, default=None,
                        help="cosine similarity above which a pair is the same person (default: the cosine "
                             "threshold of the model's training verification, model-verification.json)")
    parser.add_argument("--gallery", default="", help="folder of identity sub-folders, each an identity (with --probe)")
    parser.add_argument("--probe", default="", help="the face to look up in the gallery")
    parser.add_argument("-k", "--top-k", type=positive_int, default=5,
                        help="gallery matches listed per probe, best first (default: %(default)s)")
    parser.add_argument("--resize", action="store_true",
                        help=f"resize faces that are not {FACE_SIZE}x{FACE_SIZE} "
                             "(default: refuse them, naming the file)")
    parser.add_argument("--batch-size", "--batch_size", type=positive_int, default=32,
                        help="images per forward pass (default: %(default)s)")
    add_context_option(parser)
    return parser


def run(args) -> None:
    modes = [bool(args.images), bool(args.pair), bool(args.gallery or args.probe)]
    if sum(modes) != 1:
        raise EmbedError("give images to embed, or --pair A B, or --gallery DIR --probe IMAGE (one of them)")
    if args.gallery and not args.probe or args.probe and not args.gallery:
        raise EmbedError("--gallery and --probe go together")
    outputs = output_files(args.out, args.force) if args.images else None     # refused before any work
    threshold = args.threshold
    if args.pair and threshold is None:
        threshold = default_threshold(args.model)
    symbol, arg_params, aux_params, source = load_model(args.model)
    embedder = Embedder(symbol, choose_context(args.context, 0), args.batch_size)
    embedder.set_params(arg_params, aux_params)
    if args.pair:
        a, b = embed_files(embedder, list(args.pair), args.resize)
        cosine = float(np.dot(a, b))
        verdict = "same person" if cosine > threshold else "different people"
        print(f"cosine similarity {cosine:.4f}: {verdict} (threshold {threshold:.4f})")
    elif args.gallery:
        identities = list_identities(args.gallery)
        names = [name for name, _ in identities]
        files = [p for _, paths in identities for p in paths]
        owner = np.repeat(np.arange(len(identities)), [len(paths) for _, paths in identities])
        embeddings = embed_files(embedder, files, args.resize)
        centers = np.zeros((len(names), embeddings.shape[1]), dtype=np.float64)
        np.add.at(centers, owner, embeddings)          # an identity: the mean of its faces
        centers /= np.linalg.norm(centers, axis=1, keepdims=True)
        probe = embed_files(embedder, [args.probe], args.resize)[0]
        scores = centers @ probe
        print(f"{args.probe} against {len(names)} identities ({len(files)} images) with {source}:")
        for rank, i in enumerate(np.argsort(-scores)[:args.top_k], 1):
            print(f"{rank:3d}. {names[i]}  cosine {scores[i]:.4f}")
    else:
        paths = image_paths(args.images)
        embeddings = embed_files(embedder, paths, args.resize)
        npy, listing = outputs
        with atomic_path(npy) as tmp, open(tmp, "wb") as f:
            np.save(f, embeddings)
        with atomic_path(listing) as tmp, open(tmp, "w") as f:
            f.write("\n".join(paths) + "\n")
        print(f"{len(paths)} embeddings of size {embeddings.shape[1]} -> {npy} (paths in {listing})")


def main(argv=None) -> int:
    return exit_status("mxnet_pfc.embed", run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
