"""`python -m mxnet_pfc.elastic`: the elastic supervisor: relaunches the trainer on the hosts still alive.

The command lives in mxnet_pfc/runtime/supervisor.py; this file keeps it where users type it.
"""
from mxnet_pfc.runtime.supervisor import main

if __name__ == "__main__":
    raise SystemExit(main())
