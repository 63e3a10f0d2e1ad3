"""`python -m mxnet_pfc.ijb`: IJB-B / IJB-C 1:1 verification and 1:N identification of a model.

The command lives in mxnet_pfc/eval/ijb.py; this file keeps it where users type it.
"""
from mxnet_pfc.eval.ijb import main

if __name__ == "__main__":
    raise SystemExit(main())
