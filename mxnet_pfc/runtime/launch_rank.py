"""Launch one rank of the trainer: its environment (rank_environment.py), then the trainer in this process.

    python -m mxnet_pfc.runtime.launch_rank [--] [TRAINER OPTIONS]

config.sh runs this on every rank (under horovodrun, or mpirun through run.sh), and the elastic supervisor
launches it, so an installed package needs no checkout. It sets the environment and replaces itself with
`python -m mxnet_pfc.train` (exec), whose interpreter starts with it.
horovodrun reads options it knows by prefix even after the command (--network would be taken for its
--network-interface), so trainer options come after "--", which is dropped here.
"""
from __future__ import annotations

import os
import sys

from mxnet_pfc.runtime.rank_environment import rank_environment, site_packages


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    env = rank_environment(os.environ, len(os.sched_getaffinity(0)), site_packages())
    os.execve(sys.executable, [sys.executable, "-m", "mxnet_pfc.train", *args], env)


if __name__ == "__main__":
    main()
