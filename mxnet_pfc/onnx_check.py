"""`python -m mxnet_pfc.onnx_check`: check an exported ONNX model as insightface's MFR server does.

The command lives in mxnet_pfc/models/onnx_check.py; this file keeps it where users type it.
"""
from mxnet_pfc.models.onnx_check import main

if __name__ == "__main__":
    raise SystemExit(main())
