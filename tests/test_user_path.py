"""A new user's path, run as users run it (config.sh under horovodrun).

Their own data is never written to, a resumed run always trains what is left, one run per output folder,
independent randomness per rank from step 0, and stops that say what happened."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest

from launch import (
    REFERENCE_RUN,
    REPO,
    TOY,
    ckpt,
    config_sh,
    finish_command,
    last_logged_step,
    losses,
    rank_stop_line,
    run_command,
    run_ranks,
    saved_steps,
    start_command,
    tiny_synthetic_run,
    trainer_pid,
    wait_until,
)
from mxnet_pfc.data import synthetic_set
from mxnet_pfc.data.records import DataError, RecordWriter
from mxnet_pfc.runtime import checkpoints, run_lock


def write_users_set(folder, identities, images_per_identity, seed=0):
    """A set as InsightFace's tools write it: header record, identity records, train.idx, property."""
    rng = np.random.default_rng(seed)
    writer = RecordWriter(str(folder), identities * images_per_identity, identities)
    for class_id in range(identities):
        colour = rng.integers(0, 256, size=3)
        for _ in range(images_per_identity):
            image = np.clip(colour + rng.normal(0, 20, size=(112, 112, 3)), 0, 255).astype(np.uint8)
            writer.add(class_id, synthetic_set.encode(image))
    writer.close()
    return folder / "train.rec"


def digests(folder):
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in sorted(os.listdir(folder))}


def test_own_set_with_the_default_preset_is_read_never_written(tmp_path):
    # The reported data loss: 500 identities, the default (synthetic) preset's own class count.
    mine = tmp_path / "mine"
    rec = write_users_set(mine, identities=500, images_per_identity=2)
    before = digests(mine)
    run = tmp_path / "run"
    proc = run_command(config_sh(*TOY, "--rec", rec, "--num_classes", 500, "--max_update", 3, "--frequent", 1,
                                 "--batch_size", 8, "--output", run), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert digests(mine) == before                      # not a byte written, nothing added
    config = json.load(open(run / "config.json"))
    assert config["val_targets"] == [] and config["synthetic_identities"] == 0
    assert "generating the synthetic set" not in proc.stdout and "step 3/3" in proc.stdout

    # Without --num_classes the count is read from the set (its property file), still not written to.
    proc = run_command(config_sh(*TOY, "--rec", rec, "--max_update", 1, "--batch_size", 8, "--output", tmp_path / "b"),
                       timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "num_classes = 500, read from the set" in proc.stdout
    assert digests(mine) == before


def test_generation_never_writes_over_files_it_did_not_write(tmp_path):
    (tmp_path / "train.rec").write_bytes(b"a user's own data")
    with pytest.raises(DataError, match="refusing to generate a synthetic set here.*train.rec"):
        synthetic_set.generate(str(tmp_path), identities=4, images_per_identity=2, val_identities=2, val_pairs=4)
    assert os.listdir(tmp_path) == ["train.rec"] and (tmp_path / "train.rec").read_bytes() == b"a user's own data"
    # a folder the generator made, or an empty one, it may (re)write
    synthetic_set.generate(str(tmp_path / "new"), identities=4, images_per_identity=2, val_identities=2, val_pairs=4)
    synthetic_set.generate(str(tmp_path / "new"), identities=5, images_per_identity=2, val_identities=2, val_pairs=4)
    assert synthetic_set.is_complete(str(tmp_path / "new"), 5, 2, 4)


def test_resume_on_fewer_ranks_trains_what_is_left(reference, tmp_path):
    data, run = reference
    resumed = tmp_path / "one"
    shutil.copytree(ckpt(run / "checkpoints", 24), resumed / "checkpoints" / ckpt(run / "checkpoints", 24).name)
    # 2 ranks x 8 = 16 samples a step, 30 steps = 480 samples; on 1 rank: 60 steps of 8, from step 48
    proc = run_command(config_sh(*tiny_synthetic_run(data, resumed, *REFERENCE_RUN, "--resume", "latest"), ranks=1),
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "kept in samples" in proc.stdout and "at step 48, epoch 1" in proc.stdout
    got = losses(resumed)
    assert sorted(got) == list(range(49, 61)) and all(np.isfinite(list(got.values())))
    final = checkpoints.State.read(ckpt(resumed / "checkpoints", 60))
    assert final.step == 60 and final.world_size == 1
    before = np.concatenate([np.load(ckpt(run / "checkpoints", 24) / f"centers-rank{r:05d}.npy")
                             for r in range(2)])
    after = np.load(ckpt(resumed / "checkpoints", 60) / "centers-rank00000.npy")
    assert np.abs(after - before).max() > 1e-4          # the centers trained on

    # a checkpoint at the end of its run has nothing left to train: refused, nothing written
    done = tmp_path / "done"
    shutil.copytree(ckpt(run / "checkpoints", 30), done / "checkpoints" / ckpt(run / "checkpoints", 30).name)
    proc = run_command(config_sh(*tiny_synthetic_run(data, done, *REFERENCE_RUN, "--resume", "latest")), timeout=240)
    assert proc.returncode != 0
    assert "nothing to train" in proc.stdout and "raise --max_update" in proc.stdout, proc.stdout[-3000:]
    assert os.listdir(done / "checkpoints") == [ckpt(run / "checkpoints", 30).name]
    assert not (done / "model-symbol.json").exists()


def test_second_run_into_a_busy_output_is_refused_and_a_dead_runs_lock_is_taken_over(reference, tmp_path):
    data, _ = reference
    output = tmp_path / "run"
    first = start_command(config_sh(*tiny_synthetic_run(data, output, "--max_update", 100000, "--frequent", 1,
                                                        "--save_interval", 0, "--val_targets", "")))
    try:
        wait_until(lambda: last_logged_step(output) >= 2, 240, "the first run's step 2", proc=first)
        holder = trainer_pid(output, 0)
        config = (output / "config.json").read_bytes()
        started = time.time()
        second = run_command(config_sh(*tiny_synthetic_run(data, output, "--max_update", 5, "--lr", 0.01)),
                             timeout=120)
        assert second.returncode != 0 and time.time() - started < 60
        assert f"{output} is in use by another run (pid {holder} on host" in second.stdout, second.stdout[-3000:]
        assert "starting the run failed on rank(s) 0" in second.stdout      # rank 1 says so too
        assert (output / "config.json").read_bytes() == config               # nothing of the second run written
        assert "'lr': 0.01" not in (output / "logs" / "rank1.log").read_text()
        assert first.poll() is None                                          # the first run trains on
        os.kill(holder, signal.SIGKILL)           # killed outright, it cannot release its lock
        finish_command(first, timeout=60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    assert (output / run_lock.LOCK_NAME).exists()
    # Its process is gone, so the next run takes the folder over.
    third = run_command(config_sh(*tiny_synthetic_run(data, output, "--max_update", 2, "--val_targets", "")),
                        timeout=240)
    assert third.returncode == 0, third.stdout[-4000:]
    assert "took over the output folder from a run that is gone" in third.stdout
    assert not (output / run_lock.LOCK_NAME).exists()                        # released at the end


def test_lock_of_another_host_is_stale_only_after_its_heartbeat_stops(tmp_path):
    other = run_lock.Holder("another-host", "boot", 1, "1", time.time(), "train --output x")
    (tmp_path / run_lock.LOCK_NAME).write_text(json.dumps(other.__dict__))
    with pytest.raises(run_lock.OutputBusyError, match="in use by another run .pid 1 on host another-host"):
        run_lock.acquire(str(tmp_path))
    old = time.time() - run_lock.STALE_SECONDS - 30
    os.utime(tmp_path / run_lock.LOCK_NAME, (old, old))
    lock = run_lock.acquire(str(tmp_path))
    assert "another-host" in lock.took_over and "not been refreshed" in lock.took_over
    assert json.load(open(tmp_path / run_lock.LOCK_NAME))["pid"] == os.getpid()
    with pytest.raises(run_lock.OutputBusyError, match=f"pid {os.getpid()} on host"):   # held: refused
        run_lock.acquire(str(tmp_path))
    lock.release()
    run_lock.acquire(str(tmp_path)).release()


def test_ranks_draw_independent_negatives_from_step_0(tmp_path):
    # 2 ranks x 10,000 local classes at rate 0.1: each draws 1,000 local ids (plus its few positives).
    # Independent draws share about 10% of them; one shared stream would share nearly all.
    output = tmp_path / "run"
    proc = run_ranks(2, [REPO / "tests" / "sampled_ids_worker.py", "--", "--dataset", "speed-1m",
                         "--num_classes", 20000,
                         "--sample_rate", 0.1, "--network", "r18-lite", "--batch_size", 4, "--max_update", 2,
                         "--dropout", 0.5, "--output", output], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    for step in (1, 2):
        ids = [set(np.load(output / f"sampled-rank{r}-step{step}.npy").tolist()) for r in range(2)]
        assert len(ids[0]) >= 1000 and len(ids[1]) >= 1000
        overlap = len(ids[0] & ids[1]) / len(ids[0])
        assert overlap < 0.25, f"step {step}: {overlap:.0%} of rank 0's sampled local ids were also rank 1's"


def test_ctrl_c_says_interrupted_and_how_to_resume(reference, tmp_path):
    data, _ = reference
    output = tmp_path / "run"
    proc = start_command(config_sh(*tiny_synthetic_run(data, output, "--max_update", 100000, "--frequent", 1,
                                                       "--val_targets", "")))
    wait_until(lambda: last_logged_step(output) >= 2, 240, "step 2", proc=proc)
    os.kill(proc.pid, signal.SIGINT)                    # what Ctrl-C in the terminal sends horovodrun
    out = finish_command(proc, timeout=60)
    assert proc.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(out, rank)
        assert "stopping: interrupted (SIGTERM" in line and "--resume latest" in line, out[-3000:]
    assert "another rank has failed" not in out and "failed:" not in out
    # and horovodrun (patched by make setup) says so too, with no traceback
    assert "horovodrun: interrupted (SIGINT)" in out and "Traceback" not in out, out[-3000:]
    assert proc.returncode == 128 + signal.SIGINT


def test_fewer_classes_than_ranks_is_a_clear_error_in_every_rank_log(tmp_path):
    proc = run_command(config_sh("--dataset", "speed-1m", "--num_classes", 1, "--network", "r18-lite",
                                 "--batch_size", 4, "--max_update", 1, "--output", tmp_path), timeout=120)
    assert proc.returncode != 0
    assert "<stderr>:Traceback" not in proc.stdout, proc.stdout[-3000:]      # (horovodrun's own may follow)
    for rank in (0, 1):
        assert "num_classes = 1 is below the number of ranks (2)" in (tmp_path / "logs" / f"rank{rank}.log").read_text()


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB file system (tmpfs) for the output; skipped where mounting is not allowed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    yield mount
    subprocess.run(["umount", "-l", str(mount)])


def test_disk_full_during_a_checkpoint_says_so_on_every_rank_and_keeps_the_previous(reference, small_disk):
    data, _ = reference
    output = small_disk / "run"
    # each checkpoint of this run takes ~9.1 MB: the one at step 8 fits, the one at step 16 does not
    proc = run_command(config_sh(*tiny_synthetic_run(data, output, *REFERENCE_RUN)), timeout=300)
    assert proc.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(proc.stdout, rank)
        assert "ckpt-000002-step-00000016 not written: the disk is full" in line, proc.stdout[-3000:]
        assert "MB free" in line and "ckpt-000001-step-00000008 (" in line and "is intact" in line, line
        assert "--resume latest" in line, line
    assert saved_steps(output / "checkpoints") == [8]
    assert os.listdir(output / "checkpoints") == ["ckpt-000001-step-00000008"]    # the partial save removed


def test_disk_full_at_start_up_is_said_by_every_rank(reference, small_disk):
    data, _ = reference
    subprocess.run(["dd", "if=/dev/zero", f"of={small_disk / 'fill'}", "bs=1M", "count=32"], capture_output=True)
    proc = run_command(config_sh(*tiny_synthetic_run(data, small_disk / "run", "--max_update", 2)), timeout=120)
    assert proc.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(proc.stdout, rank)
        assert "No space left on device" in line and "lost contact" not in line, proc.stdout[-3000:]
