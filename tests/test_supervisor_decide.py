"""The elastic supervisor's decisions (supervisor.decide_start, supervisor.decide) as a table, without processes."""
import argparse
import logging
import signal
from types import SimpleNamespace

import pytest

from mxnet_pfc.runtime import supervisor
from mxnet_pfc.runtime.supervisor import Adopt, Exit, Launch, decide, decide_start

FINISHED = "OUT/elastic/finished.json"
LENGTH = [200, 0]                # (max_update, num_epoch) asked for

STARTS = {
    "no finished record: launch": (None, False, False, Launch("start")),
    "finished to the same length: nothing to launch": (
        {"length": LENGTH}, False, False, Exit(0, f"finished (the run's record {FINISHED}): nothing to launch")),
    "finished to another length: launch for it": (
        {"length": [100, 0]}, False, False,
        Launch("the finished run asked to train to --max_update/--num_epoch [200, 0], not [100, 0]")),
    "finished, but a job was adopted: watch it": ({"length": LENGTH}, True, False, Launch("start")),
    "finished, but --start_over: launch": ({"length": LENGTH}, False, True, Launch("start")),
}


@pytest.mark.parametrize("finished, adopted, start_over, decision", STARTS.values(), ids=STARTS.keys())
def test_decide_start(finished, adopted, start_over, decision):
    assert decide_start(finished, FINISHED, LENGTH, adopted, start_over) == decision


def ended(**seen):
    """A job's end that knows only `seen`: decide reading anything else fails the test (AttributeError), so
    each row also states what the decision reads."""
    return SimpleNamespace(**{"interrupted": None, **seen})


CRASH = "Segmentation fault in File x.py, line 3"
LOST = dict(stopped=False, finished=False, busy=None, failure=None)     # a job that ended on a lost rank
# (situation, restarts spent, last death reading) -> decision; --max-restarts is 2 unless said
ENDS = {
    "Ctrl-C": (ended(interrupted=signal.SIGINT, left_running=False, slurm_ending=None), 0, None,
               Exit(130, "interrupted (SIGINT): job stopped")),
    "scancel of a run not ours": (
        ended(interrupted=signal.SIGTERM, left_running=True, slurm_ending="the Slurm job 7 was cancelled"), 0, None,
        Exit(143, "the Slurm job 7 was cancelled: interrupted (SIGTERM): job stopped "
                  "(not ours to stop: left running)")),
    "stopped at a checkpoint to grow": (ended(code=0, stopped=True, held="step 40"), 2, None,
                                        Launch("grow: stopped at step 40 to take more ranks")),
    "finished": (ended(code=0, stopped=False, finished=True), 0, None, Exit(0, "finished")),
    "refused by the output lock": (
        ended(code=2, stopped=False, finished=False, busy={"refused": "in use by pid 9"}), 0, None,
        Adopt("the job was refused by the output lock (in use by pid 9): not a lost rank; watching the run that "
              "holds it", "the run that held the output has ended")),
    "a failure of its own": (
        ended(code=1, **{**LOST, "failure": "rank 1 failed: bad data"}), 0, None,
        Exit(1, "failed on an error of its own (exit 1): rank 1 failed: bad data; not relaunched")),
    "an adopted job's failure": (
        ended(code=None, **{**LOST, "failure": "rank 0 failed: x"}), 0, None,
        Exit(1, "failed on an error of its own (exit status unknown: adopted): rank 0 failed: x; not relaunched")),
    "a configuration error (exit 2, no record)": (
        ended(code=2, **LOST), 0, None,
        Exit(2, "failed on an error of its own (exit 2): a configuration error; not relaunched")),
    "a lost rank: restart": (
        ended(code=1, died=None, **LOST), 0, None,
        Launch("restart 1/2: the job lost a rank or host (exit 1)", restart=True)),
    "an adopted job's lost rank: restart": (
        ended(code=None, died=None, **LOST), 1, ("f.rec", "step 40"),
        Launch("restart 2/2: the job lost a rank or host (exit status unknown: adopted)", restart=True)),
    "a lost rank, restarts spent": (
        ended(code=1, died=None, **LOST), 2, None,
        Exit(supervisor.EXIT_GAVE_UP, "gave up: the job ended (exit 1) without finishing and --max-restarts 2 "
                                      "relaunches are spent")),
    "died reading a file: restart, remembering it": (
        ended(code=1, died=(1, "f.rec", CRASH), held="-", **LOST), 0, None,
        Launch(f"restart 1/2: the job lost a rank or host (exit 1); rank 1 died reading f.rec ({CRASH})",
               restart=True, death_reading=("f.rec", "-"))),
    "died reading the same file from another checkpoint: restart": (
        ended(code=1, died=(0, "f.rec", CRASH), held="step 40", **LOST), 1, ("f.rec", "-"),
        Launch(f"restart 2/2: the job lost a rank or host (exit 1); rank 0 died reading f.rec ({CRASH})",
               restart=True, death_reading=("f.rec", "step 40"))),
    "died reading another file, restarts spent": (
        ended(code=1, died=(0, "g.rec", CRASH), held="-", **LOST), 2, ("f.rec", "-"),
        Exit(supervisor.EXIT_GAVE_UP, "gave up: the job ended (exit 1) without finishing and --max-restarts 2 "
                                      "relaunches are spent")),
    "died reading the same file twice from the start": (
        ended(code=1, died=(1, "f.rec", CRASH), held="-", **LOST), 1, ("f.rec", "-"),
        Exit(1, f"failed again on the same file (exit 1): rank 1 died reading f.rec ({CRASH}), twice, both times "
                f"from the start: the file causes it, not a lost rank; not relaunched (replace or remove the file)")),
    "died reading the same file twice from a checkpoint, adopted": (
        ended(code=None, died=(1, "f.rec", CRASH), held="step 40", **LOST), 2, ("f.rec", "step 40"),
        Exit(1, f"failed again on the same file (exit status unknown: adopted): rank 1 died reading f.rec "
                f"({CRASH}), twice, both times from checkpoint step 40: the file causes it, not a lost rank; "
                f"not relaunched (replace or remove the file)")),
}


@pytest.mark.parametrize("end, restarts, last_death_reading, decision", ENDS.values(), ids=ENDS.keys())
def test_decide(end, restarts, last_death_reading, decision):
    assert decide(end, restarts, 2, last_death_reading) == decision


def test_no_restarts_allowed_gives_up_at_the_first_lost_rank():
    assert decide(ended(code=137, died=None, **LOST), 0, 0, None) == Exit(
        supervisor.EXIT_GAVE_UP, "gave up: the job ended (exit 137) without finishing and --max-restarts 0 "
                                 "relaunches are spent")


def test_a_job_end_reads_only_what_the_decision_needs(tmp_path, caplog):
    """JobEnd reads a record when decide asks for it: a job that stopped to grow does not read (nor say in
    the log) a damaged finished record beside it; the one that finished does read it."""
    output = tmp_path / "run"
    boss = supervisor.Supervisor(argparse.Namespace(), [], str(output), start_over=False)
    folder = boss.run_folder
    with open(folder.stopped_record, "w") as f:
        f.write('{"step": 40}')
    with open(folder.finished_record, "w") as f:
        f.write("{damaged")
    job = supervisor.HeldOutput(str(output), None)
    with caplog.at_level(logging.WARNING):
        assert decide(supervisor.JobEnd(boss, job, 0, 2), 0, 2, None) == Launch(
            "grow: stopped at - to take more ranks")
    assert "damaged" not in caplog.text and folder.finished_record not in caplog.text
    end = supervisor.JobEnd(boss, job, 0, 2)
    assert end.finished is False and folder.finished_record in caplog.text
