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

import numpy as np

from mxnet_pfc.models.formats import ONNX_OPSETS, export_model, export_onnx
from mxnet_pfc.models.inference import ModelError, load_model
from mxnet_pfc.models.onnx_rules import add_check_options, check_onnx, report
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.errors import exit_status
from mxnet_pfc.runtime.run_folder import ModelFiles, RunFolder, split_prefix

log = logging.getLogger("mxnet_pfc.export")


def default_prefix(model: str) -> str:
    """Where MODEL is exported without --prefix: OUTPUT/model for a training output folder or its latest
    checkpoint (where the training exports its model); beside any other checkpoint folder, under its name
    (it is not the run's model, and a checkpoint outside a run has no OUTPUT/model)."""
    folder = os.path.abspath(model)
    if checkpoints.is_checkpoint(folder):
        run = RunFolder.holding(folder)
        newest = checkpoints.latest(run.checkpoints) if run is not None else None
        if newest is not None and os.path.realpath(newest.path) == os.path.realpath(folder):
            return run.model
        return folder
    if os.path.isdir(folder):
        return RunFolder(folder).model
    raise ModelError(f"{model} is a prefix: name the exported one with --prefix")


def source_verification(model: str) -> "tuple[str, str] | None":
    """(the model prefix a training verified at its end, its verification file) for what MODEL names: a run
    folder, one of its checkpoints, or an exported prefix; None when there is none."""
    folder = os.path.abspath(split_prefix(model)[0])
    if checkpoints.is_checkpoint(folder):
        run = RunFolder.holding(folder)
        prefix = run.model if run is not None else None
    else:
        prefix = RunFolder(folder).model if os.path.isdir(folder) else split_prefix(model)[0]
    if prefix is None or not os.path.isfile(ModelFiles(prefix).verification):
        return None
    return prefix, ModelFiles(prefix).verification


def _measured(prefix: str, arg_params: dict, aux_params: dict) -> bool:
    """Whether the model at `prefix` holds exactly these parameters (what its verification file measured)."""
    try:
        _, arg, aux = load_model(prefix)[:3]
    except ModelError:
        return False
    return all(name in arg and np.array_equal(arg[name].asnumpy(), value.asnumpy())
               for name, value in arg_params.items()) and \
        all(name in aux and np.array_equal(aux[name].asnumpy(), value.asnumpy()) for name, value in aux_params.items())


def verification_of(model: str, prefix: str, arg_params: dict, aux_params: dict) -> "tuple[str | None, str]":
    """(a verification file that measured exactly these parameters, else None; why): the training's final
    one for what MODEL names, else the one already beside PREFIX. Asked before the export writes anything:
    the verified model may be the one it is about to replace."""
    found = source_verification(model)
    target = ModelFiles(prefix).verification
    kept = f"verification figures (embed's threshold) kept in {target}: they measured these parameters"
    if found is not None and _measured(found[0], arg_params, aux_params):
        if os.path.abspath(found[1]) == os.path.abspath(target):
            return target, kept
        return found[1], f"verification figures (embed's threshold) carried from {found[1]}"
    if os.path.isfile(target) and _measured(prefix, arg_params, aux_params):
        return target, kept
    if found is not None:
        return None, (f"{found[1]} not carried: it measured other parameters than these (embed --pair will need "
                      "--threshold, or run verify)")
    return None, "no verification figures for this model: embed --pair will need --threshold (or run verify)"


def clear_verification(keep: "str | None", prefix: str) -> str:
    """Remove the verification file beside PREFIX unless it is `keep`, before the export replaces the model it
    measured (were the export stopped half-way, its threshold would pass for other parameters). Returns
    what the log adds ('' when nothing was there)."""
    target = ModelFiles(prefix).verification
    if not os.path.exists(target) or (keep is not None and os.path.abspath(keep) == os.path.abspath(target)):
        return ""
    os.remove(target)
    return "" if keep is not None else (f"; {target} removed: it measured the parameters this export replaced "
                                        "(a training's final figures stay in its metrics.jsonl)")


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
    prefix = args.prefix or default_prefix(args.model)
    if not os.path.isdir(args.model) and os.path.abspath(prefix) == os.path.abspath(split_prefix(args.model)[0]):
        raise ModelError(f"--prefix {prefix} would overwrite the model it reads; choose another")
    if checkpoints.is_checkpoint(os.path.dirname(os.path.abspath(prefix))):
        raise ModelError(f"--prefix {prefix} is inside a checkpoint's folder, whose files it could replace and "
                         "which is removed when newer checkpoints are kept; choose another")
    verification, why = verification_of(args.model, prefix, arg_params, aux_params)
    why += clear_verification(verification, prefix)
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
