"""python -m mxnet_pfc.export MODEL [--prefix PREFIX] [--onnx]

Writes an embedding-only model for MXNet inference, PREFIX-symbol.json +
PREFIX-0000.params (arg:/aux: keys), loadable with mx.model.load_checkpoint into
mx.mod.Module or with gluon.nn.SymbolBlock.imports, at any batch size. Input:
raw RGB pixels 0..255, N x 3 x 112 x 112 (the symbol normalises them); output:
the N x D embedding (L2-normalise it before comparing faces).

MODEL is a training checkpoint folder (its rank-averaged backbone), a training
output folder (its latest checkpoint), or an MXNet prefix. --onnx also writes
PREFIX.onnx with a free batch dimension; --check then checks it as evaluation
servers check a submitted model (see mxnet_pfc/models/onnx_check.py), prints one line
per check, writes PREFIX-onnx-check.json and exits 1 if a check fails.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import mxnet as mx
import numpy as np

from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.files import atomic_path
from mxnet_pfc.models.inference import ModelError, load_model
from mxnet_pfc.models.onnx_check import add_check_options, check_onnx, report

log = logging.getLogger("mxnet_pfc.export")


def export_model(prefix: str, symbol: mx.sym.Symbol, arg_params: dict, aux_params: dict) -> "tuple[str, str]":
    """PREFIX-symbol.json + PREFIX-0000.params, each written under a temporary name and renamed."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    tmp = f"{prefix}.tmp{os.getpid()}"
    mx.model.save_checkpoint(tmp, 0, symbol, arg_params, aux_params, remove_amp_cast=True)
    files = (f"{prefix}-symbol.json", f"{prefix}-0000.params")
    os.replace(f"{tmp}-0000.params", files[1])
    os.replace(f"{tmp}-symbol.json", files[0])
    return files


def export_onnx(prefix: str, onnx_path: str, image_size: int = 112) -> str:
    """PREFIX's model as ONNX (MXNet 1.9's exporter), batch dimension free."""
    with atomic_path(onnx_path) as tmp:
        mx.onnx.export_model(f"{prefix}-symbol.json", f"{prefix}-0000.params",
                             in_shapes=[(1, 3, image_size, image_size)], in_types=[np.float32],
                             onnx_file_path=tmp, dynamic=True)
        symbol = mx.sym.load(f"{prefix}-symbol.json")
        _, out_shapes, _ = symbol.infer_shape(data=(1, 3, image_size, image_size))
        _tidy_onnx(tmp, image_size, out_shapes[0][1])
    return onnx_path


def default_prefix(model: str) -> str:
    """OUTPUT/model for a training output folder or one of its checkpoints (where training exports)."""
    folder = os.path.abspath(model)
    if os.path.exists(os.path.join(folder, "state.json")) and os.path.basename(os.path.dirname(folder)) == "checkpoints":
        return os.path.join(os.path.dirname(os.path.dirname(folder)), "model")
    if os.path.isdir(folder):
        return os.path.join(folder, "model")
    raise ModelError(f"{model} is a prefix: name the exported one with --prefix")


def _tidy_onnx(path: str, image_size: int, embedding_size: int) -> None:
    """Per-channel PReLU slopes as (C, 1, 1), weights out of the graph inputs, shapes N x 3 x S x S -> N x D.

    MXNet 1.9 writes the slopes as (C,), which ONNX broadcasts against the last (width)
    axis: onnxruntime then refuses the model, or mixes channels when C == W.
    With dynamic=True it leaves every input and output dimension free; evaluation
    servers (InsightFace's MFR checker) read the image size from the input shape.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(path)
    initializers = {init.name: init for init in model.graph.initializer}
    inputs = {value.name: value for value in model.graph.input}     # the exporter lists weights as inputs too
    for node in model.graph.node:
        slope = initializers.get(node.input[1]) if node.op_type == "PRelu" and len(node.input) > 1 else None
        if slope is not None and len(slope.dims) == 1 and slope.dims[0] > 1:
            values = numpy_helper.to_array(slope).reshape(-1, 1, 1)
            slope.CopyFrom(numpy_helper.from_array(values, slope.name))
            if slope.name in inputs:
                inputs[slope.name].CopyFrom(onnx.helper.make_tensor_value_info(
                    slope.name, inputs[slope.name].type.tensor_type.elem_type, values.shape))
    # weights are constants, not inputs (lets onnxruntime fold them, and silences its warnings)
    kept = [value for value in model.graph.input if value.name not in initializers]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    shapes = ((model.graph.input[0], (3, image_size, image_size)), (model.graph.output[0], (embedding_size,)))
    for value, dims in shapes:
        shape = value.type.tensor_type.shape
        del shape.dim[:]
        shape.dim.add().dim_param = "N"
        for size in dims:
            shape.dim.add().dim_value = size
    onnx.checker.check_model(model)
    onnx.save(model, path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.export", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="checkpoint folder, training output folder, or MXNet prefix[,epoch]")
    parser.add_argument("--prefix", default="",
                        help="output prefix (default: OUTPUT/model for a training output or checkpoint folder)")
    parser.add_argument("--onnx", action="store_true", help="also write PREFIX.onnx (default: off)")
    parser.add_argument("--check", action="store_true",
                        help="write PREFIX.onnx and check it: input/output shapes, float16 weights, size, finite "
                             "outputs, latency, embeddings against MXNet's; results in PREFIX-onnx-check.json "
                             "(default: off)")
    add_check_options(parser)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        symbol, arg_params, aux_params, source = load_model(args.model)
        prefix = args.prefix or default_prefix(args.model)
        if os.path.abspath(prefix) == os.path.abspath(args.model.partition(",")[0]):
            raise ModelError(f"--prefix {prefix} would overwrite the model it reads; choose another")
        files = export_model(prefix, symbol, arg_params, aux_params)
        log.info(f"{source} -> {' + '.join(files)} ({sum(v.size for v in arg_params.values()):,} parameters)")
        if args.onnx or args.check:
            log.info(f"ONNX: {export_onnx(prefix, prefix + '.onnx')}")
        if args.check:
            checks = check_onnx(prefix + ".onnx", prefix, max_latency_ms=args.max_latency_ms,
                                tolerance=args.tolerance)
            if not report(checks, prefix + "-onnx-check.json", prefix + ".onnx", prefix):
                return 1
    except (PfcError, OSError) as error:
        print(f"mxnet_pfc.export: {error}", file=sys.stderr)
        return 1
    return 0

