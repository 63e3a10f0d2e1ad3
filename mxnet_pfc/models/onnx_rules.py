"""The checks evaluation servers make of a submitted ONNX face model (docs/evaluation.md "Checking the ONNX model").

Each check says whose rule it is. The server's are those of InsightFace's MFR
challenge checker (challenges/iccv21-mfr/onnx_helper.py, ArcFaceORT.check), as
it decides them: one output; a 4-d input of 3 x 112 x 112 (it sets a fixed batch
dimension free itself); at least 8 nodes; no initialiser of fewer than 4 bytes
an element (float16, uint8 ...); at most 1024 MB; finite outputs for a batch of
32; at most 512 values; and, since it runs ONNX Runtime 1.8, opset at most 14
and IR version at most 7. Its input rule decides what it feeds: raw 0..255
pixels when a node named Sub (or _minus) and one named Mul, _mul or Div are
among the first 8, else (x - 127.5) / 127.5. Ours: the batch dimension free for
every runtime, the input normalised inside the model (this project's exports
take raw pixels, so the server must feed them raw), no float16 Constant, the
latency per image (ONNX Runtime, CPU) and the embeddings against MXNet's for
the same model. Used by the onnx_check command (mxnet_pfc/onnx_check.py) and by
`export --check`.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE
from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.files import write_json

MAX_SIZE_MB = 1024.0            # onnx_helper.py: max_model_size_mb
MAX_EMBEDDING_SIZE = 512        # onnx_helper.py: max_feat_dim (ms1m track; 1024 for glint)
MIN_NODES = 8                   # onnx_helper.py: "too small onnx graph"
MIN_WEIGHT_BYTES = 4            # onnx_helper.py: an initialiser's itemsize below this is "invalid weight type"
MAX_OPSET, MAX_IR_VERSION = 14, 7   # ONNX Runtime 1.8, the server's (ONNX 1.9)
SERVER, OURS = "MFR server", "ours"
TOLERANCE = 1e-4                # ONNX vs MXNet, max abs difference / embedding norm
CHECK_BATCH = 32
SEED = 0


class OnnxCheckError(PfcError, ValueError):
    """An ONNX file that cannot be checked at all: missing, not ONNX, or refused by ONNX Runtime."""


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: `name` says what is required, `value` what was measured, `detail` any more (names, errors)."""
    name: str
    ok: bool
    value: object
    detail: str = ""
    rule: str = SERVER          # whose rule: the MFR server's checker, or this project's own

    def line(self) -> str:
        detail = f"; {self.detail}" if self.detail else ""
        return f"{'ok' if self.ok else 'FAILED'}: [{self.rule}] {self.name} ({self.value}{detail})"


def _dims(value) -> list:
    """A graph input's or output's dimensions: ints, names of symbolic ones, or None for unnamed free ones."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value.type.tensor_type.shape.dim]


def _narrow_initialisers(model) -> "list[str]":
    """The initialisers whose elements take fewer than MIN_WEIGHT_BYTES bytes (float16, uint8 ...), as the server
    reads them (numpy's itemsize)."""
    from onnx import numpy_helper
    return [f"{t.name} ({numpy_helper.to_array(t).dtype.name})" for t in model.graph.initializer
            if numpy_helper.to_array(t).dtype.itemsize < MIN_WEIGHT_BYTES]


def _half_constants(model) -> "list[str]":
    """Outputs of Constant nodes holding float16/bfloat16 values (the server reads only initialisers)."""
    from onnx import TensorProto
    half = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    return [node.output[0] for node in model.graph.node if node.op_type == "Constant"
            for a in node.attribute if a.name == "value" and a.t.data_type in half]


def _run(session, images):
    """(first output, None), or (None, ONNX Runtime's one-line complaint)."""
    try:
        return session.run(None, {session.get_inputs()[0].name: images})[0], None
    except Exception as error:     # onnxruntime raises its own types (InvalidArgument, Fail ...)
        return None, str(error).strip().splitlines()[0][:300]


def _latency_ms(session, images, runs: int) -> float:
    """Median milliseconds per image over `runs` runs, after one warm-up run."""
    feed = {session.get_inputs()[0].name: images}
    session.run(None, feed)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times) / len(images)


def _mxnet_embeddings(model: str, images: np.ndarray) -> np.ndarray:
    """MXNet's embeddings of `images` from MODEL (prefix, checkpoint or output folder), bound at their batch size."""
    import mxnet as mx

    from mxnet_pfc.models.inference import Embedder, load_model
    symbol, arg_params, aux_params, _ = load_model(model)
    embedder = Embedder(symbol, mx.cpu(), batch_size=len(images), image_size=images.shape[-1])
    embedder.set_params(arg_params, aux_params)
    return embedder(images)


def check_onnx(onnx_path: str, mxnet_prefix: "str | None" = None, *, image_size: int = FACE_SIZE,
               max_latency_ms: "float | None" = None, tolerance: float = TOLERANCE,
               latency_runs: int = 10) -> "list[Check]":
    """The checks of the module docstring; the MXNet comparison only when `mxnet_prefix` names a model."""
    import onnx
    import onnxruntime
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(onnx_path)
    except (OSError, DecodeError, ValueError) as error:
        raise OnnxCheckError(f"{onnx_path}: cannot read as ONNX: {error}") from None
    try:
        session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    except Exception as error:     # onnxruntime's own exception types
        raise OnnxCheckError(f"{onnx_path}: ONNX Runtime cannot load it: {str(error).splitlines()[0]}") from None
    checks = []

    outputs = [o.name for o in model.graph.output]
    checks.append(Check("exactly one output", len(outputs) == 1, len(outputs), ", ".join(outputs)))

    weights = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in weights]
    dims = _dims(inputs[0]) if inputs else []
    free = bool(dims) and (dims[0] is None or isinstance(dims[0], str) or dims[0] <= 0)
    shape = " x ".join("N" if d is None else str(d) for d in dims)
    checks.append(Check(f"one input N x 3 x {image_size} x {image_size}",
                        len(inputs) == 1 and len(dims) == 4 and dims[1:] == [3, image_size, image_size],
                        shape or "no input", f"{len(inputs)} inputs" if len(inputs) != 1 else ""))
    checks.append(Check("batch dimension N free (the server frees a fixed one itself; other runtimes do not)",
                        free, shape or "no input", rule=OURS))

    nodes = len(model.graph.node)
    checks.append(Check(f"at least {MIN_NODES} nodes", nodes >= MIN_NODES, nodes))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    checks.append(Check(f"opset at most {MAX_OPSET} and IR version at most {MAX_IR_VERSION} (the server's ONNX "
                        "Runtime 1.8)", opset <= MAX_OPSET and model.ir_version <= MAX_IR_VERSION,
                        f"opset {opset}, IR {model.ir_version}"))

    narrow = _narrow_initialisers(model)
    checks.append(Check(f"no initialiser narrower than {MIN_WEIGHT_BYTES} bytes an element (float16, uint8 ...)",
                        not narrow, len(narrow), ", ".join(narrow[:10])))
    half = _half_constants(model)
    checks.append(Check("no float16 Constant values", not half, len(half), ", ".join(half[:10]), rule=OURS))

    size_mb = os.path.getsize(onnx_path) / 2**20
    checks.append(Check(f"file size at most {MAX_SIZE_MB:.0f} MB", size_mb <= MAX_SIZE_MB, f"{size_mb:.1f} MB"))

    # the server feeds raw 0..255 pixels when it finds these names among the first 8 nodes, else (x - 127.5) / 127.5
    first = [node.name for node in model.graph.node[:MIN_NODES]]
    normalises = (any(n.startswith(("Sub", "_minus")) for n in first)
                  and any(n.startswith(("Mul", "_mul", "Div")) for n in first))
    checks.append(Check("normalises its own input (a node named Sub or _minus and one named Mul, _mul or Div among "
                        "the first 8: the server then feeds raw 0..255 pixels, as this project's exports take)",
                        normalises, ", ".join(n or "(unnamed)" for n in first[:3]), rule=OURS))

    images = np.random.default_rng(SEED).integers(0, 256, (CHECK_BATCH, 3, image_size, image_size)).astype(np.float32)
    got, error = _run(session, images)
    if got is None:
        checks.append(Check(f"finite outputs on a batch of {CHECK_BATCH}", False, "did not run", error))
    else:
        bad = int(np.size(got) - np.isfinite(got).sum())
        checks.append(Check(f"finite outputs on a batch of {CHECK_BATCH}", bad == 0, f"{bad} not finite",
                            f"output {' x '.join(map(str, got.shape))}"))
        width = got.shape[-1] if got.ndim == 2 else -1
        checks.append(Check(f"output N x D with D at most {MAX_EMBEDDING_SIZE}", 0 < width <= MAX_EMBEDDING_SIZE,
                            f"D = {width}" if width > 0 else f"shape {got.shape}"))

    limit = f" at most {max_latency_ms:g} ms" if max_latency_ms is not None else ""
    for batch, runs in ((1, 2 * latency_runs), (CHECK_BATCH, max(3, latency_runs // 2))):
        name = f"latency per image at batch {batch}" + (limit if batch == 1 else "")
        error = _run(session, images[:batch])[1]
        if error:
            checks.append(Check(name, False, "did not run", error, rule=OURS))
            continue
        ms = _latency_ms(session, images[:batch], runs)
        ok = batch != 1 or max_latency_ms is None or ms <= max_latency_ms
        checks.append(Check(name, ok, f"{ms:.2f} ms", f"median of {runs}, CPU, {os.cpu_count()} cores", rule=OURS))

    if mxnet_prefix:
        expected = _mxnet_embeddings(mxnet_prefix, images)
        for batch in (1, CHECK_BATCH):
            name = f"embeddings equal MXNet's at batch {batch}: max |difference| / norm below {tolerance:g}"
            got, error = _run(session, images[:batch])
            if got is None or got.shape != expected[:batch].shape:
                checks.append(Check(name, False, "did not run" if got is None else f"shape {got.shape}",
                                    error or f"MXNet gives {expected[:batch].shape}", rule=OURS))
                continue
            norms = np.maximum(np.linalg.norm(expected[:batch], axis=1), 1e-12)
            relative = float((np.abs(got - expected[:batch]).max(axis=1) / norms).max())
            checks.append(Check(name, relative < tolerance, f"{relative:.2e}", rule=OURS))
    return checks


def report(checks: "list[Check]", json_path: str, onnx_path: str, mxnet_prefix: "str | None") -> bool:
    """Prints one line per check, writes them to `json_path`; True if all passed."""
    for check in checks:
        print(check.line())
    passed = all(c.ok for c in checks)
    write_json(json_path, {"onnx": os.path.abspath(onnx_path), "mxnet": mxnet_prefix, "passed": passed,
                           "checks": [dataclasses.asdict(c) for c in checks]})
    print(f"{'all checks passed' if passed else 'some checks FAILED'}: {json_path}")
    return passed


def add_check_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-latency-ms", type=float, default=None,
                        help="fail if the latency per image at batch 1 (ONNX Runtime, CPU, median) exceeds this many "
                             "milliseconds (default: reported only)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="largest accepted difference between ONNX and MXNet embeddings, relative to the "
                             f"embedding's norm (default: {TOLERANCE:g})")
