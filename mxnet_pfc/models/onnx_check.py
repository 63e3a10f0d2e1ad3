"""The checks evaluation servers make of a submitted ONNX face model (docs/evaluation.md "Checking the ONNX model").

InsightFace's MFR challenge (challenges/iccv21-mfr/onnx_helper.py and
challenges/mfr/README.md) requires one input N x 3 x 112 x 112 with N free, one
output of at most 512 values, no float16 weights, at most 1024 MB, input
normalised inside the model (the checker then feeds raw 0..255 pixels) and
finite outputs; check_onnx also measures the latency per image (ONNX Runtime,
CPU) and compares the embeddings with MXNet's for the same model. Used by the
onnx_check command (mxnet_pfc/onnx_check.py) and by `export --check`.
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

    def line(self) -> str:
        detail = f"; {self.detail}" if self.detail else ""
        return f"{'ok' if self.ok else 'FAILED'}: {self.name} ({self.value}{detail})"


def _dims(value) -> list:
    """A graph input's or output's dimensions: ints, names of symbolic ones, or None for unnamed free ones."""
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in value.type.tensor_type.shape.dim]


def _half_tensors(model) -> "list[str]":
    """Names of float16/bfloat16 initialisers and Constant values (MFR: any float16 weight is refused)."""
    from onnx import TensorProto
    half = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    names = [t.name for t in model.graph.initializer if t.data_type in half]
    for node in model.graph.node:
        if node.op_type == "Constant":
            names += [node.output[0] for a in node.attribute if a.name == "value" and a.t.data_type in half]
    return names


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
    checks.append(Check(f"one input N x 3 x {image_size} x {image_size}, batch dimension N free",
                        len(inputs) == 1 and len(dims) == 4 and free and dims[1:] == [3, image_size, image_size],
                        shape or "no input", f"{len(inputs)} inputs" if len(inputs) != 1 else ""))

    half = _half_tensors(model)
    checks.append(Check("no float16 initialisers", not half, len(half), ", ".join(half[:10])))

    size_mb = os.path.getsize(onnx_path) / 2**20
    checks.append(Check(f"file size at most {MAX_SIZE_MB:.0f} MB", size_mb <= MAX_SIZE_MB, f"{size_mb:.1f} MB"))

    # the MFR checker feeds raw 0..255 pixels only if a Sub and a Mul come first, else (x - 127.5) / 127.5
    first = [node.name or node.op_type for node in model.graph.node[:8]]
    normalises = (any(n.startswith(("Sub", "_minus")) for n in first)
                  and any(n.startswith(("Mul", "_mul")) for n in first))
    checks.append(Check("normalises its own input (Sub and Mul named among the first 8 nodes: evaluators then feed "
                        "raw 0..255)", normalises, ", ".join(first[:3])))

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
            checks.append(Check(name, False, "did not run", error))
            continue
        ms = _latency_ms(session, images[:batch], runs)
        ok = batch != 1 or max_latency_ms is None or ms <= max_latency_ms
        checks.append(Check(name, ok, f"{ms:.2f} ms", f"median of {runs}, CPU, {os.cpu_count()} cores"))

    if mxnet_prefix:
        expected = _mxnet_embeddings(mxnet_prefix, images)
        for batch in (1, CHECK_BATCH):
            name = f"embeddings equal MXNet's at batch {batch}: max |difference| / norm below {tolerance:g}"
            got, error = _run(session, images[:batch])
            if got is None or got.shape != expected[:batch].shape:
                checks.append(Check(name, False, "did not run" if got is None else f"shape {got.shape}",
                                    error or f"MXNet gives {expected[:batch].shape}"))
                continue
            norms = np.maximum(np.linalg.norm(expected[:batch], axis=1), 1e-12)
            relative = float((np.abs(got - expected[:batch]).max(axis=1) / norms).max())
            checks.append(Check(name, relative < tolerance, f"{relative:.2e}"))
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
