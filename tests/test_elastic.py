"""The elastic supervisor on this host's ranks: relaunch after a lost rank, grow, limits, Ctrl-C.

`python -m mxnet_pfc.elastic`: relaunch after a lost rank, grow when slots appear, limits, and Ctrl-C, on this
host's ranks (test_two_hosts cuts the link between two hosts under it)."""
import json
import os
import shutil
import signal

import pytest

from launch import (
    ELASTIC,
    REFERENCE_RUN,
    finish_command,
    frozen,
    held_samples,
    last_logged_step,
    losses,
    start_command,
    tiny_synthetic_run,
    trainer_pid,
    trainer_processes,
    wait_until,
)
from launch import elastic_timeline as timeline
from mxnet_pfc.runtime import checkpoints, supervisor


def test_parse_hosts_reads_horovods_format():
    hosts = supervisor.parse_hosts("a:2\nb\n# a comment\n\nc:0\na:3\n", default_slots=4)
    assert hosts.slots == (("a", 3), ("b", 4)) and hosts.total == 7
    assert hosts.assign(5) == (("a", 3), ("b", 2))
    with pytest.raises(ValueError, match="line 1: 'a:x' is not host:slots"):
        supervisor.parse_hosts("a:x", 1)


def kill_rank_1_once(output, supervisor, ready, what: str) -> str:
    """Once the newest checkpoint is `ready` (a test on checkpoints.Saved) and both ranks run: rank 1
    SIGKILLed while rank 0 is frozen; the supervisor's output, once it has ended with exit 0."""
    wait_until(lambda: ((newest := checkpoints.latest(str(output / "checkpoints"))) is not None and ready(newest)
                        and trainer_pid(output, 0) and trainer_pid(output, 1)), 240, what, proc=supervisor)
    with frozen([trainer_pid(output, 0)]):
        os.kill(trainer_pid(output, 1), signal.SIGKILL)
    out = finish_command(supervisor, timeout=400)
    assert supervisor.returncode == 0, out[-4000:]
    return out


def test_grows_when_slots_appear_and_restarts_after_a_lost_rank(reference, tmp_path):
    """1 rank -> the script lists 2 slots -> the job stops at its next checkpoint and relaunches on 2 ->
    rank 1 is killed -> relaunched on 2 from the last checkpoint -> finishes. No step is lost beyond the
    last checkpoint or trained twice after it; nothing is left running.

    What the job has done when the test acts is decided by events, not by the machine's speed: the
    job is frozen (SIGSTOP) from the moment the script lists a second slot until the supervisor says
    it asked the job to stop, so it grows at its next checkpoint; rank 1 is killed while both ranks
    are frozen after the first checkpoint written on 2 ranks."""
    data, _ = reference
    output, hosts = tmp_path / "run", tmp_path / "hosts.txt"
    hosts.write_text("localhost:1\n")
    proc = start_command(ELASTIC + ["--host-discovery-script", f"cat {hosts}", "--max-np", 2,
                                    "--max-restarts", 1, "--discovery-interval", 1, "--"]
                         + tiny_synthetic_run(data, output, "--max_update", 48, "--save_interval", 6,
                                              "--frequent", 1, "--verbose", 1000, "--keep_checkpoints", 3))
    wait_until(lambda: last_logged_step(output) >= 2, 240, "one rank training", proc=proc)
    with frozen(trainer_processes(output)):
        frozen_at = last_logged_step(output)
        hosts.write_text("localhost:2\n")
        wait_until(lambda: any("asked the job to stop" in e["event"] for e in timeline(output)), 120,
                   "the request to stop at the next checkpoint", proc=proc)
    grow = wait_until(lambda: next((e for e in timeline(output) if e["event"].startswith("launch (grow")), None),
                      240, "the relaunch on 2 ranks", proc=proc)
    grown_at = held_samples(grow)
    # the first checkpoint after the request (every 6 steps of 8 samples), whenever the test got to freeze the job
    assert grown_at % 48 == 0 and frozen_at * 8 <= grown_at <= (frozen_at + 12) * 8, (frozen_at, grow)
    kill_rank_1_once(output, proc, lambda newest: newest.world_size == 2, "a checkpoint written on two ranks")
    events = timeline(output)
    assert events[0]["event"] == "launch (start)" and events[0]["ranks"] == "1", events
    restart = next(e for e in events if e["event"].startswith("launch (restart 1/1"))
    assert grow["ranks"] == restart["ranks"] == "2" and "--resume latest" in restart["event"], events
    assert "on 2 rank(s)" in restart["checkpoint"], restart      # the checkpoint is named by what it holds
    assert events[-1]["event"] == "finished", events
    # The metrics, in samples trained (steps are renumbered when the global batch changes): every
    # step once and in order, one global batch (8 per rank) after the other, to the run's length
    # (48 steps of 8 samples, kept in samples); world size 1 up to the growth, then 2.
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    trained = [(r["samples"], r["world_size"]) for r in records if "loss" in r]
    assert [b - a for (a, _), (b, w) in zip(trained, trained[1:])] == [8 * w for _, w in trained[1:]], trained
    assert trained[0] == (8, 1) and trained[-1] == (48 * 8, 2), trained
    assert [w for s, w in trained if s <= grown_at] == [1] * (grown_at // 8), trained
    assert "summary" in records[-1], records[-1]           # the run ended with its export
    assert trainer_processes(output) == []


def test_network_interface_is_left_out_only_when_every_host_is_local():
    """horovodrun 0.28 takes only loopback when all hosts are local (the relaunch on one surviving host)."""
    args = "--network-interface eth9 --gloo-timeout-seconds 10"
    assert supervisor.launcher_options(args, ["127.0.0.1"]) == ["--gloo-timeout-seconds", "10"]
    assert supervisor.launcher_options(args, ["127.0.0.1", "192.0.2.7"]) == args.split()     # a remote host
    assert supervisor.launcher_options("--network-interfaces=eth0,eth1", ["localhost"]) == []
    assert supervisor.launcher_options("--verbose", ["no-such-host.invalid"]) == ["--verbose"]   # no lookup needed


def test_a_broken_discovery_script_is_named(tmp_path):
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo 'a:b:c'", "--", "--output", tmp_path / "run"])
    out = finish_command(proc, timeout=60)
    assert proc.returncode == 2 and "the host discovery script \"echo 'a:b:c'\" printed line 1" in out, out


def test_gives_up_without_enough_slots(tmp_path):
    """Fewer than --min-np slots for --wait-timeout: gives up, saying so (no job runs)."""
    output = tmp_path / "run"
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:1", "--min-np", 2,
                                    "--wait-timeout", 2, "--discovery-interval", 0.5, "--",
                                    "--output", output, "--max_update", 5])
    out = finish_command(proc, timeout=60)
    assert proc.returncode == supervisor.EXIT_GAVE_UP, out
    assert "gave up: fewer than --min-np 2 slots for 2 s" in out
    assert [e["event"].split(" (")[0] for e in timeline(output)] == ["waiting for at least 2 slots",
                                                                    "gave up: fewer than --min-np 2 slots for 2 s"]


# Stands in for horovodrun: starts a "rank" in a session of its own (as horovodrun does), then the
# first launch fails after 2 s (a lost rank: no failure record) and later ones run until killed,
# ignoring SIGINT and SIGTERM.
FAKE_LAUNCHER = """#!/usr/bin/env bash
trap '' INT TERM
setsid bash -c "exec -a elastic-test-rank-$FAKE_MARK sleep 1000" &
if [[ ! -e "$FAKE_STATE" ]]; then touch "$FAKE_STATE"; sleep 2; exit 1; fi
while true; do sleep 1; done
"""


def marked(mark: str) -> "list[int]":
    found = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and f"elastic-test-rank-{mark}".encode() in open(f"/proc/{entry}/cmdline", "rb").read():
                found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("max_restarts", [0, 3])
def test_max_restarts_and_ctrl_c_during_a_restart_leave_nothing_running(tmp_path, max_restarts):
    """--max-restarts 0: the first lost rank ends it. Otherwise Ctrl-C while the relaunched job runs:
    the job is stopped (killed after --stop-grace when it ignores the signal), exit 130, and no
    process of either launch is left, though each started its rank in a session of its own."""
    output, fake = tmp_path / "run", tmp_path / "fake-horovodrun"
    fake.write_text(FAKE_LAUNCHER)
    fake.chmod(0o755)
    mark = f"{os.getpid()}-{max_restarts}"
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:2", "--horovodrun", fake,
                                    "--max-restarts", max_restarts, "--stop-grace", 1, "--discovery-interval", 1,
                                    "--", "--output", output, "--max_update", 5, "--save_interval", 2],
                         env={"FAKE_STATE": str(tmp_path / "launched"), "FAKE_MARK": mark})
    if max_restarts == 0:
        out = finish_command(proc, timeout=60)
        assert proc.returncode == supervisor.EXIT_GAVE_UP, out
        assert timeline(output)[-1]["event"] == ("gave up: the job ended (exit 1) without finishing and "
                                                 "--max-restarts 0 relaunches are spent")
    else:
        wait_until(lambda: any(e["event"].startswith("launch (restart 1/3") for e in timeline(output))
                   and marked(mark), 60, "the relaunched job", proc=proc)
        # a second supervisor on the same output is refused at once, naming the first
        second = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:2", "--horovodrun", fake,
                                          "--", "--output", output, "--max_update", 5, "--save_interval", 2])
        said = finish_command(second, timeout=60)
        assert second.returncode == 2 and "another supervisor runs on this output" in said \
            and f"pid {proc.pid}" in said, said
        os.kill(proc.pid, signal.SIGINT)
        out = finish_command(proc, timeout=60)
        assert proc.returncode == 128 + signal.SIGINT, out
        assert timeline(output)[-1]["event"] == "interrupted (SIGINT): job stopped"
    assert marked(mark) == [], "a rank of the job is still running"



# Stands in for horovodrun whose trainer is refused by the output lock at the first launch (it says so in
# OUTPUT/elastic/output-busy.json, as the trainer's rank 0 does, and exits 1), then runs until stopped.
BUSY_LAUNCHER = """#!/usr/bin/env bash
if [[ ! -e "$FAKE_STATE" ]]; then
    touch "$FAKE_STATE"
    echo '{"refused": "in use by another run (pid 1 on host elsewhere)", "launch": "'"$MXNET_PFC_LAUNCH"'"}' \
        > "$FAKE_OUTPUT/elastic/output-busy.json"
    exit 1
fi
setsid bash -c "exec -a elastic-test-rank-$FAKE_MARK sleep 1000" &
while true; do sleep 1; done
"""


def test_a_refusal_by_the_output_lock_is_no_lost_rank(tmp_path):
    """A launch refused because another run holds the output is not counted as a restart (with
    --max-restarts 0 it used to end the supervisor with exit 3): the holder, gone by then, is not
    adopted, and the job is launched again."""
    output, fake = tmp_path / "run", tmp_path / "fake-horovodrun"
    fake.write_text(BUSY_LAUNCHER)
    fake.chmod(0o755)
    mark = f"{os.getpid()}-busy"
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:1", "--horovodrun", fake,
                                    "--max-restarts", 0, "--stop-grace", 1, "--discovery-interval", 1,
                                    "--", "--output", output, "--max_update", 5],
                         env={"FAKE_STATE": str(tmp_path / "launched"), "FAKE_MARK": mark, "FAKE_OUTPUT": str(output)})
    wait_until(lambda: marked(mark), 60, "the second launch", proc=proc)
    os.kill(proc.pid, signal.SIGINT)
    out = finish_command(proc, timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, out
    events = [e["event"] for e in timeline(output)]
    assert events[0] == "launch (start)", events
    assert events[1].startswith("the job was refused by the output lock (in use by another run "
                                "(pid 1 on host elsewhere)): not a lost rank"), events
    assert events[2] == "launch (the run that held the output has ended)", events
    assert marked(mark) == []


def test_start_over_under_the_supervisor_continues_the_new_run_after_a_lost_rank(reference, tmp_path):
    """--start_over over a finished run: the first launch moves it aside and starts afresh; after a lost rank
    the relaunch resumes the new run (it used to pass --start_over and --resume together, a configuration
    error that ended the supervision). The new run starts from the earlier run's backbone and centers
    (--pretrained, --init_centers) and distils it (--teacher); the relaunch continues its own checkpoint
    instead of the starting point, and says so."""
    data, earlier = reference
    output, hosts = tmp_path / "run", tmp_path / "hosts.txt"
    shutil.copytree(earlier, output)
    hosts.write_text("localhost:2\n")
    proc = start_command(ELASTIC + ["--host-discovery-script", f"cat {hosts}", "--max-restarts", 1,
                                    "--discovery-interval", 1, "--"]
                         + tiny_synthetic_run(data, output, "--max_update", 48, "--save_interval", 6,
                                              "--frequent", 1, "--verbose", 1000, "--start_over", "true",
                                              "--pretrained", earlier, "--init_centers", earlier,
                                              "--teacher", earlier))
    # any checkpoint of the new run will do (the earlier run's newest holds 480 samples); 42 steps after the
    # first one leave the test time to act on a loaded machine
    out = kill_rank_1_once(output, proc, lambda newest: newest.samples_seen < 480, "the new run's first checkpoint")
    events = timeline(output)
    launches = [e["event"] for e in events if e["event"].startswith("launch")]
    # the supervisor's output says why a launch ended (once, in CI, the first ended by itself within 3 s)
    assert launches[0] == "launch (start)" and "--resume latest" in launches[1], (events, out[-6000:])
    assert events[-1]["event"] == "finished", events
    moved = list((output / "earlier-runs").iterdir())
    assert len(moved) == 1 and checkpoints.latest(str(moved[0] / "checkpoints")).samples_seen == 30 * 16
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    trained = [r["samples"] for r in records if "loss" in r]
    assert trained == list(range(16, 48 * 16 + 1, 16)), trained      # the new run, every step once
    log = (output / "logs" / "rank0.log").read_text()
    assert "pretrained backbone: " in log and "class centers and their momentum from checkpoint" in log
    assert "--pretrained and --init_centers are not used: a resumed run continues its checkpoint" in log
    assert log.count("distillation: teacher ") == 2 and all("distill/cosine" in r for r in records if "loss" in r)


# Stands in for horovodrun whose job fails at once, before its trainer writes anything; meanwhile a run
# started by hand into the same folder (FAKE_BYSTANDER set) was refused by the lock and said so.
FAILING_LAUNCHER = """#!/usr/bin/env bash
if [[ -n "$FAKE_BYSTANDER" ]]; then
    echo '{"refused": "in use by the job of a supervisor"}' > "$FAKE_BYSTANDER/elastic/output-busy.json"
fi
exit 1
"""


@pytest.mark.parametrize("left_behind", ["finished", "busy"])
def test_records_of_another_run_are_not_taken_for_the_jobs(tmp_path, left_behind):
    """A job that fails at once, in a folder holding another run's 'finished' record (an earlier run, here
    under --start_over) or 'busy' record (a run started by hand): it used to be reported as finished (exit 0),
    or as refused by the lock and launched again without counting; it is a lost job (exit 3 with
    --max-restarts 0)."""
    output, fake = tmp_path / "run", tmp_path / "fake-horovodrun"
    fake.write_text(FAILING_LAUNCHER)
    fake.chmod(0o755)
    (output / "logs").mkdir(parents=True)
    (output / "elastic").mkdir()
    if left_behind == "finished":
        (output / "logs" / "finished.json").write_text(json.dumps({"steps": 5, "launch": None}))
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:1", "--horovodrun", fake,
                                    "--max-restarts", 0, "--discovery-interval", 1,
                                    "--", "--output", output, "--max_update", 5, "--start_over", "true"],
                         env={"FAKE_BYSTANDER": str(output) if left_behind == "busy" else ""})
    out = finish_command(proc, timeout=60)
    assert proc.returncode == supervisor.EXIT_GAVE_UP, out
    events = [e["event"] for e in timeline(output)]
    assert events[0] == "launch (start)" and events[-1].startswith("gave up: the job ended (exit 1)"), events


def test_a_finished_run_asked_to_train_further_is_resumed(reference, tmp_path):
    """The supervisor over a finished run: the same command launches nothing (exit 0); with a larger
    --max_update it resumes the run and trains the steps asked for (it used to say 'finished' and train none)."""
    data, earlier = reference
    output = tmp_path / "run"
    shutil.copytree(earlier, output)
    command = ELASTIC + ["--host-discovery-script", "echo localhost:2", "--discovery-interval", 1, "--"]
    same = tiny_synthetic_run(data, output, *REFERENCE_RUN)
    proc = start_command(command + same)
    out = finish_command(proc, timeout=120)
    assert proc.returncode == 0 and timeline(output)[-1]["event"].startswith("finished (the run's record"), out
    proc = start_command(command + same + ["--max_update", 34])
    out = finish_command(proc, timeout=300)
    assert proc.returncode == 0, out[-4000:]
    launch = next(e["event"] for e in timeline(output) if e["event"].startswith("launch"))
    assert "--resume latest" in launch, timeline(output)
    assert max(losses(output)) == 34 and timeline(output)[-1]["event"] == "finished"
