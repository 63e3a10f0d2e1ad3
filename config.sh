#!/usr/bin/env bash
# Per-rank environment, then the trainer; every argument passes through.
#   horovodrun -np 2 -H localhost:2 bash config.sh                 # the synthetic default
#   horovodrun -np 16 -H ip1:8,ip2:8 bash config.sh -- --dataset emore --network r100
# horovodrun takes options it knows by prefix even after the command (--network would be
# read as its --network-interface), so trainer options go after "--"; it is dropped.
# The environment (threads per rank, MXNet and Horovod settings, the CUDA libraries of a GPU
# install) is set by mxnet_pfc/runtime/rank_environment.py, which the elastic supervisor launches too.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
exec "$PYTHON" -m mxnet_pfc.runtime.launch_rank "$@"
