"""`python -m mxnet_pfc.train`: the trainer, run by config.sh / run.sh under horovodrun or mpirun.

    horovodrun -np 2 -H localhost:2 bash config.sh [--dataset D --network N --loss L --FIELD VALUE ...]

Every option is a field of the configuration (`--help` lists them; mxnet_pfc/training/config.py). The
run itself is mxnet_pfc/training/trainer.py. A configuration error ends with status 2 before any
collective; any other error goes through stops.stop_on_error, which names the rank and ends every rank.
"""
import sys

from mxnet_pfc.runtime import comm, stops
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training.trainer import train


def main(argv=None) -> int:
    try:
        cfg = config_lib.parse_args(argv)
    except config_lib.ConfigError as error:
        print(f"mxnet_pfc.train: configuration error: {error}", file=sys.stderr)
        return 2
    stops.watch_signals()
    try:
        train(cfg)
        comm.shutdown()
    except Exception as error:
        return stops.stop_on_error(error)
    return 0



if __name__ == "__main__":
    sys.exit(main())
