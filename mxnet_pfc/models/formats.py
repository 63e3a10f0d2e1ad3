"""A model for inference: the backbone's symbol and parameters as MXNet files, and as ONNX.

export_model writes PREFIX-symbol.json + PREFIX-0000.params (arg:/aux: keys),
loadable with mx.model.load_checkpoint into mx.mod.Module or with
gluon.nn.SymbolBlock.imports, at any batch size: input raw RGB pixels 0..255,
N x 3 x 112 x 112 (the symbol normalises them), output the N x D embedding. The
trainer exports with it; the export command (mxnet_pfc/export.py) also writes
PREFIX.onnx with export_onnx (a free batch dimension).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import mxnet as mx
import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.runtime.files import atomic_path
from mxnet_pfc.runtime.run_folder import ModelFiles
from mxnet_pfc.runtime.symbol_file import load_symbol


def export_model(prefix: str, symbol: mx.sym.Symbol, arg_params: dict, aux_params: dict) -> "tuple[str, str]":
    """PREFIX-symbol.json + PREFIX-0000.params, each written under a temporary name and renamed."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    tmp = f"{prefix}.tmp{os.getpid()}"
    mx.model.save_checkpoint(tmp, 0, symbol, arg_params, aux_params, remove_amp_cast=True)
    files, written = ModelFiles(prefix), ModelFiles(tmp)
    os.replace(written.params(0), files.params(0))
    os.replace(written.symbol, files.symbol)
    return files.symbol, files.params(0)


# MXNet 1.9's exporter has converters for opsets 12 and 13; 13 with IR version 7 is what evaluation servers'
# older ONNX Runtimes read (the MFR server's 1.8 reads opsets up to 14 and IR versions up to 7).
ONNX_OPSETS = (12, 13)
ONNX_IR_VERSION = 7


@contextmanager
def _onnx_opset(version: int):
    """MXNet's export_model writes the installed onnx package's newest opset (onnx.defs.onnx_opset_version(),
    read inside it): this makes it write `version`."""
    import onnx.defs

    newest = onnx.defs.onnx_opset_version
    onnx.defs.onnx_opset_version = lambda: version
    try:
        yield
    finally:
        onnx.defs.onnx_opset_version = newest


def export_onnx(prefix: str, onnx_path: str, image_size: int = FACE_SIZE, opset: int = ONNX_OPSETS[-1]) -> str:
    """PREFIX's model as ONNX (MXNet 1.9's exporter) at `opset` and IR version ONNX_IR_VERSION, batch
    dimension free."""
    if opset not in ONNX_OPSETS:
        raise ValueError(f"opset {opset}: MXNet 1.9's exporter writes opsets {', '.join(map(str, ONNX_OPSETS))}")
    with atomic_path(onnx_path) as tmp:
        files = ModelFiles(prefix)
        with _onnx_opset(opset):
            mx.onnx.export_model(files.symbol, files.params(0),
                                 in_shapes=[(1, 3, image_size, image_size)], in_types=[np.float32],
                                 onnx_file_path=tmp, dynamic=True)
        symbol = load_symbol(files.symbol)
        _, out_shapes, _ = symbol.infer_shape(data=(1, 3, image_size, image_size))
        _tidy_onnx(tmp, image_size, out_shapes[0][1])
    return onnx_path


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
    model.ir_version = ONNX_IR_VERSION      # the package writes its own newest; the opset needs no more
    onnx.checker.check_model(model)
    onnx.save(model, path)
