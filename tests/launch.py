"""Start a script on W CPU ranks under horovodrun (Gloo), with a hard timeout."""
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# Horovod's launcher as its horovodrun script runs it, less one check: that Horovod was built with Gloo, which
# horovodrun makes on every launch in a forked process that imports MXNet (1.3 s of a launch here, minutes of
# the suite). The ranks need Gloo to start at all (hvd.init), so a test loses nothing by it.
QUICK_HOROVODRUN = """import sys
import horovod.runner.launch as launch
if __name__ == "__main__":
    launch.gloo_built = lambda verbose=False: True
    sys.exit(launch.run_commandline())
"""


@lru_cache(maxsize=None)
def horovodrun() -> str:
    """The tests' horovodrun (QUICK_HOROVODRUN run by this Python), written once per session to a temporary
    folder; named horovodrun as the real one is (RANK_LAUNCHERS, test_launch_signals)."""
    import atexit
    import shutil
    import tempfile
    folder = tempfile.mkdtemp(prefix="mxnet-pfc-tests-")
    atexit.register(shutil.rmtree, folder, True)
    path = Path(folder) / "horovodrun"
    path.write_text(f"#!{sys.executable}\n{QUICK_HOROVODRUN}")
    path.chmod(0o755)
    return str(path)


@lru_cache(maxsize=None)
def installed_package() -> str:
    """The mxnet_pfc this interpreter imports outside the repository, without PYTHONPATH ('' if none)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", "import importlib.util as u; s = u.find_spec('mxnet_pfc'); "
                           "print(s.origin if s else '')"], cwd="/", env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def rank_env() -> dict:
    env = dict(os.environ)
    # The package is installed (make setup: editable); ranks started as `python tests/worker.py` import that.
    # A venv shared by several checkouts has it from one of them: then this checkout's goes first.
    if installed_package() != str(REPO / "mxnet_pfc" / "__init__.py"):
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")     # several ranks share 2 cores
    env["MXNET_OMP_MAX_THREADS"] = env["OMP_NUM_THREADS"]
    env["PYTHONWARNINGS"] = "ignore::DeprecationWarning"
    return env


def run_ranks(world_size: int, args: list, timeout: float, env: "dict | None" = None) -> subprocess.CompletedProcess:
    """horovodrun --gloo -np W -H localhost:W python ARGS; killed whole after `timeout` s."""
    return run_command([horovodrun(), "--gloo", "-np", str(world_size), "-H", f"localhost:{world_size}",
                        sys.executable, *args], timeout, env)


def golden_ranks(worker: str, world: int, ops: str, inputs, tmp, scenarios) -> "list[dict]":
    """Run a head worker (tests/dist_worker.py, tests/margin_worker.py) on `world` ranks with one kernel
    path ("fused" or "mxnet") over INPUTS; each rank's saved results, checked to come from that path."""
    proc = run_ranks(world, [worker, "golden", inputs, tmp], timeout=240,
                     env={"MXNET_PFC_KERNELS": "1" if ops == "fused" else "0"})
    assert proc.returncode == 0, proc.stdout[-4000:]
    ranks = [dict(np.load(Path(tmp) / f"rank{r}.npz")) for r in range(world)]
    assert all(str(res[f"{name}/ops"]) == ops for res in ranks for name in scenarios), "ran the wrong implementation"
    return ranks


def run_command(cmd: list, timeout: float, env: "dict | None" = None) -> subprocess.CompletedProcess:
    """CMD in the repository with the ranks' environment; its process group killed after `timeout` s."""
    proc = start_command(cmd, env)
    out = finish_command(proc, timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, None)


def config_sh(*args, ranks: int = 2) -> list:
    """horovodrun --gloo on `ranks` local ranks of config.sh; trainer options after "--"."""
    return [horovodrun(), "--gloo", "-np", str(ranks), "-H", f"localhost:{ranks}", "bash", "config.sh", "--", *args]


# The test runs' settings: the synthetic default's CPU-sized recipe (r18-lite, cosface-small, batch 32, ...),
# named, since a --rec or --images set otherwise trains with the real recipe (config.RECIPE_FOR_OWN_DATA).
TOY = ("--recipe", "synthetic-toy")


def tiny_synthetic_run(data, output, *extra) -> list:
    """Trainer options for a seconds-long run on a tiny generated set (40 identities x 8 images)."""
    return [*TOY, "--dataset", "synthetic", "--rec", data / "train.rec", "--val_targets", data / "val.bin",
            "--num_classes", 40, "--synthetic_identities", 40, "--synthetic_images_per_identity", 8,
            "--synthetic_val_pairs", 100, "--batch_size", 8, "--lr_base_batch", 16, "--warmup_epochs", 0.1,
            "--output", output, *extra]


def small_synthetic_run(tmp, *extra) -> list:
    """Trainer options for a run that learns in about 40 s: 120 steps on a generated set of 100 identities x 24
    images (data in tmp/data, output tmp/run), verified at the start and the end."""
    data = tmp / "data"
    return [*TOY, "--dataset", "synthetic", "--rec", data / "train.rec", "--val_targets", data / "val.bin",
            "--num_classes", 100, "--synthetic_identities", 100, "--synthetic_images_per_identity", 24,
            "--synthetic_val_pairs", 400, "--lr_base_batch", 32, "--max_update", 120,
            "--warmup_epochs", 0.1, "--frequent", 20, "--verbose", 1000, "--val_at_start", "true",
            "--output", tmp / "run", *extra]


def own_set_run(data, output, *extra) -> list:
    """Trainer options for a seconds-long run on a set read as a user's own (conftest.set_b: nothing is
    generated), logging every step and verifying on its val.bin at the end only."""
    return [*TOY, "--dataset", "synthetic", "--rec", data / "train.rec", "--val_targets", data / "val.bin",
            "--batch_size", 16, "--lr_base_batch", 32, "--warmup_epochs", 0.1, "--frequent", 1, "--verbose", 1000,
            "--output", output, *extra]


# (sample rate, batch size, grad_accum) of the session's learning run (conftest.learned)
LEARNED_RUN = (1.0, 16, 1)


# The 2-rank reference run of the checkpoint and fault tests (conftest.reference):
# 30 steps of 20 per epoch, a checkpoint every 8 steps, the newest 2 kept.
REFERENCE_RUN = ("--max_update", 30, "--save_interval", 8, "--keep_checkpoints", 2, "--frequent", 1,
                 "--verbose", 10, "--sample_rate", 0.5, "--dropout", 0.2)


def losses(output) -> dict:
    """{step: loss} from rank 0's metrics.jsonl; a step logged twice (resumed runs) keeps the later."""
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


def rank_stop_line(out: str, rank: int) -> str:
    """The line in which rank `rank` says why it stopped (in horovodrun's prefixed output), or ''."""
    return next((line for line in out.splitlines() if f"[{rank}]<stderr>:rank {rank}: " in line), "")


def final_summary(output) -> dict:
    return [json.loads(line) for line in open(output / "metrics.jsonl")][-1]["summary"]


# `make test-fast` (MXNET_PFC_FAST_TESTS=1): the unit and single-process tests; a test that launches ranks
# (horovodrun, mpirun, config.sh, run.sh, the elastic supervisor, Slurm, bench_memory.py) is skipped where it
# starts them, and so is a single-process test marked `slow` (conftest.py; pytest.ini says why each is).
FAST_LANE = os.environ.get("MXNET_PFC_FAST_TESTS") == "1"
RANK_LAUNCHERS = ("horovodrun", "mpirun", "config.sh", "run.sh", "mxnet_pfc.elastic", "mxnet-pfc-elastic", "sbatch",
                  "srun", "slurm.sbatch", "bench_memory.py")


def skip_in_fast_lane(cmd: list) -> None:
    """Skip the calling test in the fast lane if CMD launches ranks."""
    if FAST_LANE and any(str(part).endswith(RANK_LAUNCHERS) for part in cmd):
        import pytest
        pytest.skip("launches ranks: `make test` runs it (the fast lane runs single-process tests)")


def start_command(cmd: list, env: "dict | None" = None) -> subprocess.Popen:
    """CMD started in its own process group, output to a pipe; finish with finish_command."""
    skip_in_fast_lane(cmd)
    return subprocess.Popen([str(part) for part in cmd], cwd=REPO, env={**rank_env(), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish_command(proc: subprocess.Popen, timeout: float) -> str:
    """Its output once it exits; the whole group killed (and the test failed) past `timeout` s."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"{' '.join(proc.args[:8])} ... did not finish in {timeout} s; output:\n{out[-4000:]}")
    return out


def wait_until(condition, timeout: float, what: str, interval: float = 0.01, proc=None):
    """Poll condition() until it returns something true; fail after `timeout` s, or when `proc` ends first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {what}:\n"
                                 f"{proc.communicate()[0][-4000:]}")
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def trainer_processes(output) -> "list[int]":
    """The PIDs of the trainer processes writing to `output` (from /proc), other than this one."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"mxnet_pfc.train" in cmdline and str(output).encode() in cmdline:
            found.append(int(entry))
    return found


def trainer_pid(output, rank: int) -> "int | None":
    """The PID of the trainer process of `rank` writing to `output` (from /proc), or None."""
    for pid in trainer_processes(output):
        try:
            environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"HOROVOD_RANK={rank}".encode() in environ:
            return pid
    return None


# the elastic supervisor, launching with the tests' horovodrun (a test's own --horovodrun, later, wins)
ELASTIC = [sys.executable, "-m", "mxnet_pfc.elastic", "--horovodrun", horovodrun()]


def elastic_timeline(output) -> "list[dict]":
    """The elastic supervisor's timeline as records ([] before its first line)."""
    try:
        lines = open(output / "elastic-timeline.tsv").read().splitlines()
    except FileNotFoundError:
        return []
    names = lines[0].split("\t")
    return [dict(zip(names, line.split("\t"))) for line in lines[1:]]


def last_logged_step(output) -> int:
    """The newest step in rank 0's metrics.jsonl (0 before the first)."""
    try:
        return max(losses(output), default=0)
    except (OSError, ValueError):       # not there yet, or a line half-written
        return 0


def ckpt(root, step: int) -> Path:
    """The checkpoint folder under `root` labelled `step` (one only: the tests' runs do not renumber)."""
    from mxnet_pfc.runtime import checkpoints
    return Path(checkpoints.locate(str(root), str(step)))


def saved_steps(root) -> "list[int]":
    """The step labels of the complete checkpoints under `root`, in the order they were written."""
    from mxnet_pfc.runtime import checkpoints
    return [saved.step for saved in checkpoints.list_checkpoints(str(root))]


def held_samples(event: dict) -> int:
    """The samples seen of the newest checkpoint named in a timeline record (its `checkpoint` column)."""
    import re
    return int(re.search(r"\(([\d,]+) samples seen", event["checkpoint"]).group(1).replace(",", ""))


@contextmanager
def frozen(pids):
    """The processes `pids` stopped (SIGSTOP) inside the block: a test's event, not a machine's speed,
    decides what the job has done by the time something else happens. Continued after (SIGCONT)."""
    pids = list(pids)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def processes_with(text: str) -> list:
    """PIDs of the live (not zombie) processes whose command line contains `text`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
            state = open(f"/proc/{entry}/stat", "rb").read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if text.encode() in cmdline and state != b"Z":
            found.append(int(entry))
    return found
