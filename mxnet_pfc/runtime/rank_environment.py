"""A rank's environment: its share of the cores, MXNet's and Horovod's settings, the CUDA libraries' folders.

One place owns it: launch_rank.py applies it before the trainer's interpreter starts (config.sh, the
elastic supervisor), setup-utils/cuda-libs.sh prints its library folders, and the doctor reports it. The
environment must be in place before the process starts (the dynamic loader reads LD_LIBRARY_PATH once; OpenMP
its thread count as MXNet loads). A setting the user gave is kept (an empty one counts as none). Standard
library only (and slurm.py), so that any python 3 can read it from a checkout.
"""
from __future__ import annotations

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
