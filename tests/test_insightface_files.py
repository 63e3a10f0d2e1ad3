"""The fixtures of insightface_files.py: insightface's code runs here and writes what its trainers write."""
import hashlib
import json
import re
import sys

import mxnet as mx
import numpy as np
import pytest

import insightface_files as insightface

BATCH = 2
WIDTH = 64


def embed(symbol, arg=None, aux=None):
    """The graph's inference output for a seeded batch of raw 0..255 images."""
    exe = symbol.simple_bind(mx.cpu(), data=(BATCH,) + insightface.IMAGE_SHAPE, grad_req="null")
    if arg is not None:
        exe.copy_params_from(arg, aux)
    exe.arg_dict["data"][:] = np.random.default_rng(0).uniform(0, 255, (BATCH,) + insightface.IMAGE_SHAPE)
    return exe.forward(is_train=False)[0].asnumpy()


def normalises_inside(symbol) -> bool:
    """Their graphs take raw pixels: (data - 127.5) * 0.0078125 are among the first operators."""
    ops = [(node["op"], node.get("attrs", {}).get("scalar")) for node in json.loads(symbol.tojson())["nodes"][:4]]
    return ("_minus_scalar", "127.5") in ops and ("_mul_scalar", "0.0078125") in ops


@pytest.mark.parametrize("build", [lambda: insightface.arcface_symbol("fresnet", WIDTH),
                                   lambda: insightface.arcface_symbol("fmobilefacenet", WIDTH),
                                   lambda: insightface.partial_fc_symbol(WIDTH)],
                         ids=["fresnet", "fmobilefacenet", "partial_fc"])
def test_symbols(build):
    symbol = build()
    assert symbol.list_arguments()[0] == "data" and symbol.list_outputs() == ["fc1_output"]
    _, [shape], _ = symbol.infer_shape(data=(BATCH,) + insightface.IMAGE_SHAPE)
    assert shape == (BATCH, WIDTH)
    assert normalises_inside(symbol)


def test_model_zoo(tmp_path):
    written = insightface.write_model_zoo(tmp_path / "zoo" / "model", "fmobilefacenet", WIDTH, 10, seed=0)
    assert written["params"] == tmp_path / "zoo" / "model-0000.params" and written["symbol"].exists()
    keys = mx.nd.load(str(written["params"])).keys()
    assert {key.split(":")[0] for key in keys} == {"arg", "aux"}
    symbol, arg, aux = mx.model.load_checkpoint(written["prefix"], 0)
    assert symbol.list_outputs() == ["fc1_output"]
    assert set(arg) == set(symbol.list_arguments()) - {"data"} and set(aux) == set(symbol.list_auxiliary_states())
    assert written["fc7_weight"].shape == (10, WIDTH) and not any(key.startswith("fc7") for key in arg)
    assert all(value.asnumpy().min() > 0 for key, value in aux.items() if key.endswith("moving_var"))
    out = embed(symbol, arg, aux)
    assert out.shape == (BATCH, WIDTH) and np.isfinite(out).all()

    whole = insightface.write_model_zoo(tmp_path / "whole" / "model", "fmobilefacenet", WIDTH, 10, seed=0,
                                        ckpt_embedding=False)
    _, arg, _ = mx.model.load_checkpoint(whole["prefix"], 0)
    assert arg["fc7_weight"].shape == (10, WIDTH)


def test_partial_fc_run(tmp_path):
    run = insightface.write_partial_fc_run(tmp_path, num_classes=10, world_size=4, embedding_size=WIDTH, seed=0)
    assert run["num_local"] == 3            # ceil(10 / 4): rank 3 holds class 9 and two unused rows
    for name, full in (("centers_files", run["centers"]), ("momentum_files", run["momentum"])):
        shards = [mx.nd.load(str(path)) for path in run[name]]
        assert all(isinstance(s, list) and len(s) == 1 and s[0].shape == (3, WIDTH) and s[0].dtype == np.float32
                   for s in shards)
        rows = np.concatenate([s[0].asnumpy() for s in shards])
        np.testing.assert_array_equal(rows[:10], full)
        assert (rows[10:] == insightface.PAD_VALUE).all()

    symbol, arg, aux = mx.model.load_checkpoint(run["prefix"], 0)
    _, average_arg, average_aux = mx.model.load_checkpoint(run["average_prefix"], 0)
    assert symbol.list_arguments()[0] == "data" and symbol.list_outputs() == ["fc1_output"]
    assert all((arg[k] == average_arg[k]).min() == 1 for k in arg)     # the ranks' weights are the same
    assert any((aux[k] != average_aux[k]).max() == 1 for k in aux)     # their BatchNorm stats are not
    out = embed(symbol, arg, aux)
    assert out.shape == (BATCH, WIDTH) and np.isfinite(out).all()


def test_leaves_nothing_behind():
    path = list(sys.path)
    names = ("config", "default", "symbol", "symbol_utils", "easydict", "sklearn", "horovod", "horovod.mxnet")
    modules = {name: sys.modules.get(name) for name in names}
    insightface.arcface_symbol("fresnet", WIDTH)
    insightface.partial_fc_symbol(WIDTH)
    assert sys.path == path
    assert not [name for name, module in sys.modules.items() if insightface._from_copies(module)]
    assert {name: sys.modules.get(name) for name in names} == modules


def test_copies_are_unmodified():
    """Every file under third_party/insightface has the git blob id its README gives (that of insightface's
    commit), and the README lists every file."""
    readme = (insightface.THIRD_PARTY / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([^`]+)` \| `[^`]+`[^|]* \| `([0-9a-f]{40})` \|$", readme, re.M))
    files = {str(path.relative_to(insightface.THIRD_PARTY)) for path in insightface.THIRD_PARTY.rglob("*")
             if path.is_file() and "__pycache__" not in path.parts and path.name != "README.md"}
    assert set(rows) == files
    for name, blob in rows.items():
        data = (insightface.THIRD_PARTY / name).read_bytes()
        assert hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() == blob, name
