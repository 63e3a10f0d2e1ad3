"""Export and inference: what plain MXNet, ONNX Runtime and the verify/embed commands make of a trained model.

A short single-process training run provides the checkpoints. The exported
model must give the trainer's embeddings through mx.model.load_checkpoint +
Module and SymbolBlock.imports at any batch size, and through ONNX Runtime.
"""
import json
import shutil
import sys
from pathlib import Path

import cv2
import mxnet as mx
import numpy as np
import pytest

from launch import ckpt, run_command, tiny_synthetic_run
from mxnet_pfc.data import synthetic_set

IMAGES = np.random.default_rng(5).uniform(0, 255, (5, 3, 112, 112)).astype(np.float32)


def module_embeddings(symbol, arg_params, aux_params, images):
    module = mx.mod.Module(symbol, data_names=["data"], label_names=None)
    module.bind(data_shapes=[("data", images.shape)], for_training=False)
    module.set_params(arg_params, aux_params)
    module.forward(mx.io.DataBatch([mx.nd.array(images)]), is_train=False)
    return module.get_outputs()[0].asnumpy()


def assert_same_embeddings(got, expected, tolerance=1e-5):
    """Equal up to float32 reordering: the error relative to the embeddings' scale."""
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= tolerance * np.abs(expected).max(), np.abs(got - expected).max()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(data folder, output folder) of a 6-step run on one process, dropout on."""
    root = tmp_path_factory.mktemp("trained")
    args = tiny_synthetic_run(root / "data", root / "run", "--max_update", 6, "--save_interval", 3,
                              "--dropout", 0.2, "--frequent", 3)
    proc = run_command([sys.executable, "-m", "mxnet_pfc.train", *args], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return root / "data", root / "run"


def trainer_embeddings(run, images):
    """What the trainer computes: its own training symbol (dropout inactive) and parameters."""
    symbol, arg_params, aux_params = mx.model.load_checkpoint(str(ckpt(run / "checkpoints", 6) / "model"), 0)
    return module_embeddings(symbol, arg_params, aux_params, images)


def test_export_loads_in_plain_mxnet_at_any_batch_size(trained, tmp_path):
    _, run = trained
    prefix = tmp_path / "face"
    proc = run_command([sys.executable, "-m", "mxnet_pfc.export", ckpt(run / "checkpoints", 6),
                        "--prefix", prefix, "--onnx"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    expected = trainer_embeddings(run, IMAGES)
    symbol, arg_params, aux_params = mx.model.load_checkpoint(str(prefix), 0)
    assert symbol.list_outputs() == ["fc1_output"] and "Dropout" not in symbol.tojson()
    for batch in (1, 5):
        got = module_embeddings(symbol, arg_params, aux_params, IMAGES[:batch])
        assert_same_embeddings(got, expected[:batch])
    block = mx.gluon.nn.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-0000.params")
    assert_same_embeddings(block(mx.nd.array(IMAGES[:3])).asnumpy(), expected[:3])
    # ONNX, with a free batch dimension
    onnxruntime = pytest.importorskip("onnxruntime")
    session = onnxruntime.InferenceSession(f"{prefix}.onnx")
    got = session.run(None, {session.get_inputs()[0].name: IMAGES[:3]})[0]
    assert_same_embeddings(got, expected[:3], tolerance=1e-4)


@pytest.fixture(scope="module")
def checked(trained, tmp_path_factory):
    """(prefix, output of `export --check`) for the trained run's final checkpoint."""
    pytest.importorskip("onnxruntime")
    _, run = trained
    prefix = tmp_path_factory.mktemp("checked") / "face"
    proc = run_command([sys.executable, "-m", "mxnet_pfc.export", ckpt(run / "checkpoints", 6),
                        "--prefix", prefix, "--check"], timeout=180)
    return prefix, proc


def test_export_check_passes_on_the_exported_model(checked):
    prefix, proc = checked
    assert proc.returncode == 0, proc.stdout[-3000:]
    report = json.load(open(f"{prefix}-onnx-check.json"))
    assert report["passed"] and all(c["ok"] for c in report["checks"]) and len(report["checks"]) == 15
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("ok: ", "FAILED: "))]
    assert len(lines) == 15 and all(line.startswith("ok: ") for line in lines), proc.stdout[-3000:]
    assert "ok: [MFR server] one input N x 3 x 112 x 112 (N x 3 x 112 x 112)" in lines
    assert ("ok: [MFR server] opset at most 14 and IR version at most 7 (the server's ONNX Runtime 1.8) "
            "(opset 13, IR 7)") in lines
    assert {c["rule"] for c in report["checks"]} == {"MFR server", "ours"}
    # the embeddings check really compares with MXNet: the recorded differences are tiny but measured
    compared = [c for c in report["checks"] if c["name"].startswith("embeddings equal MXNet's")]
    assert len(compared) == 2 and all(0 <= float(c["value"]) < 1e-4 for c in compared)
    assert any(c["name"].startswith("latency per image at batch 32") and c["value"].endswith(" ms")
               for c in report["checks"])


def doctor(onnx_path, out_path, how):
    """A copy of the exported ONNX model with one defect an evaluation server refuses."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    model = onnx.load(onnx_path)
    graph = model.graph
    if how == "fixed batch":
        graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    elif how == "float16":         # the embedding layer's weights stored as float16, cast back to float32 in the graph
        weight = next(t for t in graph.initializer if len(t.dims) == 2)
        half = numpy_helper.from_array(numpy_helper.to_array(weight).astype(np.float16), weight.name + "_half")
        graph.initializer.remove(weight)
        graph.initializer.append(half)
        graph.node.insert(0, helper.make_node("Cast", [half.name], [weight.name], to=TensorProto.FLOAT))
    elif how == "two outputs":
        graph.output.append(helper.make_tensor_value_info(graph.node[-1].input[0], TensorProto.FLOAT, ["N", None]))
    elif how == "uint8":        # an initialiser the server refuses for its width, used or not
        graph.initializer.append(numpy_helper.from_array(np.zeros(4, np.uint8), "lookup_table"))
    elif how == "div":          # the input scaled by a node named Div, which the server accepts with the Sub
        scale = next(node for node in graph.node[:8] if node.name.startswith("_mul"))
        scale.name = "Div_input"
    elif how == "opset 15":
        model.opset_import[0].version = 15
    onnx.checker.check_model(model)
    onnx.save(model, out_path)
    return how, weight.name + "_half" if how == "float16" else ""


@pytest.mark.parametrize("how, failed", [
    ("fixed batch", "FAILED: [ours] batch dimension N free (the server frees a fixed one itself; other runtimes do "
                    "not) (1 x 3 x 112 x 112)"),
    ("float16", "FAILED: [MFR server] no initialiser narrower than 4 bytes an element (float16, uint8 ...) (1; "),
    ("two outputs", "FAILED: [MFR server] exactly one output (2; fc1, "),
    ("uint8", "FAILED: [MFR server] no initialiser narrower than 4 bytes an element (float16, uint8 ...) (1; "
              "lookup_table (uint8))"),
    ("opset 15", "FAILED: [MFR server] opset at most 14 and IR version at most 7 (the server's ONNX Runtime 1.8) "
                 "(opset 15, IR 7)"),
])
def test_onnx_check_fails_a_doctored_model(checked, tmp_path, how, failed):
    """Issue 26: the server refuses initialisers narrower than 4 bytes (uint8 passed before) and an opset its
    ONNX Runtime 1.8 cannot read; a fixed batch is our rule, not the server's (it frees the dimension)."""
    prefix, _ = checked
    _, half_name = doctor(f"{prefix}.onnx", tmp_path / "bad.onnx", how)
    proc = run_command([sys.executable, "-m", "mxnet_pfc.onnx_check", tmp_path / "bad.onnx", "--model", prefix],
                       timeout=120)
    assert proc.returncode == 1 and failed in proc.stdout, proc.stdout[-3000:]
    assert half_name in proc.stdout
    report = json.load(open(tmp_path / "bad-onnx-check.json"))
    failures = [c["name"] for c in report["checks"] if not c["ok"]]
    assert not report["passed"] and failed.split("] ", 1)[1].startswith(failures[0])
    if how == "fixed batch":       # batch 32 cannot run; batch 1 still matches MXNet
        assert "FAILED: [MFR server] finite outputs on a batch of 32 (did not run" in proc.stdout
        assert "ok: [ours] embeddings equal MXNet's at batch 1" in proc.stdout


def test_the_servers_input_rule_accepts_div_and_it_refuses_a_graph_of_fewer_than_8_nodes(checked, tmp_path):
    """The server takes Sub and Div among the first 8 nodes as input scaling (this check failed such a model);
    and it refuses a graph of fewer than 8 nodes, which this check passed."""
    prefix, _ = checked
    doctor(f"{prefix}.onnx", tmp_path / "div.onnx", "div")
    proc = run_command([sys.executable, "-m", "mxnet_pfc.onnx_check", tmp_path / "div.onnx"], timeout=120)
    assert proc.returncode == 0 and "ok: [ours] normalises its own input" in proc.stdout, proc.stdout[-3000:]
    from onnx import TensorProto, helper, numpy_helper
    nodes = [helper.make_node("Sub", ["data", "mean"], ["centred"], name="Sub_0"),
             helper.make_node("Mul", ["centred", "scale"], ["scaled"], name="Mul_0"),
             helper.make_node("Flatten", ["scaled"], ["flat"], name="flatten"),
             helper.make_node("MatMul", ["flat", "weight"], ["embedding"], name="fc1")]
    weights = [numpy_helper.from_array(np.array(127.5, np.float32), "mean"),
               numpy_helper.from_array(np.array(1 / 128, np.float32), "scale"),
               numpy_helper.from_array(np.zeros((3 * 112 * 112, 8), np.float32), "weight")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("data", TensorProto.FLOAT,
                                                                            ["N", 3, 112, 112])],
                              [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["N", 8])], weights)
    tiny = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)
    import onnx
    onnx.save(tiny, tmp_path / "tiny.onnx")
    proc = run_command([sys.executable, "-m", "mxnet_pfc.onnx_check", tmp_path / "tiny.onnx"], timeout=120)
    assert proc.returncode == 1 and "FAILED: [MFR server] at least 8 nodes (4)" in proc.stdout, proc.stdout[-3000:]


def test_onnx_check_refuses_a_file_that_is_not_onnx(tmp_path):
    (tmp_path / "notes.onnx").write_text("not a model")
    proc = run_command([sys.executable, "-m", "mxnet_pfc.onnx_check", tmp_path / "notes.onnx"], timeout=60)
    assert proc.returncode == 1 and "notes.onnx: cannot read as ONNX" in proc.stdout, proc.stdout[-2000:]


def test_trainer_exports_the_final_model(trained):
    _, run = trained
    symbol, arg_params, aux_params = mx.model.load_checkpoint(str(run / "model"), 0)
    assert_same_embeddings(module_embeddings(symbol, arg_params, aux_params, IMAGES), trainer_embeddings(run, IMAGES))
    assert float(arg_params["fc1_gamma"].min().asscalar()) == 1.0      # fixed gamma: what MXNet computes with


def test_verify_command_reproduces_the_trainers_figures(trained, tmp_path):
    data, run = trained
    proc = run_command([sys.executable, "-m", "mxnet_pfc.verify", run, data / "val.bin", "--json", tmp_path / "v.json"],
                       timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "val: " in proc.stdout and "XNorm" in proc.stdout and "TAR@FAR=0.001" in proc.stdout
    got = json.load(open(tmp_path / "v.json"))["val"]
    expected = json.load(open(run / "model-verification.json"))["val"]
    assert got["accuracy"] == pytest.approx(expected["accuracy"]) and got["xnorm"] == pytest.approx(expected["xnorm"],
                                                                                                   rel=1e-4)


def write_faces(folder, count, seed):
    """`count` identities x 2 synthetic faces as PNG files in identity sub-folders; returns their paths."""
    rng = np.random.default_rng(seed)
    ids = synthetic_set.draw_identities(rng, count)
    images = synthetic_set.render({k: np.repeat(v, 2, axis=0) for k, v in ids.items()}, rng)
    paths = []
    for i, image in enumerate(images):
        person = folder / f"person{i // 2}"
        person.mkdir(parents=True, exist_ok=True)
        paths.append(person / f"{i % 2}.png")
        cv2.imwrite(str(paths[-1]), image[:, :, ::-1])
    return paths


def test_embed_images_pairs_and_gallery(trained, tmp_path):
    _, run = trained
    paths = write_faces(tmp_path / "gallery", 4, seed=2)
    out = tmp_path / "emb.npy"
    proc = run_command([sys.executable, "-m", "mxnet_pfc.embed", run, tmp_path / "gallery", "--out", out], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    embeddings = np.load(out)
    listed = open(tmp_path / "emb.txt").read().split()
    assert embeddings.shape == (8, 128) and listed == sorted(str(p) for p in paths)
    np.testing.assert_allclose(np.linalg.norm(embeddings, axis=1), 1.0, rtol=1e-5)
    # a pair: the cosine of the two rows, judged at the threshold the training found
    threshold = json.load(open(run / "model-verification.json"))["val"]["cosine_threshold"]
    proc = run_command([sys.executable, "-m", "mxnet_pfc.embed", run, "--pair", listed[0], listed[2]], timeout=120)
    cosine = float(np.dot(embeddings[0], embeddings[2]))
    assert proc.returncode == 0 and f"cosine similarity {cosine:.4f}" in proc.stdout, proc.stdout[-2000:]
    assert ("same person" if cosine > threshold else "different people") in proc.stdout
    assert f"threshold {threshold:.4f}" in proc.stdout
    # gallery: the probe is person2's first image, so person2 is the nearest identity
    proc = run_command([sys.executable, "-m", "mxnet_pfc.embed", run, "--gallery", tmp_path / "gallery",
                        "--probe", paths[4], "-k", 3], timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    ranking = [line.split()[1] for line in proc.stdout.splitlines() if line.strip()[:2] in ("1.", "2.", "3.")]
    assert ranking[0] == "person2" and len(ranking) == 3


def command_in_process(capsys, module: str, *args) -> "tuple[int, str]":
    """(exit status, stdout and stderr) of `python -m MODULE ARGS` run as its __main__ does (sys.exit(main())),
    in this process: MXNet is imported once, not once a command (test_help runs each `python -m`)."""
    import importlib
    try:
        status = importlib.import_module(module).main([str(arg) for arg in args])
    except SystemExit as exit:          # argparse refusing an option
        status = exit.code
    out = capsys.readouterr()
    return status, out.out + out.err


def test_embed_and_export_errors_name_the_problem(trained, tmp_path, capsys):
    _, run = trained
    (tmp_path / "notes.jpg").write_text("not an image")
    cv2.imwrite(str(tmp_path / "big.png"), np.zeros((200, 150, 3), np.uint8))
    cases = [
        (["mxnet_pfc.embed", run, tmp_path / "notes.jpg"], "notes.jpg does not decode as an image"),
        (["mxnet_pfc.embed", run, tmp_path / "big.png"],
         "big.png is 150x200, expected 112x112 (an aligned face), or pass --resize"),
        (["mxnet_pfc.embed", tmp_path / "nowhere", tmp_path / "big.png"], "nowhere: no model there"),
        (["mxnet_pfc.embed", ckpt(run / "checkpoints", 6), "--pair", tmp_path / "big.png",
          tmp_path / "big.png"], "no threshold: pass --threshold"),
        (["mxnet_pfc.verify", run, tmp_path / "notes.jpg"], "notes.jpg: not a pickle"),
    ]
    for args, message in cases:
        status, out = command_in_process(capsys, *args)
        assert status == 1 and message in out, (args, out[-2000:])
    # export configures logging (logging.basicConfig): in a process of its own
    proc = run_command([sys.executable, "-m", "mxnet_pfc.export", tmp_path / "nowhere"], timeout=120)
    assert proc.returncode == 1 and "nowhere: no model there" in proc.stdout, proc.stdout[-2000:]
    for option, value, message in (("--threshold", "nan", "expected a cosine similarity in [-1, 1], got 'nan'"),
                                   ("--threshold", "1.5", "expected a cosine similarity in [-1, 1], got '1.5'"),
                                   ("-k", "0", "expected a whole number of at least 1, got '0'"),
                                   ("-k", "-1", "expected a whole number of at least 1, got '-1'")):
        status, out = command_in_process(capsys, "mxnet_pfc.embed", run, "--pair", tmp_path / "big.png",
                                         tmp_path / "big.png", option, value)
        assert status == 2 and message in out, (option, value, out[-2000:])


def test_an_export_elsewhere_carries_the_verification_only_for_the_parameters_it_measured(trained, tmp_path):
    """Issue 26: an export with --prefix had no verification file, so embed --pair needed --threshold. The
    final checkpoint holds the parameters the training verified: its figures come along, and embed --pair
    runs without --threshold; an earlier checkpoint's parameters were not verified: nothing is carried, and
    the log says so."""
    _, run = trained
    faces = tmp_path / "a.png"
    cv2.imwrite(str(faces), np.zeros((112, 112, 3), np.uint8))
    for source, carried in ((ckpt(run / "checkpoints", 6), True), (ckpt(run / "checkpoints", 3), False)):
        prefix = tmp_path / f"from-{carried}" / "face"
        proc = run_command([sys.executable, "-m", "mxnet_pfc.export", source, "--prefix", prefix], timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert Path(f"{prefix}-verification.json").exists() == carried
        assert (f"verification figures (embed's threshold) carried from {run / 'model-verification.json'}"
                if carried else "not carried: it measured other parameters than these") in proc.stdout
        pair = run_command([sys.executable, "-m", "mxnet_pfc.embed", prefix, "--pair", faces, faces], timeout=120)
        assert (pair.returncode == 0) == carried, pair.stdout[-2000:]


def test_an_earlier_checkpoint_exported_over_the_runs_model_leaves_no_threshold_of_another(trained, tmp_path):
    """An earlier checkpoint exported over OUTPUT/model (--prefix: without it, it goes beside its folder)
    replaces the model the training verified: the final figures left beside it would give embed --pair the
    threshold of other parameters. They are removed, and the log says so; the final checkpoint exported there
    again keeps them."""
    _, shared = trained
    run = tmp_path / "run"
    shutil.copytree(shared, run)            # the fixture's run stays as it is for the other tests
    faces = tmp_path / "a.png"
    cv2.imwrite(str(faces), np.zeros((112, 112, 3), np.uint8))
    final = run_command([sys.executable, "-m", "mxnet_pfc.export", ckpt(run / "checkpoints", 6)], timeout=120)
    assert final.returncode == 0 and (run / "model-verification.json").exists(), final.stdout[-3000:]
    assert f"kept in {run / 'model-verification.json'}: they measured these parameters" in final.stdout
    # a copy of the final checkpoint, outside any run, has no figures of its own: those in place still hold
    backup = tmp_path / "backup-6"
    shutil.copytree(ckpt(run / "checkpoints", 6), backup)
    again = run_command([sys.executable, "-m", "mxnet_pfc.export", backup, "--prefix", run / "model"], timeout=120)
    assert again.returncode == 0 and (run / "model-verification.json").exists(), again.stdout[-3000:]
    assert "they measured these parameters" in again.stdout
    earlier = run_command([sys.executable, "-m", "mxnet_pfc.export", ckpt(run / "checkpoints", 3), "--prefix",
                           run / "model"], timeout=120)
    assert earlier.returncode == 0, earlier.stdout[-3000:]
    assert not (run / "model-verification.json").exists()
    assert f"{run / 'model-verification.json'} removed: it measured the parameters this export replaced" in (
        earlier.stdout)
    pair = run_command([sys.executable, "-m", "mxnet_pfc.embed", run, "--pair", faces, faces], timeout=120)
    assert pair.returncode != 0 and "--threshold" in pair.stdout, pair.stdout[-2000:]


@pytest.mark.parametrize("command", ["mxnet_pfc.export", "mxnet_pfc.verify", "mxnet_pfc.embed",
                                     "mxnet_pfc.onnx_check"])
def test_help(command):
    proc = run_command([sys.executable, "-m", command, "--help"], timeout=60)
    assert proc.returncode == 0 and "usage: python -m " + command in proc.stdout
