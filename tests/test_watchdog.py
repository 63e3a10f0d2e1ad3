"""A stuck rank never hangs the job (mxnet_pfc/runtime/watchdog.py), under horovodrun (Gloo), mpirun and the supervisor.

The hang is put in as users' code cannot: a sitecustomize.py on the ranks' PYTHONPATH patches the data
iterator of rank 1 to sleep forever (in Python, no SIGSTOP) when it fetches the batch of step STUCK_STEP.
Under Gloo nothing else would end such a job (Horovod's stall check acts under MPI only).
"""
import os
import re
import shutil
import time

import pytest

from launch import (
    ELASTIC,
    REPO,
    config_sh,
    elastic_timeline,
    finish_command,
    last_logged_step,
    start_command,
    tiny_synthetic_run,
)
from mxnet_pfc.runtime import failure_records, stops
from mxnet_pfc.runtime.run_folder import RunFolder

STALL_TIMEOUT = 12       # seconds (warning at a quarter); each test's bound allows for a slow, loaded machine on top
STUCK_STEP = 6
STUCK_FUNCTION = "stuck_reading_a_batch"

SITECUSTOMIZE = f'''
import importlib.abc, importlib.machinery, os, sys, time

RANK = os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
MARK = os.environ["STUCK_MARK"]         # written when the hang starts; no hang once it exists
MODE = os.environ["STUCK_MODE"]         # "hang": rank 1 hangs; "slow verification": rank 0's verifications are long


def {STUCK_FUNCTION}():
    with open(MARK, "w") as f:
        f.write(str(time.time()))
    while True:
        time.sleep(3600)


def patch(module):
    if module.__name__ == "mxnet_pfc.data.iterators":
        original, calls = module.ShardedIter.__next__, [0]

        def __next__(self):
            calls[0] += 1
            if calls[0] == {STUCK_STEP}:
                {STUCK_FUNCTION}()
            return original(self)
        module.ShardedIter.__next__ = __next__
    else:
        original, calls = module.TrainingEvaluation.evaluate, [0]

        def evaluate(self, *args):        # the first: real verifications, again and again, for 1.5 stall timeouts
            calls[0] += 1
            end = time.time() + (1.5 * {STALL_TIMEOUT} if calls[0] == 1 else 0)
            while True:
                found = original(self, *args)
                if time.time() > end:
                    return found
        module.TrainingEvaluation.evaluate = evaluate


class Patch(importlib.abc.MetaPathFinder):
    def __init__(self, target):
        self.target = target

    def find_spec(self, name, path, target=None):
        if name != self.target:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec


if MODE == "hang" and RANK == "1" and not os.path.exists(MARK):
    sys.meta_path.insert(0, Patch("mxnet_pfc.data.iterators"))
if MODE == "slow verification" and RANK == "0":
    sys.meta_path.insert(0, Patch("mxnet_pfc.eval.during_training"))
'''


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The tiny synthetic set of tiny_synthetic_run (40 identities x 8 images, 100 pairs)."""
    from mxnet_pfc.data import synthetic_set
    folder = tmp_path_factory.mktemp("data")
    synthetic_set.ensure(str(folder), 40, 8, 100, local_rank=0)
    return folder


def stuck_env(tmp_path, mode="hang") -> dict:
    """The ranks' environment with the sitecustomize.py above first on PYTHONPATH."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = [str(hook)]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    path.append(str(REPO))          # the checkout under test (an installed package may be another's)
    return {"PYTHONPATH": os.pathsep.join(path), "STUCK_MARK": str(tmp_path / "stuck-since"), "STUCK_MODE": mode}


def stop_lines(out: str, rank: int) -> "list[str]":
    """The lines in which rank `rank` says why it stopped on stderr (horovodrun prefixes them, mpirun does not):
    'rank R: stopping: ...' (its watchdog, or a signal), 'rank R: LostRankError: ...' (its collective failed)."""
    return [line for line in out.splitlines() if re.match(rf"(\[{rank}\]<stderr>:)?rank {rank}: ", line)]


def training(data, output, *extra):
    return tiny_synthetic_run(data, output, "--max_update", 200, "--frequent", 1, "--verbose", 1000,
                              "--stall_timeout", STALL_TIMEOUT, *extra)


def check_stuck_run(proc, output, tmp_path, out):
    """The job ended, non-zero, soon after rank 1 got stuck; every rank names rank 1 and where it was stuck."""
    ended = time.time()
    assert proc.returncode != 0, out[-4000:]
    stuck_since = float((tmp_path / "stuck-since").read_text())
    print(f"the job ended {ended - stuck_since:.1f} s after rank 1 got stuck")
    # the timeout, then a tick of the watchdog and the launcher ending the others; generous for a loaded machine
    assert ended - stuck_since < STALL_TIMEOUT + 45, f"ended {ended - stuck_since:.0f} s after the hang"
    for rank in (0, 1):
        lines = stop_lines(out, rank)
        assert lines, f"no stop line of rank {rank}:\n{out[-4000:]}"
        assert "rank 1 made no progress for" in lines[0] and STUCK_FUNCTION in lines[0], lines
        assert "sitecustomize.py" in lines[0] and "outside any collective" in lines[0], lines
    assert "rank 0 waited for it in collective" in stop_lines(out, 0)[0], stop_lines(out, 0)
    logs = output / "logs"
    stacks = (logs / "stacks-rank1.txt").read_text()
    assert STUCK_FUNCTION in stacks and "Thread MainThread" in stacks and "Thread watchdog" in stacks, stacks
    assert "no progress for" in (logs / "rank1.log").read_text()          # the warning, then the stop
    records = failure_records.read(RunFolder(str(output)), range(2))
    assert records[1].startswith(failure_records.STALLED), records
    # no error of the run's own: the elastic supervisor relaunches (supervisor.job_failure)
    assert failure_records.first_failure(records) is None, records
    assert "done:" not in out


def test_a_rank_stuck_outside_collectives_stops_the_job_under_horovodrun(data, tmp_path):
    output = tmp_path / "run"
    proc = start_command(config_sh(*training(data, output)), env=stuck_env(tmp_path))
    out = finish_command(proc, timeout=300)
    check_stuck_run(proc, output, tmp_path, out)


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="no mpirun (Open MPI) on this machine")
def test_a_rank_stuck_outside_collectives_stops_the_job_under_mpirun(data, tmp_path):
    output = tmp_path / "run"
    proc = start_command(["bash", "run.sh", *training(data, output)], env={**stuck_env(tmp_path), "NP": "2"})
    out = finish_command(proc, timeout=300)
    check_stuck_run(proc, output, tmp_path, out)


def test_the_supervisor_relaunches_after_a_stall(data, tmp_path):
    """A stall is a lost rank to the elastic supervisor: it relaunches with --resume latest (the hang is
    gone the second time) and the run finishes."""
    output = tmp_path / "run"
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:2", "--max-restarts", 1, "--"]
                         + tiny_synthetic_run(data, output, "--max_update", 16, "--save_interval", 4, "--frequent",
                                              1, "--verbose", 1000, "--stall_timeout", STALL_TIMEOUT),
                         env=stuck_env(tmp_path))
    out = finish_command(proc, timeout=400)
    assert proc.returncode == 0, out[-4000:]
    events = [e["event"] for e in elastic_timeline(output)]
    assert (tmp_path / "stuck-since").exists(), events
    assert any(e.startswith("launch (restart 1/1: the job lost a rank or host") and "--resume latest" in e
               for e in events), events
    assert "finished" in events[-1], events
    assert last_logged_step(output) == 16


def test_a_long_but_live_verification_never_trips_the_watchdog(data, tmp_path):
    """Rank 0 verifies for 1.5 stall timeouts (real verifications, repeated) while rank 1 waits in a
    collective: neither rank warns, and the run finishes."""
    output = tmp_path / "run"
    proc = start_command(config_sh(*tiny_synthetic_run(data, output, "--max_update", 4, "--verbose", 2,
                                                       "--stall_timeout", STALL_TIMEOUT)),
                         env=stuck_env(tmp_path, "slow verification"))
    out = finish_command(proc, timeout=400)
    assert proc.returncode == 0, out[-4000:]
    for rank in (0, 1):
        log = (output / "logs" / f"rank{rank}.log").read_text()
        assert "no progress for" not in log, log[-3000:]
    assert (output / "logs" / "rank0.log").read_text().count("step 2: verification") >= 2


def test_a_fifo_as_a_verification_set_stops_the_job(data, tmp_path):
    """A FIFO given as --val_targets (no writer ever comes) once blocked rank 0 until the watchdog ended the
    job; the .bin loader now opens only regular files: every rank names it at setup, with no stall."""
    output, fifo = tmp_path / "run", tmp_path / "val.bin"
    os.mkfifo(fifo)
    proc = start_command(config_sh(*tiny_synthetic_run(data, output, "--val_targets", fifo,
                                                       "--stall_timeout", STALL_TIMEOUT)))
    out = finish_command(proc, timeout=300)
    assert proc.returncode != 0, out[-4000:]
    for rank in (0, 1):
        lines = stop_lines(out, rank)
        assert lines and f"{fifo} is not a regular file (a FIFO)" in lines[0], out[-4000:]
    assert "made no progress" not in out


def test_stall_records_are_no_error_of_the_runs_own(tmp_path, monkeypatch):
    """The elastic supervisor relaunches after a stall (supervisor.job_failure is failure_records.first_failure), and a
    signal that ends a rank after its stall record does not replace it."""
    from mxnet_pfc.runtime import comm
    monkeypatch.setattr(comm, "size", lambda: 2)
    monkeypatch.setattr(comm, "rank", lambda: 0)
    monkeypatch.setitem(stops._state, "run", RunFolder(str(tmp_path)))
    os.makedirs(tmp_path / "logs")
    (tmp_path / "logs" / "failed-rank1.txt").write_text(
        failure_records.STALLED + "made no progress for 9 s, stuck in f (x.py:3), outside any collective\n")
    stops.record_failure(failure_records.WAITED + "in collective 'pfc.batch' for 8 s, at g (y.py:4)")
    stops.record_failure(failure_records.SIGNALLED + "SIGTERM")
    records = failure_records.read(RunFolder(str(tmp_path)), range(2))
    assert records[0].startswith(failure_records.WAITED), records
    assert failure_records.first_failure(records) is None
    assert failure_records.stall_cause(records) == ("rank 1 made no progress for 9 s, stuck in f (x.py:3), outside any "
                                          "collective; rank 0 waited for it in collective 'pfc.batch' for 8 s, "
                                          "at g (y.py:4)")
