#!/usr/bin/env bash
# Creates the project's virtual environment (default: .venv at the repository root)
# with every pin from requirements.txt, Horovod 0.28.1 built from source against
# the installed mxnet with Gloo and MPI, and this project installed editable
# (pyproject.toml; no PYTHONPATH needed). Idempotent: a complete environment is
# left alone.
#
#   VENV=path         where to create it (default: <repo>/.venv)
#   PYTHON=python3.11 interpreter to build it from
#   MXNET_PACKAGE=... mxnet wheel to install (default: mxnet-cu112==1.9.1 when
#                     nvidia-smi sees GPUs the CUDA wheels support, mxnet==1.9.1
#                     otherwise)
#   HOROVOD_NVCC=...  CUDA compiler for Horovod's GPU build ("none": build it
#                     without CUDA; default: a CUDA 11 nvcc found on PATH,
#                     $CUDA_HOME/bin or /usr/local/cuda/bin)
#   bash setup-utils/install.sh --dry-run
#                     prints what it would install (the GPU decisions below) and
#                     installs nothing
#
# GPUs: the MXNet 1.9.1 CUDA wheels hold machine code for compute capability 5.0
# to 8.6 (sm_50, 60, 70, 80, 86) and no PTX, and load CUDA 11 libraries they do
# not bundle (mxnet_pfc/runtime/mxnet_wheel_gpus.txt; a GPU runs code built for an earlier minor version of
# its major one, so 8.9 takes sm_86). With GPUs they run on this installs mxnet-cu112 and the
# libraries of requirements-gpu.txt (config.sh puts them on LD_LIBRARY_PATH), and
# builds Horovod with CUDA and NCCL when a CUDA 11 toolkit (nvcc) is found. A GPU
# of 9.0 or later (H100, H200, B200) has no kernels in those wheels: the CPU wheel is
# installed instead, and the trainer runs on the CPU (see gpu_plan).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO/.venv}"
PYTHON="${PYTHON:-python3.11}"
STAMP="$VENV/.mxnet-pfc-installed"
REQS="$REPO/requirements.txt"
GPU_REQS="$REPO/requirements-gpu.txt"
# The GPU architectures the MXNet 1.9.1 CUDA wheels have kernels for (one home: this file, which
# mxnet_pfc/runtime/device.py reads too), and the highest of them as MAJOR.MINOR.
WHEEL_GPUS="$REPO/mxnet_pfc/runtime/mxnet_wheel_gpus.txt"
WHEEL_ARCHS="$(sed -n 's/^architectures=//p' "$WHEEL_GPUS")"
[[ "$WHEEL_ARCHS" =~ ^sm_[0-9]+( sm_[0-9]+)*$ ]] || { echo "[setup] $WHEEL_GPUS: no architectures=sm_XY ... line" >&2; exit 1; }
MAX_CC="${WHEEL_ARCHS##*sm_}"; MAX_CC="${MAX_CC:0:-1}.${MAX_CC: -1}"
CPU_WHEEL="mxnet==1.9.1"
GPU_WHEEL="mxnet-cu112==1.9.1"

DRY_RUN=0
case "${1:-}" in
    --dry-run) DRY_RUN=1 ;;
    "") ;;
    *) echo "usage: bash setup-utils/install.sh [--dry-run]" >&2; exit 2 ;;
esac

# ---- GPU decisions (all of them here; --dry-run prints them) ----

# Sets MXNET_PACKAGE (unless the user did), CUDA_LIBS (1: install requirements-gpu.txt),
# NVCC (the CUDA compiler Horovod is built with, or empty) and prints why.
gpu_plan() {
    local user_package="${MXNET_PACKAGE:-}" listed="" query="" line name cc unsupported=()
    if command -v nvidia-smi >/dev/null 2>&1; then
        listed="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
    fi
    if [ "${listed:-0}" -gt 0 ]; then
        if query="$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null)"; then
            while IFS= read -r line; do
                [ -n "$line" ] || continue
                name="${line%,*}"; cc="$(echo "${line##*,}" | tr -d '[:space:]')"
                if [[ "$cc" =~ ^[0-9]+\.[0-9]+$ ]]; then
                    echo "[setup] GPU: $name, compute capability $cc"
                    if ! wheel_runs_on "$cc"; then unsupported+=("$name (compute capability $cc)"); fi
                else
                    echo "[setup] GPU: $name, compute capability unknown ('$cc'): not checked"
                fi
            done <<< "$query"
        else
            echo "[setup] nvidia-smi lists $listed GPU(s) but could not report their compute capability" \
                 "(an old driver?): not checked against the wheels' $MAX_CC"
        fi
    fi

    if [ ${#unsupported[@]} -gt 0 ]; then
        local joined
        joined="$(printf '%s, ' "${unsupported[@]}")"
        echo "[setup] no MXNet kernels for ${joined%, }: the MXNet 1.9.1 CUDA wheels carry machine code" \
             "for compute capability 5.0-$MAX_CC only ($WHEEL_ARCHS) and no PTX. Training on this GPU needs" \
             "NVIDIA's MXNet containers (NGC), or MXNet built from source with CUDA 11.8+ or 12 for its architecture" \
             "(sm_90 for 9.0), or a GPU of compute capability 5.0 to 8.x."
        if [ -z "$user_package" ]; then
            echo "[setup] installing the CPU wheel ($CPU_WHEEL) instead: the trainer will run on the CPU." \
                 "Set MXNET_PACKAGE=... to install another wheel (e.g. your own build)."
        fi
    fi
    if [ -n "$user_package" ]; then
        MXNET_PACKAGE="$user_package"
    elif [ "${listed:-0}" -gt 0 ] && [ ${#unsupported[@]} -eq 0 ]; then
        MXNET_PACKAGE="$GPU_WHEEL"
    else
        MXNET_PACKAGE="$CPU_WHEEL"
    fi

    CUDA_LIBS=0
    NVCC=""
    local found version why_not=""
    if [[ "$MXNET_PACKAGE" =~ ^mxnet-cu[0-9]+ ]]; then
        CUDA_LIBS=1
        found="$(find_nvcc)"
        if [ "${HOROVOD_NVCC:-}" = none ]; then
            why_not="HOROVOD_NVCC=none"
        elif [ -z "$found" ]; then
            why_not="no nvcc found (HOROVOD_NVCC, PATH, \$CUDA_HOME/bin, /usr/local/cuda/bin)"
        elif [ ! -x "$found" ]; then
            why_not="HOROVOD_NVCC=$found is not an executable"
        else
            version="$(nvcc_version "$found")"
            # The MXNet wheels and the NCCL wheel run on the CUDA 11 runtime; Horovod's GPU code
            # (static cudart of its toolkit) is built with the same major version, or not at all
            # unless the user names a compiler (HOROVOD_NVCC).
            if [[ "$version" == 11.* ]] || [ -n "${HOROVOD_NVCC:-}" ]; then
                NVCC="$found"
            else
                why_not="$found is CUDA ${version:-of unknown version}, the MXNet wheels use CUDA 11 (HOROVOD_NVCC=path/to/cuda-11/bin/nvcc chooses one)"
            fi
        fi
    fi
    echo "[setup] plan: mxnet package: $MXNET_PACKAGE"
    if [ "$CUDA_LIBS" = 1 ]; then
        echo "[setup] plan: CUDA libraries: $(grep -E '^nvidia-' "$GPU_REQS" | sed 's/[[:space:]].*//' | paste -sd' ')"
        if [ -n "$NVCC" ]; then
            echo "[setup] plan: horovod: built with CUDA and NCCL (nvcc: $NVCC, CUDA ${version:-?}; NCCL from nvidia-nccl-cu11)"
        else
            echo "[setup] plan: horovod: built without CUDA: $why_not." \
                 "Horovod then cannot take GPU arrays: the trainer stops on a GPU context with more than one rank" \
                 "(one rank, or --context cpu, still trains). Install a CUDA 11 toolkit and run make setup again."
        fi
    else
        echo "[setup] plan: CUDA libraries: none"
        echo "[setup] plan: horovod: CPU only"
    fi
}

# Whether the wheels' kernels run on a GPU of compute capability $1 (MAJOR.MINOR): CUDA runs machine code
# built for sm_XY on a GPU of X.Z when Y <= Z, same major only; the wheels carry no PTX to compile for others.
# mxnet_pfc/runtime/device.py's wheel_runs_on is the same rule (tests/test_doctor.py compares them).
wheel_runs_on() {
    local major="${1%%.*}" minor="${1#*.}" arch
    for arch in $WHEEL_ARCHS; do
        arch="${arch#sm_}"
        if (( ${arch:0:-1} == major && ${arch: -1} <= minor )); then return 0; fi
    done
    return 1
}

# The CUDA compiler to build Horovod with: HOROVOD_NVCC (a path, or "none"), else nvcc on PATH,
# in $CUDA_HOME/bin or /usr/local/cuda/bin.
find_nvcc() {
    local candidate
    if [ -n "${HOROVOD_NVCC:-}" ]; then
        if [ "$HOROVOD_NVCC" != none ]; then echo "$HOROVOD_NVCC"; fi
        return
    fi
    for candidate in "$(command -v nvcc 2>/dev/null || true)" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" /usr/local/cuda/bin/nvcc; do
        if [ -n "$candidate" ] && [ -x "$candidate" ]; then echo "$candidate"; return; fi
    done
}

# "11.8" from nvcc --version ("Cuda compilation tools, release 11.8, V11.8.89"), or nothing.
nvcc_version() {
    "$1" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -1
}

gpu_plan
if [ "$DRY_RUN" = 1 ]; then
    echo "[setup] dry run: nothing installed"
    exit 0
fi

# ---- the environment ----

# What the stamp holds: every input of the install. A change to any of them
# (requirements, pyproject.toml, the GPU pins, the chosen wheel) reruns it.
expected_stamp() {
    cat "$REQS" "$REPO/pyproject.toml"
    if [ "$CUDA_LIBS" = 1 ]; then cat "$GPU_REQS"; fi
    echo "# mxnet package: $MXNET_PACKAGE"
}

build_kernels() {
    # The fused CPU kernels of the head (compiled once per source, MXNet and CPU;
    # mxnet_pfc would also build them on first use).
    (cd / && "$VENV/bin/python" -c "from mxnet_pfc.head.kernels import build; print('[setup] fused kernels:', build.build())") \
        || echo "[setup] fused kernels did not build; the head will use MXNet ops" >&2
}

# The CUDA wheels' libraries, for every python started below (MXNet loads them at import).
cuda_library_path() {
    local libs
    libs="$(bash "$REPO/setup-utils/cuda-libs.sh" "$VENV/bin/python")"
    if [ -n "$libs" ]; then export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
}

# This project, editable: imports resolve to this checkout's files.
install_project() {
    "$VENV/bin/python" -m pip --disable-pip-version-check install -q --no-deps --no-build-isolation -e "$REPO"
    local where
    where="$(cd / && env -u PYTHONPATH "$VENV/bin/python" -c 'import importlib.util as u; print(u.find_spec("mxnet_pfc").origin)')"
    echo "[setup] mxnet_pfc installed (editable): $where"
}

# Whether the venv's mxnet_pfc is this checkout's (looked up from outside it, without importing it).
project_installed() {
    local origin
    origin="$(cd / && env -u PYTHONPATH "$VENV/bin/python" -c 'import importlib.util as u; s = u.find_spec("mxnet_pfc"); print(s.origin if s else "")' 2>/dev/null)" || return 1
    [ "$origin" = "$REPO/mxnet_pfc/__init__.py" ]
}

stamp_now="$(mktemp)"
base_reqs="$(mktemp)"
trap 'rm -f "$stamp_now" "$base_reqs"' EXIT
expected_stamp > "$stamp_now"

if [ -f "$STAMP" ] && cmp -s "$STAMP" "$stamp_now" && [ -x "$VENV/bin/python" ]; then
    echo "[setup] environment up to date: $VENV"
    cuda_library_path
    "$VENV/bin/python" "$REPO/setup-utils/patch_horovod.py"     # a no-op once applied
    project_installed || install_project                  # e.g. the venv was made for another checkout
    build_kernels
    exit 0
fi

bash "$REPO/setup-utils/install-system.sh"

echo "[setup] creating/updating $VENV with $PYTHON, $MXNET_PACKAGE"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip==24.3.1"

# Another mxnet distribution in place (CPU <-> CUDA wheel): both own the `mxnet`
# module, so the old one goes, and Horovod, compiled against it, is rebuilt.
REBUILD_HOROVOD=0
wanted_dist="$(echo "$MXNET_PACKAGE" | sed -E 's/[<>=!~ ;].*//' | tr '[:upper:]_' '[:lower:]-')"
installed_dists="$("$VENV/bin/python" - <<'PY'
from importlib import metadata
names = {(d.metadata["Name"] or "").lower().replace("_", "-") for d in metadata.distributions()}
print(" ".join(sorted(n for n in names if n == "mxnet" or n.startswith("mxnet-cu"))))
PY
)"
for dist in $installed_dists; do
    if [ "$dist" != "$wanted_dist" ]; then
        echo "[setup] removing $dist (replaced by $MXNET_PACKAGE); Horovod will be rebuilt against the new one"
        "${PIP[@]}" uninstall -q -y "$dist"
        REBUILD_HOROVOD=1
    fi
done

# Everything but Horovod, with the mxnet line replaced by the chosen wheel (and the CUDA libraries for a CUDA wheel).
grep -v -E '^(horovod|mxnet)==' "$REQS" > "$base_reqs"
echo "$MXNET_PACKAGE" >> "$base_reqs"
if [ "$CUDA_LIBS" = 1 ]; then
    echo "[setup] installing the CUDA 11 libraries of requirements-gpu.txt (large: about 2 GB)"
    grep -E '^nvidia-' "$GPU_REQS" | sed 's/[[:space:]].*//' >> "$base_reqs"
fi
"${PIP[@]}" install -q -r "$base_reqs"
cuda_library_path

# Horovod compiles against the mxnet in this environment, so no build isolation.
HOROVOD_PIN="$(grep -E '^horovod==' "$REQS" | sed 's/[[:space:]].*//')"
HVD_ENV=(HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1
         HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1)
HVD_PIP_ARGS=(--no-build-isolation)
if [ -n "$NVCC" ]; then
    site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')"
    nccl="$site/nvidia/nccl"
    # CMake's find_library looks for the unversioned name; the wheel ships libnccl.so.2 only.
    ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"
    HVD_ENV+=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
              "HOROVOD_NCCL_INCLUDE=$nccl/include" "HOROVOD_NCCL_LIB=$nccl/lib"
              "HOROVOD_CUDA_HOME=$(dirname "$(dirname "$NVCC")")")
    # pip's wheel cache would hand back a Horovod built without CUDA: build this one afresh.
    HVD_PIP_ARGS+=(--no-cache-dir)
    if "$VENV/bin/python" -c "import horovod.mxnet as h, sys; sys.exit(0 if h.nccl_built() else 1)" 2>/dev/null; then
        :
    elif "$VENV/bin/python" -c "import horovod.mxnet" 2>/dev/null; then
        echo "[setup] the installed Horovod has no NCCL: rebuilding it with CUDA and NCCL"
        REBUILD_HOROVOD=1
    fi
fi
if [ "$REBUILD_HOROVOD" = 1 ] || ! "$VENV/bin/python" -c "import horovod.mxnet" 2>/dev/null; then
    echo "[setup] building $HOROVOD_PIN from source (a few minutes)"
    if [ "$REBUILD_HOROVOD" = 1 ]; then HVD_PIP_ARGS+=(--force-reinstall --no-deps); fi
    env "${HVD_ENV[@]}" "${PIP[@]}" install -q "${HVD_PIP_ARGS[@]}" "$HOROVOD_PIN"
fi

# horovodrun --gloo must not hang on a second Ctrl-C (see the script).
"$VENV/bin/python" "$REPO/setup-utils/patch_horovod.py"

install_project

(cd / && "$VENV/bin/python" - <<'PY'
import horovod, mxnet, numpy, horovod.mxnet as hvd
nccl = hvd.nccl_built()
if not hvd.cuda_built():
    gpu = "without CUDA (CPU arrays only)"
elif nccl:
    gpu = f"with CUDA and NCCL {nccl // 10000}.{nccl // 100 % 100}.{nccl % 100}"
else:
    gpu = "with CUDA, without NCCL: GPU arrays go through host memory (slow)"
print(f"[setup] mxnet {mxnet.__version__}, numpy {numpy.__version__}, horovod {horovod.__version__} built {gpu}")
PY
)
"$VENV/bin/horovodrun" --check-build | sed -n '1,20p'
cp "$stamp_now" "$STAMP"
build_kernels
echo "[setup] done: $VENV"
