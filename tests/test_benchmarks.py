"""The benchmark scripts run and print their figures (small sizes; the figures themselves are not tested)."""
import json
import re
import subprocess
import sys

from launch import REPO, run_ranks, skip_in_fast_lane
from mxnet_pfc.head.margin import LOSSES


def test_bench_train_prints_the_step_beside_its_parts(tmp_path):
    out = tmp_path / "train.jsonl"
    proc = run_ranks(2, ["benchmarks/bench_train.py", "--num-classes", 2000, "--extra-classes", 1000, "--batch-size",
                         4, "--grad-accum", 2, "--rounds", 1, "--warmup", 1, "--json", out], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "x its parts alone" in proc.stdout and "a timed step costs" in proc.stdout
    assert "2000 + 1000 classes (2 head(s), rows 3 + 1)" in proc.stdout        # two sets, a head each
    result = json.loads(out.read_text())
    assert result["grad_accum"] == 2 and result["step_ms"] > 0 and result["head_ms"] > 0 and result["rows"] == [3, 1]
    assert set(result["phase_shares"]) == {"forward", "head", "backward", "update"}


def test_bench_head_prints_the_ratio_to_its_matmuls(tmp_path):
    out = tmp_path / "head.jsonl"
    proc = run_ranks(2, ["benchmarks/bench_head.py", "--num-classes", 5000, "--steps", 1, "--warmup", 1,
                         "--json", out], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(out.read_text())
    assert result["num_classes"] == 5000 and result["ratio"] > 0


def test_bench_head_times_every_loss_beside_arcface(tmp_path):
    """The loss axis (--versus): every loss of margin.LOSSES, a table row and a JSON record each."""
    out = tmp_path / "losses.jsonl"
    proc = run_ranks(2, ["benchmarks/bench_head.py", "--num-classes", 2000, "--steps", 2, "--warmup", 1,
                         "--versus", "arcface", "--margin", *LOSSES, "--json", out], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    table = proc.stdout[proc.stdout.index("arcface ms"):]
    for name in LOSSES:     # the row: the name, both medians and the ratio
        assert re.search(rf"(^|:){re.escape(name)} +[\d.]+ +[\d.]+ +[\d.]+ ", table, re.MULTILINE), table
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["loss"] for r in results] == list(LOSSES)
    assert all(r["versus"] == "arcface" and r["ratio"] > 0 and r["versus_ms"] > 0 for r in results)
    curricular = results[list(LOSSES).index("curricularface")]
    # its collective is timed in its head, and absent from ArcFace's
    assert curricular["loss_parts_ms"]["hard_negatives"] > 0
    assert curricular["versus_parts_ms"]["hard_negatives"] == 0


def test_bench_overlap_finds_the_planted_pairs_and_projects(tmp_path):
    out = tmp_path / "overlap.jsonl"
    proc = run_ranks(2, ["benchmarks/overlap_search.py", "--classes", 3000, "--embedding-size", 64, "--planted", 50,
                         "--block-rows", 1000, "--json", out], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "projection to 2,000,000 x 2,000,000 on 64 ranks" in proc.stdout
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and result["found"] == 50 and result["seconds"] > 0
    assert result["received_bytes_per_rank"] == 3000 * 64 * 4 / 2


def test_bench_memory_finds_every_phase_of_a_run_and_its_resume(tmp_path):
    """bench_memory.py follows each rank through a run's phases (from its log lines) to a peak per phase."""
    out = tmp_path / "memory.jsonl"
    options = ["--num-classes", 2000, "--embedding-size", 64, "--network", "r18-lite", "--batch-size", 4,
               "--steps", 4, "--save-at", 2,
               "--output", tmp_path / "run", "--json", out, "--timeout", 240]
    cmd = [sys.executable, "benchmarks/bench_memory.py", *map(str, options)]
    skip_in_fast_lane(cmd)          # it launches the ranks it measures
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "x training's high-water mark" in proc.stdout
    peaks = json.loads(out.read_text())["peak_bytes"]
    assert set(peaks) == {"0", "1"}
    for rank in peaks.values():
        assert set(rank) == {"start-up", "training", "first checkpoint", "the end", "resume start-up"}
        assert all(value > 50e6 for value in rank.values())       # a trainer's process, read every phase
