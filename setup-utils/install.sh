#!/usr/bin/env bash
# Creates the project's virtual environment (default: .venv at the repository root)
# with every pin from requirements.txt, Horovod 0.28.1 built from source against
# the installed mxnet with Gloo and MPI. Idempotent: a complete environment is
# left alone.
#
#   VENV=path         where to create it (default: <repo>/.venv)
#   PYTHON=python3.11 interpreter to build it from
#   MXNET_PACKAGE=... mxnet wheel to install (default: mxnet-cu112==1.9.1 when
#                     nvidia-smi sees a GPU, mxnet==1.9.1 otherwise)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$REPO/.venv}"
PYTHON="${PYTHON:-python3.11}"
STAMP="$VENV/.mxnet-pfc-installed"
REQS="$REPO/requirements.txt"

build_kernels() {
    # The fused CPU kernels of the head (compiled once per source, MXNet and CPU;
    # mxnet_pfc would also build them on first use).
    (cd "$REPO" && "$VENV/bin/python" -c "from mxnet_pfc import kernels; print('[setup] fused kernels:', kernels.build())") \
        || echo "[setup] fused kernels did not build; the head will use MXNet ops" >&2
}

if [ -f "$STAMP" ] && cmp -s "$STAMP" "$REQS"; then
    echo "[setup] environment up to date: $VENV"
    bash "$REPO/setup-utils/patch-horovod.sh" "$VENV"     # a no-op once applied
    build_kernels
    exit 0
fi

bash "$REPO/setup-utils/install-system.sh"

if [ -z "${MXNET_PACKAGE:-}" ]; then
    if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
        MXNET_PACKAGE="mxnet-cu112==1.9.1"
    else
        MXNET_PACKAGE="mxnet==1.9.1"
    fi
fi
echo "[setup] creating $VENV with $PYTHON, $MXNET_PACKAGE"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade "pip==24.3.1"

# Everything but Horovod, with the mxnet line replaced by the chosen wheel.
base_reqs="$(mktemp)"
trap 'rm -f "$base_reqs"' EXIT
grep -v -E '^(horovod|mxnet)==' "$REQS" > "$base_reqs"
echo "$MXNET_PACKAGE" >> "$base_reqs"
"${PIP[@]}" install -q -r "$base_reqs"

# Horovod compiles against the mxnet in this environment, so no build isolation.
HOROVOD_PIN="$(grep -E '^horovod==' "$REQS" | sed 's/[[:space:]].*//')"
if ! "$VENV/bin/python" -c "import horovod.mxnet" 2>/dev/null; then
    echo "[setup] building $HOROVOD_PIN from source (a few minutes)"
    HOROVOD_WITH_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 \
        "${PIP[@]}" install -q --no-build-isolation "$HOROVOD_PIN"
fi

# horovodrun --gloo must not hang on a second Ctrl-C (see the script).
bash "$REPO/setup-utils/patch-horovod.sh" "$VENV"

"$VENV/bin/python" - <<'PY'
import mxnet, numpy, horovod.mxnet as hvd
print(f"[setup] mxnet {mxnet.__version__}, numpy {numpy.__version__}, horovod ok")
PY
"$VENV/bin/horovodrun" --check-build | sed -n '1,20p'
cp "$REQS" "$STAMP"
build_kernels
echo "[setup] done: $VENV"
