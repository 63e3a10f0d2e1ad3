#!/usr/bin/env bash
# Per-rank environment, then the trainer; every argument passes through.
#   horovodrun -np 2 -H localhost:2 bash config.sh                 # the synthetic default
#   horovodrun -np 16 -H ip1:8,ip2:8 bash config.sh -- --dataset emore --network r100
# horovodrun takes options it knows by prefix even after the command (--network would be
# read as its --network-interface), so trainer options go after "--"; it is dropped here.
set -euo pipefail
if [[ "${1:-}" == "--" ]]; then shift; fi
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
# ranks on this host, as horovodrun (Gloo) or mpirun (Open MPI) announce it
LOCAL_SIZE="${HOROVOD_LOCAL_SIZE:-${OMPI_COMM_WORLD_LOCAL_SIZE:-1}}"
THREADS=$(( $(nproc) / LOCAL_SIZE )); (( THREADS >= 1 )) || THREADS=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}"            # one share of the cores per rank
export MXNET_OMP_MAX_THREADS="${MXNET_OMP_MAX_THREADS:-$OMP_NUM_THREADS}"
export MXNET_CPU_WORKER_NTHREADS="${MXNET_CPU_WORKER_NTHREADS:-1}"
export MXNET_CUDNN_AUTOTUNE_DEFAULT="${MXNET_CUDNN_AUTOTUNE_DEFAULT:-0}"
export MXNET_ENGINE_TYPE="${MXNET_ENGINE_TYPE:-ThreadedEnginePerDevice}"
export HOROVOD_CYCLE_TIME="${HOROVOD_CYCLE_TIME:-1}"
export HOROVOD_FUSION_THRESHOLD="${HOROVOD_FUSION_THRESHOLD:-67108864}"
export PYTHONWARNINGS="${PYTHONWARNINGS:-ignore::DeprecationWarning}"
# The CUDA libraries of a GPU install (requirements-gpu.txt), which the MXNet CUDA wheels load
# by name; nothing on a CPU install.
CUDA_LIBS="$(bash "$REPO/setup-utils/cuda-libs.sh" "$PYTHON")"
if [[ -n "$CUDA_LIBS" ]]; then export LD_LIBRARY_PATH="$CUDA_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
exec "$PYTHON" -m mxnet_pfc.train "$@"
