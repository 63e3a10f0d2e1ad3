"""Models for inference: finding one on disk, and embedding images with it.

A model is named by any of
  - a prefix of an MXNet checkpoint, PREFIX-symbol.json + PREFIX-0000.params
    (or "PREFIX,EPOCH" for PREFIX-EPOCH.params, as InsightFace names them);
  - a training checkpoint folder (OUTPUT/checkpoints/ckpt-SEQUENCE-step-STEP): its rank-averaged
    backbone, rebuilt without dropout;
  - a training output folder: its exported model-*, else its latest checkpoint.
"""
from __future__ import annotations

import json
import os

import mxnet as mx
import numpy as np

import symbols
from mxnet_pfc.data.faces import FACE_SIZE, full_batch
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.errors import CheckpointError, PfcError, mxnet_reason
from mxnet_pfc.runtime.mxnet_files import load_arrays, load_checkpoint
from mxnet_pfc.runtime.run_folder import ModelFiles, RunFolder, split_prefix


class ModelError(PfcError, ValueError):
    """A model that cannot be found or loaded."""


def inference_symbol(network: str, embedding_size: int, output: str = "") -> mx.sym.Symbol:
    """The float32 embedding symbol of a network (registered, or a symbol file and its `output`), without
    dropout."""
    return symbols.get_symbol(network, embedding_size, dropout=0.0, fp16=False, output=output)


def embedding_output(symbol: mx.sym.Symbol, where: str = "the model") -> mx.sym.Symbol:
    """The embedding: the symbol itself, or its fc1_output when it has several outputs (symbols.embedding_of)."""
    try:
        return symbols.embedding_of(symbol, where=where)
    except ValueError as error:
        raise ModelError(str(error)) from None


def fixed_gammas(symbol: mx.sym.Symbol) -> "list[str]":
    """Gamma parameters of BatchNorms with fix_gamma (MXNet's default), which MXNet reads as 1."""
    nodes = json.loads(symbol.tojson())["nodes"]
    return [f"{node['name']}_gamma" for node in nodes if node["op"] == "BatchNorm"
            and node.get("attrs", {}).get("fix_gamma", "True").lower() in ("true", "1")]


def float32_params(symbol: mx.sym.Symbol, arg_params: dict, aux_params: dict, where: str):
    """The parameters `symbol` uses, as float32; a missing one is an error naming it.

    Fixed gammas are set to the 1 MXNet uses: training leaves them where weight
    decay drove them, and other runtimes (ONNX) would read that value.
    """
    wanted_args = [n for n in symbol.list_arguments() if n != "data"]
    wanted_aux = symbol.list_auxiliary_states()
    missing = [n for n in wanted_args if n not in arg_params] + [n for n in wanted_aux if n not in aux_params]
    if missing:
        raise ModelError(f"{where}: parameters missing for the symbol: {', '.join(missing[:6])}")
    args = {n: arg_params[n].astype("float32") for n in wanted_args}
    for name in fixed_gammas(symbol):
        if name in args:
            args[name] = mx.nd.ones_like(args[name])
    return args, {n: aux_params[n].astype("float32") for n in wanted_aux}


def load_backbone(path: str, rank: int, same_world: bool, average: bool = False):
    """(arg_params, aux_params) of checkpoint folder `path` for rank `rank`: rank 0's weights with the
    rank's own BatchNorm statistics; on a different number of ranks (or with average=True) the rank-averaged
    statistics (average=True: the averaged weights too, the model for inference)."""
    average_prefix = os.path.join(path, checkpoints.AVERAGE_MODEL)
    try:
        _, arg_params, aux_params = load_checkpoint(
            average_prefix if average else os.path.join(path, checkpoints.MODEL), 0, CheckpointError)
        own = checkpoints.aux_file(path, rank)
        if same_world and not average and os.path.exists(own):
            aux_params = load_arrays(own, CheckpointError)
        elif not average:
            _, _, aux_params = load_checkpoint(average_prefix, 0, CheckpointError)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read the backbone: {mxnet_reason(error)}") from None
    return arg_params, aux_params


def model_of_run_folder(path: str) -> str:
    """The model a training output folder holds: its exported prefix, else its latest checkpoint folder."""
    run = RunFolder(path)
    if os.path.exists(run.model_files.symbol):
        return run.model
    newest = checkpoints.latest(run.checkpoints)
    if newest is not None:
        return newest.path
    raise ModelError(f"{path}: a folder without a model (model-symbol.json), checkpoint (state.json) "
                     "or checkpoints/")


def load_model(path: str):
    """(symbol, arg_params, aux_params, description) of the model `path` names (see the module docstring)."""
    if os.path.isdir(path):
        if checkpoints.is_checkpoint(path):
            state = checkpoints.State.read(path)
            arg_params, aux_params = load_backbone(path, 0, same_world=False, average=True)
            if symbols.is_symbol_file(state.network):        # the graph as trained, saved beside its parameters
                symbol = load_checkpoint(os.path.join(path, checkpoints.AVERAGE_MODEL), 0, ModelError)[0]
            else:
                symbol = inference_symbol(state.network, state.embedding_size)
            arg_params, aux_params = float32_params(symbol, arg_params, aux_params, path)
            return symbol, arg_params, aux_params, f"checkpoint {path} ({state.network}, step {state.step})"
        return load_model(model_of_run_folder(path))
    prefix, epoch = split_prefix(path)
    files = [ModelFiles(prefix).symbol, ModelFiles(prefix).params(epoch)]
    if not all(os.path.exists(f) for f in files):
        raise ModelError(f"{path}: no model there: expected {' + '.join(files)}, a checkpoint folder or "
                         "a training output folder")
    symbol, arg_params, aux_params = load_checkpoint(prefix, epoch, ModelError)
    symbol = embedding_output(symbol, prefix)
    arg_params, aux_params = float32_params(symbol, arg_params, aux_params, path)
    return symbol, arg_params, aux_params, f"model {prefix}-{epoch:04d}"


class Embedder:
    """A symbol bound for inference at a fixed batch size; embed() takes any number of images."""

    def __init__(self, symbol: mx.sym.Symbol, ctx: mx.Context, batch_size: int = 64, image_size: int = FACE_SIZE):
        self.symbol, self.ctx, self.batch_size = symbol, ctx, batch_size
        self.data_shape = (batch_size, 3, image_size, image_size)
        self.module = None

    def set_params(self, arg_params: dict, aux_params: dict) -> None:
        """Binds afresh for each set of parameters.

        MXNet 1.9's MKLDNN backend caches reordered convolution weights of an
        inference executor: set_params on an executor that has already run can
        leave it computing with the old weights (seen: a second evaluation gave
        another accuracy than a fresh module did for the same parameters).
        """
        self.module = mx.mod.Module(self.symbol, data_names=["data"], label_names=None, context=self.ctx)
        self.module.bind(data_shapes=[("data", self.data_shape)], for_training=False)
        self.module.set_params(arg_params, aux_params, allow_missing=False, force_init=True)

    def __call__(self, images: np.ndarray) -> np.ndarray:
        """Raw embeddings (n, D) float32 of RGB 0..255 images (n, 3, H, W), n <= batch_size."""
        if self.module is None:
            raise RuntimeError("Embedder: set_params() before embedding")
        batch = mx.nd.array(full_batch(images, self.batch_size), dtype="float32")
        self.module.forward(mx.io.DataBatch([batch]), is_train=False)
        return self.module.get_outputs()[0].asnumpy()[:len(images)]        # host sync point
