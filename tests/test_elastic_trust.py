"""What the elastic supervisor (python -m mxnet_pfc.elastic) believes of the files in OUTPUT.

Issue 33: it adopts and stops only a job launched for its own output folder (items 3: `cp -a` of a live run,
an edited job.json), a record nested 100,000 levels deep is a named error (item 2), and a rank that dies twice
reading the same file is not a lost rank (item 8).

The jobs are stand-ins for horovodrun (bash scripts, as in test_elastic.py): their "ranks" are marked
processes found by their command line, so what is left running, and whose it is, can be checked.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from launch import ELASTIC, finish_command, processes_with, start_command, wait_until
from launch import elastic_timeline as timeline
from mxnet_pfc.runtime import run_lock, supervisor
from mxnet_pfc.runtime.run_folder import RunFolder


def marked(mark: str) -> "list[int]":
    """The stand-in ranks marked `mark`."""
    return processes_with(f"elastic-test-rank-{mark}")


@pytest.fixture(autouse=True)
def nothing_left(tmp_path):
    """Whatever a failed test left running of its supervisors and jobs (each names tmp_path) is killed."""
    yield
    for pid in processes_with(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def script(path, text: str):
    path.write_text(text)
    path.chmod(0o755)
    return path


# Stands in for horovodrun: one "rank" in a session of its own (as horovodrun starts them) that holds the
# trainer's output lock of FAKE_OUTPUT, as rank 0 does; both wait until killed, ignoring SIGINT and SIGTERM
# (the supervisor kills them after --stop-grace).
LOCKING_LAUNCHER = """#!/usr/bin/env bash
trap '' INT TERM
setsid "$FAKE_PYTHON" -c 'import sys, time
from mxnet_pfc.runtime import run_lock
run_lock.acquire(sys.argv[1])
time.sleep(1000)' "$FAKE_OUTPUT" "elastic-test-rank-$FAKE_MARK" &
while true; do sleep 1; done
"""


def supervise(output, launcher, mark: str, *options):
    """The supervisor on `output` with the stand-in `launcher`, its ranks marked `mark`."""
    return start_command(ELASTIC + ["--host-discovery-script", "echo localhost:1", "--horovodrun", launcher,
                                    "--stop-grace", 1, "--discovery-interval", 1, *options,
                                    "--", "--output", output, "--max_update", 5],
                         env={"FAKE_OUTPUT": str(output), "FAKE_MARK": mark, "FAKE_PYTHON": sys.executable})


def lock_holder(folder) -> "int | None":
    """The pid the output lock of `folder` names (None while there is none, or it is being written)."""
    try:
        return json.load(open(run_lock.lock_path(str(folder))))["pid"]
    except (OSError, ValueError, KeyError):
        return None


def new_events(output, before: int) -> "list[str]":
    return [e["event"] for e in timeline(output)[before:]]


def interrupt(proc) -> str:
    os.kill(proc.pid, signal.SIGINT)
    out = finish_command(proc, timeout=60)
    assert proc.returncode == 128 + signal.SIGINT, out
    return out


@pytest.mark.parametrize("copied_lock", ["removed", "kept"])
def test_a_copy_of_a_live_runs_folder_does_not_adopt_or_stop_its_job(tmp_path, copied_lock):
    """`cp -a A B` of a live elastic run, then B's supervisor (the issue's steps remove the supervisor lock
    copied into B, which used to refuse it): B's supervisor does not adopt A's job (job.json names it, and
    it runs), says why, launches B's own job, whose rank 0 takes B's output lock (the copied one names A's
    rank, holding A); Ctrl-C on B stops B's job and leaves A's running. It used to adopt A's job and kill
    it on Ctrl-C."""
    a, b, fake = tmp_path / "A", tmp_path / "B", script(tmp_path / "fake-horovodrun", LOCKING_LAUNCHER)
    mark_a, mark_b = f"{os.getpid()}-{copied_lock}-A", f"{os.getpid()}-{copied_lock}-B"
    first = supervise(a, fake, mark_a)
    job_record = RunFolder(str(a)).job_record
    ranks_a = wait_until(lambda: os.path.exists(job_record) and lock_holder(a) in marked(mark_a)
                         and marked(mark_a), 60, "A's job, holding A's output lock", proc=first)
    subprocess.run(["cp", "-a", str(a), str(b)], check=True)
    if copied_lock == "removed":
        os.remove(run_lock.lock_path(RunFolder(str(b)).elastic))
    copied = len(timeline(b))
    second = supervise(b, fake, mark_b)
    wait_until(lambda: any(e.startswith(("launch", "adopted")) for e in new_events(b, copied)), 60,
               "B's supervisor launching or adopting a job", proc=second)
    events = new_events(b, copied)
    horovodrun_a = json.load(open(job_record))["pid"]
    assert events[0] == (f"not adopting process {horovodrun_a}, which {b}/elastic/job.json names: it was launched "
                         f"for another output folder, '{os.path.realpath(a)}'; it is left alone"), events
    assert events[1] == "launch (start)" and not any("adopted" in e for e in events), events
    wait_until(lambda: marked(mark_b), 60, "B's own job", proc=second)
    # B's rank took B's output lock over from the copy, which names A's rank, holding A
    wait_until(lambda: lock_holder(b) in marked(mark_b), 60, "B's rank holding B's output lock", proc=second)
    assert json.load(open(run_lock.lock_path(str(b))))["folder"] == os.path.realpath(b)
    out = interrupt(second)
    if copied_lock == "kept":
        assert (f"it holds another folder, {os.path.realpath(a)}/elastic (this lock was copied from there)"
                in out), out
    assert new_events(b, copied)[-1] == "interrupted (SIGINT): job stopped"
    assert marked(mark_b) == [] and marked(mark_a) == ranks_a, "B's Ctrl-C reached A's job"
    assert first.poll() is None and "interrupted" not in timeline(a)[-1]["event"]
    interrupt(first)
    assert marked(mark_a) == []


def process_start(pid: int) -> str:
    stat = open(f"/proc/{pid}/stat").read()
    return stat[stat.rindex(")") + 2:].split()[19]


def test_an_edited_job_record_naming_another_process_is_not_adopted(tmp_path):
    """job.json edited to name a process of this host that carries a launch id (its own, and the record
    claims this folder): it is not adopted, nor signalled on Ctrl-C. It used to be adopted and stopped."""
    output, fake = tmp_path / "run", script(tmp_path / "fake-horovodrun", LOCKING_LAUNCHER)
    mark = f"{os.getpid()}-edited"
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)", "a-bystander"],
                                 env={**os.environ, "MXNET_PFC_LAUNCH": "L1"}, start_new_session=True)
    try:
        wait_until(lambda: os.path.exists(f"/proc/{bystander.pid}/stat"), 10, "the bystander")
        (output / "elastic").mkdir(parents=True)
        (output / "elastic" / "job.json").write_text(json.dumps(dict(
            pid=bystander.pid, started=process_start(bystander.pid), host=socket.gethostname(),
            boot_id=run_lock.boot_id(), ranks=1, hosts=[["localhost", 1]], launch="L1",
            output=os.path.realpath(output))))
        proc = supervise(output, fake, mark)
        wait_until(lambda: any(e["event"].startswith(("launch", "adopted")) for e in timeline(output)), 60,
                   "the supervisor launching or adopting a job", proc=proc)
        events = [e["event"] for e in timeline(output)]
        assert events[0] == (f"not adopting process {bystander.pid}, which {output}/elastic/job.json names: its "
                             f"environment names no output folder (not launched for this one, or by an older "
                             f"version); it is left alone"), events
        assert events[1] == "launch (start)", events
        wait_until(lambda: marked(mark), 60, "its own job", proc=proc)
        interrupt(proc)
        assert bystander.poll() is None, "the supervisor stopped a process it did not launch"
    finally:
        bystander.kill()
        bystander.wait()


# Stands in for horovodrun whose job fails at once (a lost rank: no failure record).
FAILING_LAUNCHER = """#!/usr/bin/env bash
exit 1
"""

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("record", ["elastic/job.json", "RUNNING.lock", "elastic/RUNNING.lock"])
def test_a_record_nested_100000_deep_is_a_named_error(tmp_path, record):
    """job.json, the trainer's lock or the supervisor's lock holding JSON nested 100,000 levels: the
    supervisor used to die with a RecursionError traceback. A damaged job.json or trainer lock counts as
    none, saying so for job.json (the job is launched; here it fails, and with --max-restarts 0 that ends
    it); a damaged supervisor lock refuses the start, naming it, as any lock being written does."""
    output = tmp_path / "run"
    (output / "elastic").mkdir(parents=True)
    (output / record).write_text(DEEP)
    proc = supervise(output, script(tmp_path / "fake-horovodrun", FAILING_LAUNCHER), "deep", "--max-restarts", 0)
    out = finish_command(proc, timeout=60)
    assert "Traceback" not in out and "RecursionError" not in out, out[-3000:]
    said = f"{output / record}: nested 100,000 levels deep (at most 32): not a record"
    if record == "elastic/RUNNING.lock":
        assert proc.returncode == 2 and "another supervisor runs on this output" in out and said in out, out
        return
    assert proc.returncode == supervisor.EXIT_GAVE_UP, out
    assert (said in out) == (record == "elastic/job.json"), out
    assert [e["event"] for e in timeline(output)][0] == "launch (start)"


def test_the_trainers_lock_nested_deep_is_named_by_the_run_it_refuses(tmp_path):
    """The trainer's own path to its lock (run_lock.acquire): a fresh damaged lock is refused naming it."""
    (tmp_path / "RUNNING.lock").write_text(DEEP)
    with pytest.raises(run_lock.OutputBusyError, match="nested 100,000 levels deep"):
        run_lock.acquire(str(tmp_path))


# Stands in for horovodrun whose one rank dies reading a file, as a .bin that crashes the .bin loader would
# kill it: the rank notes the file as the trainer's loaders do (runtime/reading.py; where there is none, it
# just dies), records its crash as the trainer does (faulthandler), and crashes (SIGSEGV). Launch N reads
# the N-th of FAKE_FILES (the last one again after them).
CRASHING_LAUNCHER = """#!/usr/bin/env bash
echo x >> "$FAKE_STATE"
"$FAKE_PYTHON" -c 'import ctypes, faulthandler, os, sys
output, files, launch = sys.argv[1], sys.argv[2].split(","), sum(1 for _ in open(sys.argv[3]))
file = files[min(launch, len(files)) - 1]
os.makedirs(os.path.join(output, "logs"), exist_ok=True)
faulthandler.enable(open(os.path.join(output, "logs", "crash-rank0.txt"), "w"))
try:
    from mxnet_pfc.runtime import reading
    reading.note_in(os.path.join(output, "logs", "reading-rank0.txt"))
    note = reading.reading(file)
except ImportError:
    import contextlib
    note = contextlib.nullcontext()
with note:
    ctypes.string_at(0)' "$FAKE_OUTPUT" "$FAKE_FILES" "$FAKE_STATE"
exit 1
"""


def test_a_rank_that_dies_twice_reading_the_same_file_is_not_a_lost_rank(tmp_path):
    """A rank that dies reading x.bin, then y.bin, then y.bin again (from the same starting point): the
    first two are relaunched as lost ranks, naming the file; the second death on y.bin in a row ends the
    supervision at once, naming the file (with --max-restarts 5 it used to relaunch until they ran out)."""
    output, launched = tmp_path / "run", tmp_path / "launched"
    files = [tmp_path / "x.bin", tmp_path / "y.bin"]
    for file in files:
        file.write_bytes(b"a verification set that crashes its reader")
    fake = script(tmp_path / "fake-horovodrun", CRASHING_LAUNCHER)
    proc = start_command(ELASTIC + ["--host-discovery-script", "echo localhost:1", "--horovodrun", fake,
                                    "--max-restarts", 5, "--discovery-interval", 1,
                                    "--", "--output", output, "--max_update", 5],
                         env={"FAKE_OUTPUT": str(output), "FAKE_FILES": ",".join(map(str, files)),
                              "FAKE_STATE": str(launched), "FAKE_PYTHON": sys.executable})
    out = finish_command(proc, timeout=120)
    events = [e["event"] for e in timeline(output)]
    assert proc.returncode == 1 and len(events) == 4, (events, out[-3000:])
    x, y = map(os.path.realpath, files)
    crash = "Segmentation fault in File "             # then where: faulthandler's innermost frame
    assert events[1].startswith(f"launch (restart 1/5: the job lost a rank or host (exit 1); rank 0 died reading "
                                f"{x} ({crash}"), events
    assert events[2].startswith(f"launch (restart 2/5: the job lost a rank or host (exit 1); rank 0 died reading "
                                f"{y} ({crash}"), events
    assert events[3].startswith(f"failed again on the same file (exit 1): rank 0 died reading {y} ({crash}"), events
    assert events[3].endswith("), twice, both times from the start: the file causes it, not a lost rank; not "
                              "relaunched (replace or remove the file)"), events


def test_records_are_read_within_bounds(tmp_path):
    """The one reader of the JSON records a supervisor and the lock read (runtime/files.read_json): a FIFO
    is refused without blocking, /dev/zero without reading forever, a large or deep file by name; brackets
    inside strings are text, not nesting."""
    from mxnet_pfc.runtime.files import RecordFileError, read_json
    fifo, zero, large, deep = tmp_path / "fifo.json", tmp_path / "zero.json", tmp_path / "large.json", tmp_path / "d"
    os.mkfifo(fifo)
    zero.symlink_to("/dev/zero")
    large.write_text(json.dumps({"x": "a" * (1 << 20)}))
    deep.write_text("[" * 33 + "]" * 33)
    for path, said in ((fifo, " is not a regular file (a FIFO)"), (zero, " is not a regular file (a character device)"),
                       (large, " is 1,048,585 bytes, more than a record may be (the limit is 1,048,576 bytes)"),
                       (deep, ": nested 33 levels deep (at most 32)")):
        with pytest.raises(RecordFileError, match=re.escape(f"{path}{said}")):
            read_json(str(path))
    text = tmp_path / "text.json"
    text.write_text(json.dumps({"a": ["[" * 100, "\\\"{{{", [[1]]]}))
    assert read_json(str(text)) == {"a": ["[" * 100, "\\\"{{{", [[1]]]}
    text.write_text("{\"a\": 1")
    with pytest.raises(RecordFileError, match=re.escape(f"{text}: not JSON: ")):
        read_json(str(text))


# Dies (exit 9) the moment it opens sys.argv[2] inside LOADER, as a rank killed reading that file would:
# the trainer's note of the file it reads (runtime/reading.py) is then left behind in sys.argv[1].
DIES_READING = """import os, sys, importlib
from mxnet_pfc.runtime import reading
module, name = sys.argv[3].rsplit(".", 1)
load = getattr(importlib.import_module(module), name)
reading.note_in(sys.argv[1])
target = os.path.realpath(sys.argv[2])
def die(event, args):
    if event == "open" and isinstance(args[0], str) and os.path.realpath(args[0]) == target:
        os._exit(9)
sys.addaudithook(die)
try:
    load(sys.argv[2] + sys.argv[4])
except Exception:
    pass
"""


@pytest.mark.parametrize("loader", ["mxnet_pfc.eval.verification.load_bin",
                                    "mxnet_pfc.runtime.mxnet_files.load_arrays"])
def test_the_loaders_of_handed_files_note_the_file_a_rank_dies_reading(tmp_path, loader):
    """A .bin set and an MXNet array file (--pretrained, --teacher, --init_centers, a checkpoint's) are
    noted while they are read: a rank that dies reading one leaves its real path for the supervisor; one
    that gets through (here: an error) leaves nothing."""
    from launch import rank_env
    note, handed = tmp_path / "reading-rank0.txt", tmp_path / "handed.bin"
    handed.write_bytes(b"\x80\x04 not what it claims")
    link = tmp_path / "link.bin"
    link.symlink_to(handed)
    died = subprocess.run([sys.executable, "-c", DIES_READING, note, link, loader, ""], env=rank_env(),
                          capture_output=True, text=True, timeout=120)
    assert died.returncode == 9 and note.read_text() == f"{handed}\n", (died.returncode, died.stderr[-2000:])
    note.unlink()
    lived = subprocess.run([sys.executable, "-c", DIES_READING, note, link, loader, ".missing"], env=rank_env(),
                           capture_output=True, text=True, timeout=120)
    assert lived.returncode == 0 and not note.exists(), lived.stderr[-2000:]
