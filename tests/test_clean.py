"""The clean command on 2 ranks: a sub-center run's set cleaned, every image judged once, continued when run again.

A short sub-center ArcFace run through config.sh on a set with planted label noise (written by the
synthetic command), then `python -m mxnet_pfc.clean` under horovodrun: the cleaned set holds exactly the
kept images, their bytes unchanged, under compact labels; labels.tsv and report.json agree with it; run
again it continues from the ranks' verdicts; other arguments are refused unless --start-over; and it never
writes into the source set's folder. (How well it finds the noise after a real run: docs/benchmarks.md.)
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from launch import REPO, config_sh, run_command, run_ranks, tiny_synthetic_run
from mxnet_pfc.data.records import open_records, unpack_image_record


def payloads(rec) -> "dict[int, tuple[bytes, int]]":
    reader, records = open_records(str(rec))
    found = {}
    for key in records.image_records:
        raw = reader.read(int(key))
        payload, label, _ = unpack_image_record(raw, int(key), reader.offset(int(key)), str(rec))
        found[int(key)] = (payload, int(label))
    return found


@pytest.fixture(scope="module")
def noisy_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("clean")
    data = tmp / "data"
    made = subprocess.run([sys.executable, "-m", "mxnet_pfc.data.synthetic", "--output", str(data), "--identities",
                           "40", "--images-per-identity", "8", "--val-identities", "10", "--val-pairs", "100",
                           "--label-noise", "0.25"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    run = tmp / "run"
    proc = run_command(config_sh(*tiny_synthetic_run(data, run, "--loss", "subcenter-arcface", "--max_update", 8,
                                                     "--synthetic_identities", 0)), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return tmp, data, run


def clean(run, data, out, *extra):
    return run_ranks(2, ["-m", "mxnet_pfc.clean", run, "--rec", data / "train.rec", "--out", out, *extra],
                     timeout=240)


def test_the_cleaned_set_holds_the_kept_images_under_compact_labels_and_a_rerun_continues(noisy_run):
    tmp, data, run = noisy_run
    out = tmp / "clean"
    proc = clean(run, data, out, "--threshold", "80")
    assert proc.returncode == 0, proc.stdout[-4000:]
    report = json.loads((out / "report.json").read_text())
    verdicts = [np.load(out / ".work" / f"verdicts-rank{r:05d}-of-00002.npz") for r in range(2)]
    keys = np.concatenate([v["keys"] for v in verdicts])
    kept = np.concatenate([v["kept"] for v in verdicts])
    source = payloads(data / "train.rec")
    assert sorted(keys.tolist()) == sorted(source), "every image judged once, by the rank that owns its class"
    assert report["images"] == 320 and report["kept"] + report["dropped"] == 320 and report["kept"] == kept.sum()
    for v, r in zip(verdicts, range(2)):     # each rank judged the classes it owns: 20 each
        assert set(np.unique(v["labels"])) <= set(range(20 * r, 20 * r + 20))
    cleaned = payloads(out / "train.rec")
    table = [line.split("\t") for line in (out / "labels.tsv").read_text().splitlines()[1:]]
    new_label = {int(old): int(new) for old, new, _, _ in table}
    assert sorted(payload for payload, _ in cleaned.values()) == sorted(
        source[int(k)][0] for k in keys[kept]), "the kept images, their bytes unchanged"
    by_payload = {payload: label for payload, label in cleaned.values()}
    for k in keys[kept]:
        payload, old = source[int(k)]
        assert by_payload[payload] == new_label[old]
    left = sorted({label for _, label in cleaned.values()})
    assert left == list(range(report["classes_left"])), "labels renumbered 0 .. classes left - 1"
    assert (out / "property").read_text().startswith(f"{report['classes_left']},")
    assert (out / "angles.png").stat().st_size > 0

    # run again: the ranks' verdicts are kept, and a lost one is judged again, the same
    os.remove(out / ".work" / "verdicts-rank00001-of-00002.npz")
    again = clean(run, data, out, "--threshold", "80")
    assert again.returncode == 0 and "continuing" in again.stdout, again.stdout[-4000:]
    assert json.loads((out / "report.json").read_text()) == report
    assert payloads(out / "train.rec") == cleaned


def test_other_arguments_are_refused_unless_start_over_and_the_source_folder_is_never_written(noisy_run):
    tmp, data, run = noisy_run
    out = tmp / "clean-twice"
    assert clean(run, data, out).returncode == 0
    refused = clean(run, data, out, "--threshold", "60")
    assert refused.returncode != 0 and "holds the verdicts of another cleaning" in refused.stdout
    assert refused.stdout.count("pass --start-over") >= 2, "every rank says why"
    assert "Traceback" not in refused.stdout
    redone = clean(run, data, out, "--threshold", "60", "--start-over")
    assert redone.returncode == 0 and json.loads((out / "report.json").read_text())["threshold_degrees"] == 60
    before = sorted(os.listdir(data))
    inside = clean(run, data, data / "clean")
    assert inside.returncode != 0 and "the cleaned set is written beside the source, never into it" in inside.stdout
    assert sorted(os.listdir(data)) == before
