"""python -m mxnet_pfc.onnx_check MODEL.onnx [--model MXNET_MODEL] [--json PATH]

Checks an ONNX face-recognition model the way evaluation servers check a
submission (InsightFace's MFR challenge, challenges/iccv21-mfr/onnx_helper.py
and challenges/mfr/README.md): one input N x 3 x 112 x 112 with N free, one
output of at most 512 values, no float16 weights, at most 1024 MB, input
normalised inside the model (the checker then feeds raw 0..255 pixels), finite
outputs; it measures the latency per image (ONNX Runtime, CPU), and compares
the embeddings with MXNet's for the same model. Prints one line per check and
exits 1 if any fails. `python -m mxnet_pfc.export MODEL --check` runs this on
the model it exports.
"""
from __future__ import annotations

import argparse
import sys

from mxnet_pfc.models.onnx_rules import add_check_options, check_onnx, report
from mxnet_pfc.runtime.errors import exit_status
from mxnet_pfc.runtime.run_folder import ModelFiles


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.onnx_check", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("onnx", help="the ONNX file to check")
    add_check_options(parser)
    parser.add_argument("--model", default="",
                        help="MXNet model (prefix, checkpoint or training output folder) to compare the embeddings "
                             "with (default: none, no comparison)")
    parser.add_argument("--json", default="", help="where to write the results (default: ONNX file's name "
                                                    "without .onnx, plus -onnx-check.json)")
    return parser


def run(args) -> int:
    json_path = args.json or ModelFiles(args.onnx.removesuffix(".onnx")).onnx_check
    checks = check_onnx(args.onnx, args.model or None, max_latency_ms=args.max_latency_ms, tolerance=args.tolerance)
    return 0 if report(checks, json_path, args.onnx, args.model or None) else 1


def main(argv=None) -> int:
    return exit_status("mxnet_pfc.onnx_check", run, build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
