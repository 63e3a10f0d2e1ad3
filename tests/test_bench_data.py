"""`make bench-data` (benchmarks/bench_data.py) builds its sets once and prints every figure.

Tiny sizes here; the figures themselves are not tested."""
import json
import sys

import pytest

from launch import run_command


@pytest.mark.slow
def test_bench_data_builds_once_and_prints_every_figure(tmp_path):
    out = tmp_path / "data.jsonl"
    args = [sys.executable, "benchmarks/bench_data.py", "--dir", tmp_path / "sets", "--records", 600, "--images", 300,
            "--small", 10, 30, "--index-records", 3000, "--repeat", 1, "--decode-images", 100, "--json", out]
    proc = run_command(args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "need about" in proc.stdout and "GB free" in proc.stdout          # the cost, said before building
    for line in ("start-up to the first batch:", "the index's resident memory:", "a new epoch's shuffle:",
                 "a resume mid-epoch", "image folder of 300:", "decoding, one thread over the whole set:",
                 "an index of 3,000 records alone:", "data.check (2 threads):"):
        assert line in proc.stdout, proc.stdout[-3000:]
    figures = json.loads(out.read_text())
    assert figures["records"] == 600 and figures["images"] == 300 and figures["small_images"] == 300
    assert figures["decoded"] == 100 and figures["pack_images_per_s"] > 0 and figures["check_images_per_s"] > 0
    # the sets are reused; a tree measured side by side (here the same one) gives the ratios
    again = run_command(args + ["--skip-commands", "--versus", "."], timeout=300)
    assert again.returncode == 0 and "need about" not in again.stdout, again.stdout[-3000:]
    assert "before / after: start-up, RecordIO set" in again.stdout
