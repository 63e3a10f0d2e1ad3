"""A model's graph cannot reach the project's kernels, which leave the process as they found it (issue 33 items 2, 7).

- Symbol files are data from anyone: one reader (runtime/symbol_file.py) checks the JSON before MXNet parses
  it and refuses this project's kernels (pfc_*) and custom operators anywhere in the graph, naming the node;
  JSON nested 100,000 deep (which crashes MXNet's own parser) and oversized files are named errors. Through
  the trainer (config.sh, 2 ranks: --network, --teacher, --pretrained) and `verify` / `export`.
- Every index a fused kernel takes is checked before it touches a row: an out-of-range, negative, unsorted or
  repeated index (or a target outside the columns) is an MXNetError naming the op and the index, the buffers
  stay as they were, and the process goes on.
- Loading the kernels leaves the process's floating point alone (no flush-to-zero from -ffast-math's startup
  code).
"""
import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launch import REPO, config_sh, own_set_run, rank_env, rank_stop_line, run_command
from mxnet_pfc.head.kernels import build

nd = mx.nd
WIDTH = 8           # the kernel graph's embedding width


def reader():
    """runtime/symbol_file, imported where a test uses it: the tests through the commands, the trainer and the
    kernels run on code without it too (issue 33 asks each to be shown failing there)."""
    from mxnet_pfc.runtime import symbol_file
    return symbol_file


def command(module: str, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    """python -m mxnet_pfc.MODULE ARGS as a user runs it."""
    return subprocess.run([sys.executable, "-m", f"mxnet_pfc.{module}", *map(str, args)], cwd=REPO, env=rank_env(),
                          capture_output=True, text=True, timeout=timeout)


# --- graphs written the way an attacker writes them ---------------------------------------------------------

def variable(name: str, **attrs) -> dict:
    return {"op": "null", "name": name, "inputs": [], **({"attrs": attrs} if attrs else {})}


def kernel_graph(op: str = "pfc_sgd_rows") -> dict:
    """The issue's graph: data -> a 2 x WIDTH embedding that passes every shape check, plus (behind a BlockGrad,
    added to it times 0) a pfc_sgd_rows node whose index is the constant 1,000,000 into a 1-row bank (auxiliary
    states named so that MXNet's initializer fills them: the trainer builds the graph as it is)."""
    bank = dict(__shape__=f"(1, {WIDTH})", __dtype__="0", __storage_type__="0")
    nodes = [variable("data"),
             {"op": "Pooling", "name": "grid", "inputs": [[0, 0, 0]],
              "attrs": {"kernel": "(16, 16)", "stride": "(16, 16)", "pool_type": "avg"}},
             variable("fc1_weight"), variable("fc1_bias"),
             {"op": "FullyConnected", "name": "fc1", "attrs": {"num_hidden": str(WIDTH)},
              "inputs": [[1, 0, 0], [2, 0, 0], [3, 0, 0]]},
             variable("bank_beta", **bank), variable("bank_mom_beta", **bank),
             {"op": "_ones", "name": "grad", "attrs": {"shape": f"(1, {WIDTH})"}, "inputs": []},
             {"op": "_zeros", "name": "coef", "attrs": {"shape": "(1,)"}, "inputs": []},
             {"op": "_full", "name": "index", "attrs": {"shape": "(1,)", "dtype": "int32", "value": "1000000"},
              "inputs": []},
             {"op": op, "name": "evil", "attrs": {"lr": "1", "momentum": "0", "wd": "0"},
              "inputs": [[5, 0, 0], [6, 0, 0], [7, 0, 0], [8, 0, 0], [9, 0, 0]]},
             {"op": "BlockGrad", "name": "quiet", "inputs": [[10, 0, 0]]},
             {"op": "_mul_scalar", "name": "nothing", "attrs": {"scalar": "0"}, "inputs": [[11, 0, 0]]},
             {"op": "broadcast_add", "name": "embedding", "inputs": [[4, 0, 0], [12, 0, 0]]}]
    return {"nodes": nodes, "arg_nodes": [0, 2, 3, 5, 6], "node_row_ptr": list(range(len(nodes) + 1)),
            "heads": [[13, 0, 0]], "attrs": {"mxnet_version": ["int", 10901]}}


def write_model(prefix: Path, graph: "dict | str") -> str:
    """PREFIX-symbol.json (the graph, or text as it is) and PREFIX-0000.params with the graph's parameters."""
    Path(f"{prefix}-symbol.json").write_text(graph if isinstance(graph, str) else json.dumps(graph))
    mx.nd.save(f"{prefix}-0000.params", {"arg:fc1_weight": mx.nd.ones((WIDTH, 147)) * 0.01,
                                         "arg:fc1_bias": mx.nd.zeros((WIDTH,)),
                                         "aux:bank_beta": mx.nd.zeros((1, WIDTH)),
                                         "aux:bank_mom_beta": mx.nd.zeros((1, WIDTH))})
    return str(prefix)


def nested_subgraphs(levels: int) -> str:
    """A graph whose one node holds a subgraph whose one node holds a subgraph ... `levels` deep (10 MB at
    100,000): MXNet's parser recurses into each and crashes the process."""
    head = '{"nodes": [{"op": "_foreach", "name": "loop", "inputs": [], "subgraphs": ['
    tail = ']}], "arg_nodes": [], "heads": []}'
    inner = '{"nodes": [{"op": "null", "name": "x", "inputs": []}], "arg_nodes": [0], "heads": [[0, 0, 0]]}'
    return head * levels + inner + tail * levels


def test_the_kernel_graph_is_what_the_issue_describes():
    """Small, and (read by MXNet itself, with the kernels loaded) it maps data to 2 x WIDTH: every shape check
    of a --network file passes. This is the graph the refusals below are shown on."""
    assert build.load_fused()
    text = json.dumps(kernel_graph())
    assert len(text) < 3000
    symbol = mx.sym.load_json(text)
    _, out_shapes, _ = symbol.infer_shape(data=(2, 3, 112, 112))
    assert out_shapes == [(2, WIDTH)]
    assert symbol.list_auxiliary_states() == ["bank_beta", "bank_mom_beta"]


# --- the one reader of symbol files ---------------------------------------------------------------------

def test_every_operator_the_kernels_register_is_refused_in_a_graph():
    """Whatever pfc_kernels.cc registers (read from MXNet's registry before and after loading it, in a fresh
    process) carries the prefix the reader refuses; so do MXNet's custom operators."""
    symbol_file = reader()
    code = ("import json, mxnet as mx; before = set(mx.operator.get_all_registered_operators()); "
            "from mxnet_pfc.head.kernels.build import load_fused; assert load_fused(); "
            "after = set(mx.operator.get_all_registered_operators()); "
            "print(json.dumps({'kernels': sorted(after - before), 'all': sorted(after)}))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=rank_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ops = json.loads(proc.stdout.strip().splitlines()[-1])
    wanted = {"pfc_sgd_rows", "pfc_subcenter_pool", "pfc_subcenter_route"}
    assert len(ops["kernels"]) == 8 and wanted <= set(ops["kernels"]), ops["kernels"]
    for op in ops["kernels"]:
        assert op.startswith(symbol_file.KERNEL_PREFIX) and symbol_file.refused_operator(op), op
    custom = [op for op in ops["all"] if "custom" in op.lower()]
    assert "Custom" in custom and "_CustomFunction" in custom
    assert all(symbol_file.refused_operator(op) for op in custom)
    assert not symbol_file.refused_operator("Convolution") and not symbol_file.refused_operator("null")


@pytest.mark.parametrize("op", ["pfc_sgd_rows", "pfc_logits", "pfc_center_step", "Custom", "_CustomFunction"])
def test_a_graph_with_a_refused_operator_is_named_before_mxnet_reads_it(tmp_path, op):
    symbol_file = reader()
    file = tmp_path / "evil-symbol.json"
    file.write_text(json.dumps(kernel_graph(op)))
    with pytest.raises(symbol_file.SymbolFileError, match=rf"{file}: refused: node 10 \('evil'\) is operator '{op}'"):
        symbol_file.read_graph(str(file))
    with pytest.raises(symbol_file.SymbolFileError, match="a model's graph may not use it"):
        symbol_file.load_symbol(str(file))


def test_a_refused_operator_inside_a_subgraph_is_named(tmp_path):
    symbol_file = reader()
    inner = kernel_graph()
    graph = {"nodes": [variable("data"), {"op": "_foreach", "name": "loop", "inputs": [[0, 0, 0]],
                                          "subgraphs": [inner]}], "arg_nodes": [0], "heads": [[1, 0, 0]]}
    file = tmp_path / "loop-symbol.json"
    file.write_text(json.dumps(graph))
    with pytest.raises(symbol_file.SymbolFileError,
                       match=r"node 10 of subgraph 0 of node 1 \('evil'\) is operator 'pfc_sgd_rows'"):
        symbol_file.read_graph(str(file))


def test_mxnet_parses_what_was_checked(tmp_path):
    """A name written twice in a node: MXNet gets the JSON written back from what was checked, never the
    file's text, so no construct the two parsers read differently can pass the check."""
    symbol_file = reader()
    file = tmp_path / "twice-symbol.json"
    text = json.dumps(kernel_graph("relu")).replace('"op": "relu"', '"op": "pfc_sgd_rows", "op": "relu"')
    file.write_text(text)
    symbol = symbol_file.load_symbol(str(file))
    assert "pfc_sgd_rows" not in symbol.tojson()
    file.write_text(text.replace('"op": "pfc_sgd_rows", "op": "relu"', '"op": "relu", "op": "pfc_sgd_rows"'))
    with pytest.raises(symbol_file.SymbolFileError, match="refused"):
        symbol_file.load_symbol(str(file))


@pytest.mark.parametrize("case", ["nested", "subgraphs", "large", "fifo", "not utf-8", "not json", "no nodes"])
def test_a_file_that_is_not_a_graph_is_a_named_error(tmp_path, case):
    symbol_file = reader()
    file = tmp_path / f"{case}-symbol.json"
    expected = {"nested": "JSON nested more than 64 levels deep", "subgraphs": "JSON nested more than 64 levels",
                "large": "more than a symbol file may be (the limit is 33,554,432 bytes)",
                "fifo": "is not a regular file (a FIFO): a symbol file is read only from a regular file",
                "not utf-8": "not UTF-8 text (byte 1)",
                "not json": "not JSON (Expecting value", "no nodes": "the top level has no list of nodes"}[case]
    if case == "fifo":
        os.mkfifo(file)
    else:
        file.write_bytes({"nested": lambda: b"[" * 100_000 + b"]" * 100_000,
                          "subgraphs": lambda: nested_subgraphs(100).encode(),
                          "large": lambda: b" " * (symbol_file.MAX_BYTES + 1) + b"{}",
                          "not utf-8": lambda: b'"\xff"', "not json": lambda: b'{"nodes": [',
                          "no nodes": lambda: b'{"heads": []}'}[case]())
    with pytest.raises(symbol_file.SymbolFileError) as refused:
        symbol_file.load_symbol(str(file))
    assert str(refused.value).startswith(str(file)) and expected in str(refused.value), refused.value


def test_only_the_reader_hands_symbol_files_to_mxnet():
    """No module but runtime/symbol_file.py parses a graph with MXNet (mx.sym.load, load_json, fromjson,
    SymbolBlock.imports, mx.model.load_checkpoint): a new caller cannot skip the check by accident."""
    parsers = {"load", "load_json", "fromjson", "imports", "load_checkpoint"}
    found = []
    for path in sorted([*(REPO / "mxnet_pfc").rglob("*.py"), *(REPO / "symbols").rglob("*.py")]):
        if path == REPO / "mxnet_pfc" / "runtime" / "symbol_file.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in parsers and \
                    ast.unparse(node.value) in ("mx.sym", "mx.symbol", "mx.model", "sym", "symbol", "SymbolBlock",
                                                "mx.gluon.nn.SymbolBlock", "nn.SymbolBlock"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, found


# --- through the commands and the trainer, as users run them -------------------------------------------------

@pytest.mark.parametrize("cmd", ["verify", "export"])
def test_verify_and_export_refuse_a_model_that_calls_the_kernels(tmp_path, cmd):
    prefix = write_model(tmp_path / "evil", kernel_graph())
    args = {"verify": [prefix, tmp_path / "lfw.bin"], "export": [prefix, "--prefix", tmp_path / "out"]}[cmd]
    proc = command(cmd, *args)
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert f"mxnet_pfc.{cmd}: {prefix}-symbol.json: refused: node 10 ('evil') is operator 'pfc_sgd_rows'" \
        in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("out*"))


def test_verify_names_a_graph_nested_100000_deep_where_mxnet_would_crash(tmp_path):
    """100,000 nested subgraphs (10 MB): MXNet's parser overflows its stack (SIGSEGV); the reader refuses the
    file first."""
    prefix = write_model(tmp_path / "deep", nested_subgraphs(100_000))
    proc = command("verify", prefix, tmp_path / "lfw.bin")
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert f"mxnet_pfc.verify: {prefix}-symbol.json: cannot load: JSON nested more than 64 levels deep" \
        in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def fake_checkpoint(folder: Path) -> Path:
    """A folder that --pretrained takes for a checkpoint (state.json), whose averaged model is the kernel graph."""
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    write_model(folder / "model-average", kernel_graph())
    return folder


@pytest.mark.parametrize("option", ["network", "teacher", "pretrained"])
def test_the_trainer_refuses_the_kernel_graph_on_every_rank_at_setup(set_b, tmp_path, option):
    """horovodrun, config.sh, 2 ranks: the graph as --network FILE, --teacher PREFIX or --pretrained CHECKPOINT
    stops both ranks before step 1, naming the file and the node (before: the heap was corrupted, glibc
    aborted or the rank died of SIGSEGV)."""
    prefix = write_model(tmp_path / "evil", kernel_graph())
    if option == "pretrained":
        value = fake_checkpoint(tmp_path / "step-8")
        file = value / "model-average-symbol.json"
    else:
        value = f"{prefix}-symbol.json" if option == "network" else prefix
        file = f"{prefix}-symbol.json"
    proc = run_command(config_sh(*own_set_run(set_b, tmp_path / "run", "--max_update", 2, f"--{option}", value)),
                       timeout=300)
    assert proc.returncode != 0, proc.stdout[-4000:]
    for rank in range(2):
        line = rank_stop_line(proc.stdout, rank)
        assert f"{file}: refused: node 10 ('evil') is operator 'pfc_sgd_rows'" in line, proc.stdout[-4000:]
    assert "step 1/" not in proc.stdout and "Traceback" not in proc.stdout, proc.stdout[-4000:]


# --- the kernels check every index they take --------------------------------------------------------------

@pytest.fixture(scope="module")
def kernels():
    assert build.load_fused(), "the fused kernels should build on this machine"


R, D, N = 20, 4, 3


def buffers(rng=None):
    rng = rng or np.random.default_rng(0)
    return {"weight": rng.normal(size=(R, D)).astype(np.float32), "mom": rng.normal(size=(R, D)).astype(np.float32),
            "xh": rng.normal(size=(N, D)).astype(np.float32)}


def call(op: str, index: np.ndarray, arrays: dict) -> dict:
    """Run kernel `op` with `index` (S,) on NDArrays of `arrays`; returns the NDArrays (weight and mom as the
    kernel left them)."""
    S = index.shape[0]
    a = {k: nd.array(v) for k, v in arrays.items()}
    idx = nd.array(index, dtype="int32")
    if op == "pfc_sgd_rows":
        nd.pfc_sgd_rows(a["weight"], a["mom"], nd.ones((S, D)), nd.zeros((S,)), idx, lr=0.1, momentum=0.9, wd=0.0)
    elif op == "pfc_logits":
        a["out"], a["inv"] = nd.zeros((N, S)), nd.zeros((S,))
        nd.pfc_logits(a["xh"], a["weight"], idx, out=[a["out"], a["inv"]])
    else:
        a["grad_xh"] = nd.pfc_center_step(nd.ones((N, S)), a["xh"], nd.zeros((S,)), idx, a["weight"], a["mom"],
                                          lr=0.1, momentum=0.9, wd=0.0)
    nd.waitall()
    return a


BAD_INDEXES = {"one past the end": ([3, R], f"index[1] = {R} is outside [0, {R}), the rows of weight"),
               "negative": ([-1, 4], f"index[0] = -1 is outside [0, {R})"),
               "the largest int32": ([0, 2 ** 31 - 1], "index[1] = 2147483647 is outside"),
               "unsorted": ([5, 2, 7], "index[1] = 2 follows index[0] = 5; the index must be sorted and unique"),
               "repeated": ([5, 5], "index[1] = 5 follows index[0] = 5")}


@pytest.mark.parametrize("case", list(BAD_INDEXES))
@pytest.mark.parametrize("op", ["pfc_sgd_rows", "pfc_logits", "pfc_center_step"])
def test_a_kernel_refuses_an_index_outside_its_rows_and_touches_nothing(kernels, op, case):
    index, expected = BAD_INDEXES[case]
    arrays = buffers()
    kept = {}
    with pytest.raises(mx.base.MXNetError) as refused:
        kept = call(op, np.array(index), arrays)
    assert f"Error calling FCompute for custom operator '{op}'" in str(refused.value)
    assert f"{op}: {expected}" in str(refused.value).strip().splitlines()[-1], str(refused.value)[-600:]
    assert kept == {}
    # the process goes on, and the same kernel on a good index gives the float64 result
    good = np.array([2, 7, 19])
    result = call(op, good, arrays)
    if op == "pfc_logits":
        np.testing.assert_allclose(result["out"].asnumpy(), arrays["xh"] @ arrays["weight"][good].T, rtol=1e-5)
    else:
        others = np.setdiff1d(np.arange(R), good)
        assert np.array_equal(result["weight"].asnumpy()[others], arrays["weight"][others])
        assert not np.array_equal(result["weight"].asnumpy()[good], arrays["weight"][good])


@pytest.mark.parametrize("op", ["pfc_sgd_rows", "pfc_center_step"])
def test_a_refused_update_leaves_the_bank_as_it_was(kernels, op):
    """The index is checked before any row moves: with a bad index last, no earlier row has been updated."""
    arrays = buffers()
    weight, mom = nd.array(arrays["weight"]), nd.array(arrays["mom"])
    idx = nd.array([0, 1, 2, 3, R + 5], dtype="int32")
    with pytest.raises(mx.base.MXNetError, match=f"{op}: index\\[4\\] = {R + 5} is outside"):
        if op == "pfc_sgd_rows":
            nd.pfc_sgd_rows(weight, mom, nd.ones((5, D)), nd.zeros((5,)), idx, lr=0.1, momentum=0.9, wd=0.0)
        else:
            nd.pfc_center_step(nd.ones((N, 5)), nd.array(arrays["xh"]), nd.zeros((5,)), idx, weight, mom,
                               lr=0.1, momentum=0.9, wd=0.0)
        nd.waitall()
    assert np.array_equal(weight.asnumpy(), arrays["weight"]) and np.array_equal(mom.asnumpy(), arrays["mom"])


@pytest.mark.parametrize("op", ["pfc_scale_lse", "pfc_softmax_grad"])
@pytest.mark.parametrize("bad", [5, -1, 1 << 30])
def test_a_target_outside_the_columns_is_refused_where_the_mask_counts(kernels, op, bad):
    """Targets are read only on rows with mask != 0: there one outside [0, S) is refused; elsewhere it is
    never read."""
    S = 5
    rng = np.random.default_rng(1)
    logits = rng.uniform(-1, 1, size=(N, S)).astype(np.float32)

    def run(target, mask):
        args = [nd.array(logits), nd.ones((S,)) if op == "pfc_scale_lse" else nd.zeros((N,))]
        if op == "pfc_softmax_grad":
            args.append(nd.ones((S,)))
        args += [nd.array(target, dtype="int32"), nd.array(mask)]
        if op == "pfc_scale_lse":
            out = nd.pfc_scale_lse(*args)
        else:
            out = nd.pfc_softmax_grad(*args, nd.zeros((N,)), s=1.0, inv_n=1.0)
        nd.waitall()
        return args[0], out

    with pytest.raises(mx.base.MXNetError, match=f"{op}: target\\[1\\] = {bad} is outside \\[0, {S}\\)"):
        run([0, bad, 2], [1.0, 1.0, 1.0])
    scaled, _ = run([0, bad, 2], [1.0, 0.0, 1.0])        # row 1 is another rank's: its target is not read
    assert np.isfinite(scaled.asnumpy()).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.lists(st.integers(-3, R + 3), min_size=1, max_size=8))
def test_any_index_either_updates_its_rows_or_is_refused_leaving_the_bank(kernels, index):
    """pfc_sgd_rows on any small index: sorted, unique and within the rows updates exactly those rows (as the
    float64 formula says); anything else is an MXNetError and the bank is as it was."""
    arrays = buffers()
    index = np.array(index)
    valid = (index >= 0).all() and (index < R).all() and (np.diff(index) > 0).all()
    weight, mom = nd.array(arrays["weight"]), nd.array(arrays["mom"])
    grad = np.ones((len(index), D), np.float32)
    try:
        nd.pfc_sgd_rows(weight, mom, nd.array(grad), nd.zeros((len(index),)), nd.array(index, dtype="int32"),
                        lr=0.1, momentum=0.9, wd=0.0)
        nd.waitall()
        refused = False
    except mx.base.MXNetError as error:
        refused = True
        assert "pfc_sgd_rows: index[" in str(error)
    assert refused != valid
    expected_w, expected_m = arrays["weight"].astype(np.float64), arrays["mom"].astype(np.float64)
    if valid:
        expected_m[index] = 0.9 * expected_m[index] - 0.1 * grad
        expected_w[index] += expected_m[index]
    np.testing.assert_allclose(mom.asnumpy(), expected_m, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weight.asnumpy(), expected_w, rtol=1e-6, atol=1e-7)


# --- the kernels leave the process's floating point alone -------------------------------------------------

def test_loading_the_kernels_keeps_subnormal_numbers():
    """In a fresh process: 1e-310 (float64) and 1e-40 (float32) times 1 keep their values before the kernels
    load, after the head is imported and they are loaded, and after a kernel ran (-ffast-math's startup code
    set flush-to-zero and denormals-are-zero for the whole process: both became 0)."""
    code = """if True:
        import json
        import numpy as np
        def subnormals():
            return [float(np.array([1e-310]) * 1.0), float(np.array([1e-40], np.float32) * np.float32(1))]
        seen = {"before": subnormals()}
        import mxnet as mx
        from mxnet_pfc.head.kernels.ops import head_ops     # the project's path: importing the head, then its ops
        ops = head_ops(mx.cpu())
        seen["loaded"] = subnormals()
        ops.inv_norm(mx.nd.ones((4, 3))).wait_to_read()
        seen["ran"] = subnormals()
        print(json.dumps({"ops": ops.name, **seen}))
    """
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=rank_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen.pop("ops") == "fused"
    expected = [1e-310, float(np.float32(1e-40))]
    assert seen == {"before": expected, "loaded": expected, "ran": expected}


def test_the_kernels_are_not_linked_with_the_fast_math_startup_code(tmp_path):
    """g++'s driver adds crtfastmath.o (which sets FTZ/DAZ when a library loads) for -ffast-math, -Ofast and
    -funsafe-math-optimizations: none of build.FLAGS may bring it in."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        pytest.skip("no C++ compiler")
    source = tmp_path / "empty.cc"
    source.write_text("int nothing() { return 0; }\n")
    proc = subprocess.run([compiler, "-###", *build.FLAGS, str(source), "-o", str(tmp_path / "empty.so")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "collect2" in proc.stderr and "crtfastmath" not in proc.stderr
