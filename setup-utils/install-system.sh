#!/usr/bin/env bash
# System packages Horovod needs to build and launch: a C++ toolchain, CMake,
# Debian's OpenMPI, libgomp for the mxnet wheel, and ssh (horovodrun and mpirun
# start remote ranks with it; the two-host test runs sshd). Skips apt when all are present.
# Then Slurm (the controller, the node daemon, the clients and munge) for the tests that submit
# setup-utils/slurm.sbatch to a cluster they start: wanted, not needed (a failure to install it is a
# warning, and those tests say they skip and why). SLURM=0 leaves it out.
set -euo pipefail

PACKAGES=(build-essential cmake openmpi-bin libopenmpi-dev libgomp1 openssh-client openssh-server iproute2)
SLURM_PACKAGES=(slurmctld slurmd slurm-client munge)

missing_of() {      # the packages of "$@" that are not installed
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
    done
}
mapfile -t missing < <(missing_of "${PACKAGES[@]}")
mapfile -t missing_slurm < <(if [ "${SLURM:-1}" != 0 ]; then missing_of "${SLURM_PACKAGES[@]}"; fi)
if [ ${#missing[@]} -eq 0 ] && [ ${#missing_slurm[@]} -eq 0 ]; then
    echo "[setup] system packages present: ${PACKAGES[*]}$([ "${SLURM:-1}" != 0 ] && echo " ${SLURM_PACKAGES[*]}")"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
        [ ${#missing[@]} -eq 0 ] || { echo "[setup] need root or sudo to install ${missing[*]}" >&2; exit 1; }
        echo "[setup] warning: Slurm is not installed (${missing_slurm[*]}) and there is no root or sudo: its tests will skip" >&2
        exit 0
    fi
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [ ${#missing[@]} -gt 0 ]; then
    echo "[setup] installing system packages: ${missing[*]}"
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [ ${#missing_slurm[@]} -gt 0 ]; then
    echo "[setup] installing Slurm for its tests: ${missing_slurm[*]}"
    if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing_slurm[@]}"; then
        echo "[setup] warning: Slurm did not install (above): its tests will skip" >&2
    fi
fi
