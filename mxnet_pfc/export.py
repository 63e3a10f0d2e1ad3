"""`python -m mxnet_pfc.export`: export a run's model for inference (MXNet, and ONNX with --onnx).

The command lives in mxnet_pfc/models/export.py; this file keeps it where users type it.
"""
from mxnet_pfc.models.export import main

if __name__ == "__main__":
    raise SystemExit(main())
