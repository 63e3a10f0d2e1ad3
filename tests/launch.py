"""Start a script on W CPU ranks under horovodrun (Gloo), with a hard timeout."""
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOROVODRUN = str(Path(sys.executable).parent / "horovodrun")


def rank_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")     # several ranks share 2 cores
    env["MXNET_OMP_MAX_THREADS"] = env["OMP_NUM_THREADS"]
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    return env


def run_ranks(world_size: int, args: list, timeout: float, env: "dict | None" = None) -> subprocess.CompletedProcess:
    """horovodrun --gloo -np W -H localhost:W python ARGS; killed whole after `timeout` s."""
    return run_command([HOROVODRUN, "--gloo", "-np", str(world_size), "-H", f"localhost:{world_size}",
                        sys.executable, *args], timeout, env)


def run_command(cmd: list, timeout: float, env: "dict | None" = None) -> subprocess.CompletedProcess:
    """CMD in the repository with the ranks' environment; its process group killed after `timeout` s."""
    cmd = [str(part) for part in cmd]
    proc = subprocess.Popen(cmd, cwd=REPO, env={**rank_env(), **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(cmd[:8])} ... did not finish in {timeout} s; output:\n{out[-4000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


def config_sh(*args, ranks: int = 2) -> list:
    """horovodrun --gloo on `ranks` local ranks of config.sh; trainer options after "--"."""
    return [HOROVODRUN, "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}", "bash", "config.sh", "--", *args]


def tiny_synthetic_run(data, output, *extra) -> list:
    """Trainer options for a seconds-long run on a tiny generated set (40 identities x 8 images)."""
    return ["--dataset", "synthetic", "--rec", data / "train.rec", "--val_targets", data / "val.bin",
            "--num_classes", 40, "--synthetic_identities", 40, "--synthetic_images_per_identity", 8,
            "--synthetic_val_pairs", 100, "--batch_size", 8, "--lr_base_batch", 16, "--warmup_epochs", 0.1,
            "--output", output, *extra]
