"""python -m mxnet_pfc.data.synthetic: write the synthetic face set the default run trains on.

    python -m mxnet_pfc.data.synthetic --output output/data/synthetic

writes train.rec, train.idx, property (the InsightFace layout) and val.bin
(pairs of held-out identities, the verification format). Identities are random
draws of a parametric face; each image adds nuisance (background, pose,
lighting, noise) a model must learn to ignore (data/synthetic_set.py).

Sets with planted flaws, to test cleaning and overlap search against a known
truth (planted.json beside the set lists every planted case):

    python -m mxnet_pfc.data.synthetic --output A --identities 500
    python -m mxnet_pfc.data.synthetic --output B --seed 1 --label-noise 0.2 \\
        --split-identities 20 --share 50 --share-with A
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from mxnet_pfc.data.records import DataError
from mxnet_pfc.data.synthetic_set import Planted, generate, shared_from
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
    parser.add_argument("--label-noise", type=float, default=0.0,
                        help="share of training images labelled as another identity, in [0, 1) (default: 0)")
    parser.add_argument("--split-identities", type=int, default=0,
                        help="identities whose images are split over two labels, the second numbered after "
                             "every identity's own (default: 0)")
    parser.add_argument("--share", type=int, default=0,
                        help="identities drawn as those of the set --share-with names, under labels of "
                             "their own here (default: 0)")
    parser.add_argument("--share-with", default="",
                        help="a synthetic set written by this command, whose identities --share takes")
    return parser


def run(args) -> None:
    if bool(args.share) != bool(args.share_with):
        raise DataError("--share and --share-with go together")
    planted = shared_from(args.share_with, args.share) if args.share else Planted()
    planted = dataclasses.replace(planted, label_noise=args.label_noise, split_identities=args.split_identities)
    generate(args.output, args.identities, args.images_per_identity, args.val_identities, args.val_pairs, args.seed,
             planted)
    print(f"wrote {args.output}: train.rec/.idx ({args.identities} identities x {args.images_per_identity}), "
          f"property, val.bin ({args.val_pairs} pairs of {args.val_identities} unseen identities)"
          + (f", planted.json ({planted})" if planted != Planted() else ""))


def main(argv=None) -> int:
    return exit_status("mxnet_pfc.data.synthetic", run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
