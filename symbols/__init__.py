"""Backbones as MXNet symbols, chosen by name through a registry (never `eval`), or read from a file.

Every backbone maps `data` (N x 3 x 112 x 112, raw 0..255 pixels) to a float32
embedding (N x embedding_size). A network given as the path of an MXNet symbol
file (`*-symbol.json`, as mx.model.save_checkpoint writes it: InsightFace's
models, another project's graph) must do the same; its embedding is the graph's
only output, or the internal output named by `output` (InsightFace's
`fc1_output`), and its width is the graph's own.
"""
import os
from functools import partial

import mxnet as mx

from mxnet_pfc.runtime.symbol_file import load_symbol

from . import iresnet, mobilefacenet

INPUT_SHAPE = (3, 112, 112)

NETWORKS = {
    "r18": partial(iresnet.get_symbol, 18),
    "r34": partial(iresnet.get_symbol, 34),
    "r50": partial(iresnet.get_symbol, 50),
    "r100": partial(iresnet.get_symbol, 100),
    "mbf": mobilefacenet.get_symbol,
    # iResNet-18 at quarter width behind a stride-4 stem: ~40x cheaper, sized for
    # CPU runs (the synthetic default, the tests)
    "r18-lite": partial(iresnet.get_symbol, 18, width_mult=0.25, stem_stride=4),
}


def names():
    return sorted(NETWORKS)


def is_symbol_file(network):
    """Whether `network` names a symbol file rather than a registered network."""
    return network not in NETWORKS and network.endswith(".json")


def get_symbol(name, embedding_size=512, dropout=0.0, fp16=False, output=""):
    """The embedding symbol of the registered network `name`, or of the symbol file `name` (`output`: the
    internal output to take; embedding_size must be the file's, dropout 0 and fp16 off: the graph is as
    written)."""
    if is_symbol_file(name):
        symbol = load_symbol_file(name, output)
        width = embedding_width(symbol, name)
        if width != embedding_size or dropout or fp16:
            raise ValueError(f"{name}: the graph is used as written (embedding {width}, no dropout, float32); "
                             f"asked for embedding {embedding_size}, dropout {dropout}, fp16 {fp16}")
        return symbol
    try:
        build = NETWORKS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; registered: {', '.join(names())}, or the path of an MXNet "
                         "symbol file (*.json)") from None
    return build(embedding_size=embedding_size, dropout=dropout, fp16=fp16)


def load_symbol_file(path, output=""):
    """The embedding graph in symbol file `path`: its output `output` ('fc1' or 'fc1_output'), else its
    only output, else its `fc1_output` (InsightFace's training graphs have the classifier's outputs too).
    Raises ValueError naming the file and what is wrong with it."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such symbol file")
    symbol = load_symbol(path)      # checked before MXNet parses it: no operator that no file may use
    symbol = embedding_of(symbol, output, path)
    arguments = symbol.list_arguments()
    if "data" not in arguments:
        raise ValueError(f"{path}: the graph has no input named 'data' (its inputs: {', '.join(arguments[:6])})")
    labels = [name for name in arguments if name.endswith("_label") or name == "label"]
    if labels:
        raise ValueError(f"{path}: the chosen output depends on the label input(s) {', '.join(labels)}: it is a "
                         "training head, not the embedding; name the embedding with --network_output "
                         "(InsightFace's: fc1_output)")
    return symbol


def embedding_of(symbol, output="", where="the graph"):
    """The embedding of a graph: its internal output `output` ('fc1' or 'fc1_output'), else its only output,
    else its `fc1_output` (InsightFace's training graphs also output the classifier's softmax). ValueError
    naming `where` when there is none of these."""
    available = symbol.get_internals().list_outputs()
    if output:
        wanted = output if output in available else f"{output}_output"
        if wanted not in available:
            near = [name for name in available if name.endswith("_output") and output.split("_")[0] in name]
            raise ValueError(f"{where}: the graph has no output {output!r}"
                             + (f" (similar: {', '.join(near[:5])})" if near else ""))
        return symbol.get_internals()[wanted]
    outputs = symbol.list_outputs()
    if len(outputs) == 1:
        return symbol
    if "fc1_output" not in available:
        raise ValueError(f"{where}: the graph has {len(outputs)} outputs ({', '.join(outputs)}) and no fc1_output; "
                         "name the embedding with --network_output")
    return symbol.get_internals()["fc1_output"]


def parameter_shapes(symbol, data_shape):
    """({argument: shape}, {auxiliary state: shape}) of `symbol`'s parameters for input `data` of data_shape
    (its other inputs, a distilled student's teacher embedding, are not parameters of a file)."""
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=data_shape)
    return ({name: tuple(shape) for name, shape in zip(symbol.list_arguments(), arg_shapes) if name != "data"},
            {name: tuple(shape) for name, shape in zip(symbol.list_auxiliary_states(), aux_shapes)})


def embedding_width(symbol, where):
    """The embedding width D of `symbol` for N x 3 x 112 x 112 input; ValueError naming `where` if the
    graph does not map faces of that size to an N x D matrix."""
    try:
        _, out_shapes, _ = symbol.infer_shape(data=(2, *INPUT_SHAPE))
    except mx.base.MXNetError as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        raise ValueError(f"{where}: the graph does not take 3 x 112 x 112 faces as `data` "
                         f"({lines[-1].strip() if lines else 'shape inference failed'})") from None
    if out_shapes is None or len(out_shapes[0]) != 2 or out_shapes[0][0] != 2:
        raise ValueError(f"{where}: the graph's output for 2 faces has shape {out_shapes and out_shapes[0]}, "
                         "not 2 x D (an embedding per face)")
    return int(out_shapes[0][1])
