"""The benchmark scripts run and print their figures (small sizes; the figures themselves are not tested)."""
import json

from launch import run_ranks


def test_bench_train_prints_the_step_beside_its_parts(tmp_path):
    out = tmp_path / "train.jsonl"
    proc = run_ranks(2, ["benchmarks/bench_train.py", "--num-classes", 2000, "--batch-size", 4, "--grad-accum", 2,
                         "--rounds", 1, "--warmup", 1, "--json", out], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "x its parts alone" in proc.stdout and "a timed step costs" in proc.stdout
    result = json.loads(out.read_text())
    assert result["grad_accum"] == 2 and result["step_ms"] > 0 and result["head_ms"] > 0
    assert set(result["phase_shares"]) == {"forward", "head", "backward", "update"}


def test_bench_head_prints_the_ratio_to_its_matmuls(tmp_path):
    out = tmp_path / "head.jsonl"
    proc = run_ranks(2, ["benchmarks/bench_head.py", "--num-classes", 5000, "--steps", 1, "--warmup", 1,
                         "--json", out], timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:]
    result = json.loads(out.read_text())
    assert result["num_classes"] == 5000 and result["ratio"] > 0
