"""python -m mxnet_pfc.data.synthetic: write the synthetic face set the default run trains on.

    python -m mxnet_pfc.data.synthetic --output output/data/synthetic

writes train.rec, train.idx, property (the InsightFace layout) and val.bin
(pairs of held-out identities, the verification format). Identities are random
draws of a parametric face; each image adds nuisance (background, pose,
lighting, noise) a model must learn to ignore (data/synthetic_set.py).
"""
from __future__ import annotations

import argparse
import sys

from mxnet_pfc.data.synthetic_set import generate
from mxnet_pfc.runtime.errors import exit_status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.data.synthetic", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="output/data/synthetic",
                        help="folder to write the set into (default: %(default)s)")
    parser.add_argument("--identities", type=int, default=500,
                        help="identities of the training set, one class each (default: %(default)s)")
    parser.add_argument("--images-per-identity", type=int, default=32,
                        help="training images rendered per identity (default: %(default)s)")
    parser.add_argument("--val-identities", type=int, default=250,
                        help="held-out identities of val.bin, never in the training set (default: %(default)s)")
    parser.add_argument("--val-pairs", type=int, default=1000,
                        help="verification pairs in val.bin, half of them same-identity (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the identities and the nuisance drawn for each image (default: %(default)s)")
    return parser


def run(args) -> None:
    generate(args.output, args.identities, args.images_per_identity, args.val_identities, args.val_pairs, args.seed)
    print(f"wrote {args.output}: train.rec/.idx ({args.identities} identities x {args.images_per_identity}), "
          f"property, val.bin ({args.val_pairs} pairs of {args.val_identities} unseen identities)")


def main(argv=None) -> int:
    return exit_status("mxnet_pfc.data.synthetic", run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
