#!/usr/bin/env bash
# Launch the trainer with mpirun (Open MPI) from a hosts file; every argument passes through.
#   HOSTFILE=hosts NP=16 bash run.sh --dataset emore --network r100
# The hosts file has one line per host: "ip1 slots=8". Without HOSTFILE, NP
# ranks (default 2) run on this machine.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,5s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; echo; exec bash "$REPO/config.sh" --help
fi
NP="${NP:-}"
HOST_ARGS=()
if [[ -n "${HOSTFILE:-}" ]]; then
    [[ -f "$HOSTFILE" ]] || { echo "run.sh: HOSTFILE=$HOSTFILE does not exist" >&2; exit 2; }
    HOST_ARGS=(--hostfile "$HOSTFILE")
    if [[ -z "$NP" ]]; then   # all slots of the hosts file
        NP=$(awk '!/^#/ && NF { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) { split($i, s, "="); n = s[2] } total += n } END { print total }' "$HOSTFILE")
    fi
else
    NP="${NP:-2}"
    HOST_ARGS=(-H "localhost:$NP")
fi
ROOT_ARGS=()
[[ "$(id -u)" == 0 ]] && ROOT_ARGS=(--allow-run-as-root)
# -x: environment every rank needs; config.sh sets the rest per rank
exec mpirun "${ROOT_ARGS[@]}" -np "$NP" "${HOST_ARGS[@]}" --bind-to none --map-by slot --oversubscribe \
    -x PATH ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} ${PYTHON:+-x PYTHON} ${PYTHONPATH:+-x PYTHONPATH} \
    --mca pml ob1 --mca btl ^openib \
    bash "$REPO/config.sh" "$@"
