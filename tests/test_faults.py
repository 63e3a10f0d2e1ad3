"""Faults on 2 ranks: a rank killed mid-training or mid-save, NaN centers, a damaged data set.

Each run is the reference run of conftest (30 steps, a checkpoint every 8)
interrupted somewhere; what follows must be what the uninterrupted run did.
"""
import ctypes
import json
import os
import re
import shutil
import signal
import time

import numpy as np

from launch import (
    REFERENCE_RUN,
    ckpt,
    config_sh,
    finish_command,
    last_logged_step,
    losses,
    rank_stop_line,
    run_command,
    saved_steps,
    start_command,
    tiny_synthetic_run,
    trainer_pid,
    wait_until,
)
from mxnet_pfc.runtime import checkpoints

# A dead process closes its sockets and the launcher ends the job at once (measured
# well under a second here); this allows for a slow, loaded machine.
LOST_RANK_BOUND_S = 20


def tensorboard_events(folder):
    """Every Event in the event files of `folder`, file by file (TFRecord framing: length, crc, data, crc)."""
    from mxboard.proto.event_pb2 import Event
    events = []
    for name in sorted(os.listdir(folder)):
        raw = open(folder / name, "rb").read()
        at = 0
        while at < len(raw):
            length = int.from_bytes(raw[at:at + 8], "little")
            events.append(Event.FromString(raw[at + 12:at + 12 + length]))
            at += 12 + length + 4
    return events


def kill_rank(output, rank):
    pid = wait_until(lambda: trainer_pid(output, rank), 30, f"rank {rank}'s trainer")
    os.kill(pid, signal.SIGKILL)
    return time.time()


def test_killed_rank_stops_the_job_and_resume_continues_the_loss_curve(reference, tmp_path):
    data, uninterrupted = reference
    output = tmp_path / "run"
    proc = start_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN)))
    wait_until(lambda: last_logged_step(output) >= 18, 240, "step 18 (past the step-16 checkpoint)", proc=proc)
    killed_at = kill_rank(output, 1)
    out = finish_command(proc, timeout=120)
    stopped_after = time.time() - killed_at
    assert proc.returncode != 0, out[-3000:]
    assert stopped_after < LOST_RANK_BOUND_S, f"the job took {stopped_after:.1f} s to stop"
    assert "exit with status code 137" in out                          # horovodrun names the lost rank
    # Rank 0 says why it stopped: its collective failed, or the launcher ended it.
    line = rank_stop_line(out, 0)
    assert "rank 1 (pid " in line and "ended without a message" in line or "lost contact" in line, out[-3000:]
    assert "done:" not in out
    killed_step = last_logged_step(output)
    latest = saved_steps(output / "checkpoints")[-1]
    assert 16 <= latest < killed_step + 1
    newest = checkpoints.latest(str(output / "checkpoints")).path

    resumed = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest")),
                          timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert f"resuming from {newest} (" in resumed.stdout
    # The whole curve (steps 1..latest from the killed run, the rest resumed) is the uninterrupted one.
    expected, got = losses(uninterrupted), losses(output)
    assert sorted(got) == list(range(1, 31))
    # one record per step: the killed run's records after the checkpoint were dropped, not repeated
    steps = [json.loads(line)["step"] for line in open(output / "metrics.jsonl") if '"loss"' in line]
    assert steps == sorted(set(steps)), steps
    # and TensorBoard is told that the run restarted after the checkpoint (it drops the later points)
    starts = [event.step for event in tensorboard_events(output / "tensorboard") if event.HasField("session_log")
              and event.session_log.status == event.session_log.START]
    assert starts == [1, latest + 1], starts
    np.testing.assert_allclose([got[s] for s in range(1, 31)], [expected[s] for s in range(1, 31)], rtol=1e-5)


def test_kill_during_a_checkpoint_save_leaves_the_previous_one(reference, tmp_path):
    data, _ = reference
    output = tmp_path / "run"
    # 200k classes: each rank writes ~400 MB of centers and momentum, so the save lasts long enough to be hit.
    run = tiny_synthetic_run(data, output, *REFERENCE_RUN, "--num_classes", 200_000, "--synthetic_identities", 0,
                             "--sample_rate", 0.01)
    proc = start_command(config_sh(*run))
    partial = output / "checkpoints" / "ckpt-000002-step-00000016.tmp"
    wait_until(partial.exists, 240, "the step-16 save to begin", interval=0.002, proc=proc)
    kill_rank(output, 0)                  # rank 0 is the one that completes a checkpoint
    out = finish_command(proc, timeout=120)
    assert proc.returncode != 0, out[-3000:]
    root = output / "checkpoints"
    assert partial.exists() and saved_steps(root) == [8], os.listdir(root)
    assert checkpoints.locate(root, "latest") == str(root / "ckpt-000001-step-00000008")

    resumed = run_command(config_sh(*run, "--resume", "latest", "--max_update", 17, "--val_targets", ""),
                          timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "at step 8, epoch 0" in resumed.stdout
    assert saved_steps(root) == [16, 17] and not partial.exists()   # the stale .tmp is cleared


def test_nan_centers_in_a_checkpoint_are_refused_on_every_rank_naming_the_file(reference, tmp_path):
    """A checkpoint edited to hold NaN centers is refused at resume, naming the file (it used to train a step
    and stop on a NaN loss, without naming the checkpoint as the cause)."""
    data, uninterrupted = reference
    output = tmp_path / "run"
    saved = output / "checkpoints" / ckpt(uninterrupted / "checkpoints", 24).name
    shutil.copytree(ckpt(uninterrupted / "checkpoints", 24), saved)
    centers = np.load(saved / "centers-rank00001.npy")
    centers[3] = np.nan
    np.save(saved / "centers-rank00001.npy", centers)
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN, "--resume", "latest")),
                       timeout=300)
    assert proc.returncode != 0
    message = f"{saved / 'centers-rank00001.npy'}: non-finite values (NaN or inf) in its centers"
    assert message in proc.stdout, proc.stdout[-3000:]
    assert message in (output / "logs" / "rank1.log").read_text()     # rank 1 reads that shard
    assert "failed on rank 1" in (output / "logs" / "rank0.log").read_text() or \
        message in (output / "logs" / "rank0.log").read_text()
    assert saved_steps(output / "checkpoints") == [24]        # nothing written after it


def test_undecodable_record_stops_every_rank_with_its_position(tmp_path):
    data = tmp_path / "data"
    setup = run_command(config_sh(*tiny_synthetic_run(data, tmp_path / "first", "--max_update", 1,
                                                      "--val_targets", "")), timeout=300)
    assert setup.returncode == 0, setup.stdout[-3000:]
    # Overwrite record 7's image bytes (past its 8-byte RecordIO head and 24-byte IRHeader).
    from mxnet_pfc.data.records import open_records
    reader, _ = open_records(str(data / "train.rec"))
    offset = reader.idx[7]
    reader.close()
    with open(data / "train.rec", "r+b") as f:
        f.seek(offset + 8 + 24)
        f.write(b"\0" * 64)
    proc = run_command(config_sh(*tiny_synthetic_run(data, tmp_path / "run", "--max_update", 40,
                                                     "--val_targets", "")), timeout=300)
    assert proc.returncode != 0
    assert f"record 7 (byte {offset}) does not decode as an image" in proc.stdout, proc.stdout[-3000:]
    # both ranks name it: the one that read it, and the other (from its failure record), whatever
    # horovodrun says was the first process to exit
    for rank in (0, 1):
        line = rank_stop_line(proc.stdout, rank)
        assert f"record 7 (byte {offset})" in line, proc.stdout[-4000:]
    assert "done:" not in proc.stdout


def test_a_crashed_rank_is_named_with_where_it_crashed(tmp_path):
    """A rank that crashes (SIGSEGV, as a fault inside MXNet or Horovod would) leaves every thread's
    Python stack in logs/crash-rankR.txt, and the other rank says that it crashed and where."""
    output = tmp_path / "run"
    proc = start_command(config_sh("--dataset", "speed-1m", "--num_classes", 1000, "--network", "r18-lite",
                                   "--batch_size", 4, "--max_update", 100_000, "--frequent", 2, "--output", output))
    wait_until(lambda: last_logged_step(output) >= 2, 180, "the first logged step", proc=proc)
    pid = wait_until(lambda: trainer_pid(output, 1), 30, "rank 1's trainer")
    # to its main thread (tgkill; its thread id is its pid), so that the dump has a Python frame to name
    assert ctypes.CDLL(None, use_errno=True).syscall(234, pid, pid, signal.SIGSEGV) == 0     # SYS_tgkill, x86_64
    out = finish_command(proc, timeout=120)
    assert proc.returncode != 0
    dump = (output / "logs" / "crash-rank1.txt").read_text()
    assert dump.startswith("Fatal Python error: Segmentation fault") and "Current thread" in dump, dump[:2000]
    message = rank_stop_line(out, 0)
    assert re.search(r"rank 1 crashed: Segmentation fault (in File \".*\", line \d+ in \S+|outside Python code)",
                     message) and "crash-rank1.txt" in message, out[-3000:]
    # rank 0 did not crash first: no dump (its empty file is removed unless the launcher killed it first),
    # or one written after rank 1's (MXNet may crash in a rank whose peer died, as it stops: seen in CI)
    rank0 = output / "logs" / "crash-rank0.txt"
    assert not rank0.exists() or rank0.stat().st_size == 0 or \
        rank0.stat().st_mtime_ns >= (output / "logs" / "crash-rank1.txt").stat().st_mtime_ns
