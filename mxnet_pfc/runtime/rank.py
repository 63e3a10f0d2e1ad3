"""One rank of the trainer: its environment, then `python -m mxnet_pfc.train` in the same process.

    python -m mxnet_pfc.runtime.rank [--] [TRAINER OPTIONS]

config.sh runs this on every rank (under horovodrun, or mpirun through run.sh), and the elastic supervisor
launches it, so one place owns a rank's environment and an installed package needs no checkout. The
environment must be in place before the trainer's interpreter starts (the dynamic loader reads
LD_LIBRARY_PATH once, at start; OpenMP its thread count as MXNet loads): this sets it and replaces itself
with the trainer (exec). A setting the user gave is kept (an empty one counts as none).
horovodrun reads options it knows by prefix even after the command (--network would be taken for its
--network-interface), so trainer options come after "--", which is dropped here.
"""
from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from mxnet_pfc.runtime import slurm

# MXNet and Horovod settings of every rank.
DEFAULTS = {
    "MXNET_CPU_WORKER_NTHREADS": "1",
    "MXNET_CUDNN_AUTOTUNE_DEFAULT": "0",
    "MXNET_ENGINE_TYPE": "ThreadedEnginePerDevice",
    "HOROVOD_CYCLE_TIME": "1",
    "HOROVOD_FUSION_THRESHOLD": "67108864",
    "PYTHONWARNINGS": "ignore::DeprecationWarning",
}


def site_packages() -> list[str]:
    """This interpreter's site-packages (purelib and platlib: one folder in a venv, two on some systems)."""
    paths = sysconfig.get_paths()
    return [paths["purelib"], paths["platlib"]]


def cuda_library_dirs(sites: list[str]) -> list[str]:
    """The lib folders of the CUDA library wheels (requirements-gpu.txt) in these site-packages, which the
    MXNet CUDA wheels load by name only; none in a CPU environment."""
    dirs = []
    for site in sites:
        for lib in sorted(Path(site).glob("nvidia/*/lib")):
            if lib.is_dir() and str(lib) not in dirs:
                dirs.append(str(lib))
    return dirs


def ranks_sharing_cpus(environ: dict) -> int:
    """How many ranks on this host share this process's CPUs: the ranks on the host as horovodrun, Open MPI
    or an srun step announce them, or 1 where srun bound each task to CPUs of its own."""
    if slurm.cpus_bound_per_task(environ):
        return 1
    return int(environ.get("HOROVOD_LOCAL_SIZE") or environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
               or slurm.tasks_on_this_node(environ) or 1)


def rank_environment(environ: dict, cpus: int, sites: list[str]) -> dict:
    """environ with a rank's settings: its share of the `cpus` cores it may use (ranks_sharing_cpus),
    DEFAULTS, and the CUDA libraries of `sites` on LD_LIBRARY_PATH."""
    env = dict(environ)
    env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS") or str(max(1, cpus // ranks_sharing_cpus(env)))
    env["MXNET_OMP_MAX_THREADS"] = env.get("MXNET_OMP_MAX_THREADS") or env["OMP_NUM_THREADS"]
    for name, value in DEFAULTS.items():
        env[name] = env.get(name) or value
    libs = cuda_library_dirs(sites)
    if libs:
        env["LD_LIBRARY_PATH"] = ":".join(libs + [env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else libs)
    return env


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    env = rank_environment(os.environ, len(os.sched_getaffinity(0)), site_packages())
    os.execve(sys.executable, [sys.executable, "-m", "mxnet_pfc.train", *args], env)


if __name__ == "__main__":
    main()
