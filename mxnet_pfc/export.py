"""python -m mxnet_pfc.export MODEL [--prefix PREFIX] [--onnx]

Writes an embedding-only model for MXNet inference, PREFIX-symbol.json +
PREFIX-0000.params (arg:/aux: keys), loadable with mx.model.load_checkpoint into
mx.mod.Module or with gluon.nn.SymbolBlock.imports, at any batch size. Input:
raw RGB pixels 0..255, N x 3 x 112 x 112 (the symbol normalises them); output:
the N x D embedding (L2-normalise it before comparing faces).

MODEL is a training checkpoint folder (its rank-averaged backbone), a training
output folder (its latest checkpoint), or an MXNet prefix. Without --prefix, a
training output folder and its latest checkpoint are written as OUTPUT/model,
where the training writes its model, and any other checkpoint beside its own
folder, under its name (CHECKPOINT-symbol.json + CHECKPOINT-0000.params): an
earlier checkpoint never replaces the run's model. --onnx also writes
PREFIX.onnx with a free batch dimension; --check then checks it as evaluation
servers check a submitted model (see mxnet_pfc/models/onnx_rules.py), prints one line
per check, writes PREFIX-onnx-check.json and exits 1 if a check fails.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys

from mxnet_pfc.models import export_target
from mxnet_pfc.models.formats import ONNX_OPSETS, export_model, export_onnx
from mxnet_pfc.models.inference import load_model
from mxnet_pfc.models.onnx_rules import add_check_options, check_onnx, report
from mxnet_pfc.runtime.errors import exit_status
from mxnet_pfc.runtime.run_folder import ModelFiles

log = logging.getLogger("mxnet_pfc.export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="checkpoint folder, training output folder, or MXNet prefix[,epoch]")
    parser.add_argument("--prefix", default="",
                        help="output prefix (default: OUTPUT/model for a training output folder or its latest "
                             "checkpoint; for an earlier checkpoint (or one outside a run) CHECKPOINT, beside it: "
                             "CHECKPOINT-symbol.json + CHECKPOINT-0000.params, so that it never replaces the run's "
                             "model)")
    parser.add_argument("--onnx", action="store_true", help="also write PREFIX.onnx (default: off)")
    parser.add_argument("--opset", type=int, choices=ONNX_OPSETS, default=ONNX_OPSETS[-1],
                        help="ONNX opset of PREFIX.onnx, written with IR version 7, which evaluation servers' "
                             "older ONNX Runtimes read (default: %(default)s)")
    parser.add_argument("--check", action="store_true",
                        help="write PREFIX.onnx and check it: input/output shapes, float16 weights, size, finite "
                             "outputs, latency, embeddings against MXNet's; results in PREFIX-onnx-check.json "
                             "(default: off)")
    add_check_options(parser)
    return parser


def run(args) -> int:
    symbol, arg_params, aux_params, source = load_model(args.model)
    prefix = export_target.prefix_for(args.model, args.prefix)
    verification, why = export_target.verification_of(args.model, prefix, arg_params, aux_params)
    why += export_target.clear_verification(verification, prefix)
    files = export_model(prefix, symbol, arg_params, aux_params)
    log.info(f"{source} -> {' + '.join(files)} ({sum(v.size for v in arg_params.values()):,} parameters)")
    if verification is not None and os.path.abspath(verification) != os.path.abspath(ModelFiles(prefix).verification):
        shutil.copyfile(verification, ModelFiles(prefix).verification)
    log.info(why)
    if args.onnx or args.check:
        log.info(f"ONNX (opset {args.opset}): {export_onnx(prefix, ModelFiles(prefix).onnx, opset=args.opset)}")
    if args.check:
        onnx = ModelFiles(prefix).onnx
        checks = check_onnx(onnx, prefix, max_latency_ms=args.max_latency_ms, tolerance=args.tolerance)
        if not report(checks, ModelFiles(prefix).onnx_check, onnx, prefix):
            return 1
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return exit_status("mxnet_pfc.export", run, args)


if __name__ == "__main__":
    sys.exit(main())
