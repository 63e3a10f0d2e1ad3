"""Reading a model's graph (an MXNet symbol file, PREFIX-symbol.json): the one place that does it.

A symbol file is handed around like data (a model zoo, a teacher, a colleague's
run: --network FILE, --pretrained, --teacher, verify/export/embed/ijb), but
MXNet builds any operator a graph names. Two kinds must never come from a file:
this project's own kernels (operators named pfc_*, registered in every trainer
before Horovod starts; they update the centers in place), and custom operators
(Custom and its kin: Python code registered in the process). And MXNet's parser
recurses into nested subgraphs: 100,000 levels crash the process.

So the file is read and checked here before MXNet sees it: a regular file of at
most MAX_BYTES, UTF-8 JSON nested at most MAX_DEPTH deep, every node (in
subgraphs too) with an operator name, none refused (refused_operator). MXNet
then parses the checked graph written back as JSON, never the file itself, so
that no construct its parser reads differently from Python's gets past the check.
"""
from __future__ import annotations

import json

from mxnet_pfc.runtime.errors import PfcError, mxnet_reason, quoted
from mxnet_pfc.runtime.files import json_depth, read_regular_file

MAX_BYTES = 32 << 20    # 32 MB: an iResNet-100's graph is 0.3 MB, the largest zoo graphs a few MB
MAX_DEPTH = 64          # JSON nesting: a graph uses 5 levels, 4 more per subgraph (control flow, fused ops)
KERNEL_PREFIX = "pfc_"  # every operator of head/kernels/pfc_kernels.cc (tests/test_graph_safety.py checks)


class SymbolFileError(PfcError, ValueError):
    """A symbol file that cannot be read as a model's graph, or whose graph is refused; names the file."""


def refused_operator(op: str) -> "str | None":
    """Why a graph read from a file may not use operator `op`, or None when it may."""
    if op.lower().startswith(KERNEL_PREFIX):
        return "one of this project's own kernels, which the head alone calls"
    if "custom" in op.lower():
        return "a custom operator, which runs code registered in the process"
    return None


def _read_text(file: str, error_type) -> str:
    """The text of `file`: a regular file of at most MAX_BYTES (files.read_regular_file), UTF-8."""
    data = read_regular_file(file, MAX_BYTES, "a symbol file", error_type)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise error_type(f"{file}: cannot load: not an MXNet symbol file: not UTF-8 text (byte {error.start})") \
            from None


def _check_graph(graph, file: str, error_type, where: str = "") -> None:
    """Every node of `graph` (and of its subgraphs) has a name and an operator that is not refused."""
    if not isinstance(graph, dict) or not isinstance(graph.get("nodes"), list):
        raise error_type(f"{file}: cannot load: not an MXNet symbol file: {where or 'the top level'} has no "
                         "list of nodes")
    for number, node in enumerate(graph["nodes"]):
        if not (isinstance(node, dict) and isinstance(node.get("op"), str) and isinstance(node.get("name"), str)):
            raise error_type(f"{file}: cannot load: not an MXNet symbol file: node {number}{where} has no "
                             "operator and name")
        op, name = node["op"], node["name"]
        why = refused_operator(op)
        if why:
            raise error_type(f"{file}: refused: node {number}{where} ({quoted(name, 80)}) is operator "
                             f"{quoted(op, 80)}, {why}; a model's graph may not use it")
        subgraphs = node.get("subgraphs", [])
        if not isinstance(subgraphs, list):
            raise error_type(f"{file}: cannot load: not an MXNet symbol file: the subgraphs of node {number}{where} "
                             "are not a list")
        for k, subgraph in enumerate(subgraphs):
            _check_graph(subgraph, file, error_type, f" of subgraph {k} of node {number}{where}")


def read_graph(file: str, error_type=SymbolFileError) -> dict:
    """The checked JSON graph of symbol file `file` (see the module docstring); error_type naming the file and
    the problem otherwise. Needs no MXNet."""
    text = _read_text(file, error_type)
    if json_depth(text) > MAX_DEPTH:           # json's parser recurses, and MXNet's crashes, on deep nesting
        raise error_type(f"{file}: cannot load: JSON nested more than {MAX_DEPTH} levels deep: not a model's graph")
    try:
        graph = json.loads(text)
    except ValueError as error:
        raise error_type(f"{file}: cannot load: not an MXNet symbol file: not JSON ({error})") from None
    _check_graph(graph, file, error_type)
    return graph


def load_symbol(file: str, error_type=SymbolFileError):
    """The mx.sym.Symbol of symbol file `file`, read and checked by read_graph first; every failure is
    error_type naming the file."""
    import mxnet as mx

    graph = read_graph(file, error_type)
    try:
        return mx.sym.load_json(json.dumps(graph))
    except (mx.base.MXNetError, UnicodeDecodeError) as error:
        raise error_type(f"{file}: cannot load: {mxnet_reason(error)}") from None
