#!/usr/bin/env bash
# System packages Horovod needs to build and launch: a C++ toolchain, CMake,
# Debian's OpenMPI, libgomp for the mxnet wheel, and ssh (horovodrun and mpirun
# start remote ranks with it; the two-host test runs sshd). Skips apt when all are present.
set -euo pipefail

PACKAGES=(build-essential cmake openmpi-bin libopenmpi-dev libgomp1 openssh-client openssh-server iproute2)

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "[setup] system packages present: ${PACKAGES[*]}"
    exit 0
fi

echo "[setup] installing system packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "[setup] need root or sudo to install ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
