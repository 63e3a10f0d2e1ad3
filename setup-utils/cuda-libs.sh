#!/usr/bin/env bash
# Prints the lib folders of the CUDA library wheels (requirements-gpu.txt) that an
# environment holds, colon-separated: site-packages/nvidia/*/lib. Nothing (and
# exit 0) when there are none, as in a CPU environment. The MXNet CUDA wheels
# find libcudart, libcudnn, libnccl ... only through LD_LIBRARY_PATH, which must
# be set before the process starts; config.sh does that for every rank. By hand:
#
#   LD_LIBRARY_PATH="$(bash setup-utils/cuda-libs.sh .venv/bin/python)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
#       .venv/bin/python -m mxnet_pfc.verify ...
#
#   bash setup-utils/cuda-libs.sh PYTHON                      (that interpreter's site-packages)
#   bash setup-utils/cuda-libs.sh --site-packages DIR [DIR...]
set -euo pipefail

if [[ "${1:-}" == "--site-packages" ]]; then
    shift
    sites=("$@")
else
    python="${1:-python3}"
    # purelib and platlib: the same folder in a venv, two on some distributions
    mapfile -t sites < <("$python" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["purelib"]); print(p["platlib"])' 2>/dev/null || true)
fi

dirs=()
for site in "${sites[@]}"; do
    for lib in "$site"/nvidia/*/lib; do
        [[ -d "$lib" ]] || continue
        case ":$(IFS=:; echo "${dirs[*]:-}"):" in *":$lib:"*) continue ;; esac
        dirs+=("$lib")
    done
done
(IFS=:; echo "${dirs[*]:-}")
