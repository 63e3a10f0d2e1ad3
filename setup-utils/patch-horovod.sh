#!/usr/bin/env bash
# Applies setup-utils/patch_horovod.py (Horovod 0.28.1's signal handling) to a venv's Horovod;
# install.sh runs it. Usage: bash setup-utils/patch-horovod.sh [VENV]   (default: .venv)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-$REPO/.venv}"
exec "$VENV/bin/python" "$REPO/setup-utils/patch_horovod.py"
