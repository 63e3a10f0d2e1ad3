"""`python -m mxnet_pfc.train`: the trainer, run by config.sh / run.sh under horovodrun or mpirun.

The command lives in mxnet_pfc/training/trainer.py; this file keeps it where users type it.
"""
from mxnet_pfc.training.trainer import main

if __name__ == "__main__":
    raise SystemExit(main())
