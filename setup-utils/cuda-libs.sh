#!/usr/bin/env bash
# Prints the lib folders of the CUDA library wheels (requirements-gpu.txt) that an
# environment holds, colon-separated: site-packages/nvidia/*/lib. Nothing (and
# exit 0) when there are none, as in a CPU environment. The MXNet CUDA wheels
# find libcudart, libcudnn, libnccl ... only through LD_LIBRARY_PATH, which must
# be set before the process starts; every rank gets it from mxnet_pfc/runtime/rank_environment.py
# (config.sh, the elastic supervisor), which owns the rule. By hand:
#
#   LD_LIBRARY_PATH="$(bash setup-utils/cuda-libs.sh .venv/bin/python)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
#       .venv/bin/python -m mxnet_pfc.verify ...
#
#   bash setup-utils/cuda-libs.sh PYTHON                      (that interpreter's site-packages)
#   bash setup-utils/cuda-libs.sh --site-packages DIR [DIR...]
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANK="import sys; from mxnet_pfc.runtime.rank_environment import cuda_library_dirs, site_packages as sites"
# rank_environment.py needs only the standard library: any python 3 reads it from this checkout.
if [[ "${1:-}" == "--site-packages" ]]; then
    shift
    PYTHONPATH="$REPO" exec python3 -c "$RANK; print(':'.join(cuda_library_dirs(sys.argv[1:])))" "$@"
fi
PYTHONPATH="$REPO" "${1:-python3}" -c "$RANK; print(':'.join(cuda_library_dirs(sites())))" 2>/dev/null || true
