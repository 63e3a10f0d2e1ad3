"""python -m mxnet_pfc.verify MODEL BIN [BIN ...]

The verification protocol (10-fold accuracy, XNorm, TAR@FAR) of a saved model on
InsightFace .bin pair sets (lfw.bin, cfp_fp.bin, agedb_30.bin ...). MODEL is an
exported prefix, a training checkpoint folder or a training output folder.
"""
from __future__ import annotations

import argparse
import sys

from mxnet_pfc.eval.verification import Verifier
from mxnet_pfc.models.inference import load_model
from mxnet_pfc.runtime.device import add_context_option, choose_context
from mxnet_pfc.runtime.errors import exit_status
from mxnet_pfc.runtime.files import write_json
from mxnet_pfc.runtime.options import positive_int


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.verify", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="exported prefix[,epoch], checkpoint folder or training output folder")
    parser.add_argument("bins", nargs="+", help="verification .bin files")
    parser.add_argument("--batch-size", "--batch_size", type=positive_int, default=64,
                        help="images per forward pass; each is embedded with its mirror (default: %(default)s)")
    add_context_option(parser)
    parser.add_argument("--json", default="", help="also write the results to this JSON file (default: print only)")
    return parser


def run(args) -> None:
    symbol, arg_params, aux_params, source = load_model(args.model)
    ctx = choose_context(args.context, 0)
    print(f"{source}: loading {len(args.bins)} set(s)", file=sys.stderr)
    verifier = Verifier(args.bins, symbol, ctx, args.batch_size)
    results = verifier.evaluate(arg_params, aux_params, progress=True)
    for name, result in results.items():
        print(f"{name}: {result}")
    if args.json:
        write_json(args.json, {name: result.as_dict() for name, result in results.items()})


def main(argv=None) -> int:
    return exit_status("mxnet_pfc.verify", run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
