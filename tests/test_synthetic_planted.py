"""Synthetic sets with planted flaws (label noise, split identities, identities shared with another set).

The sets are written by the command as users run it (`python -m mxnet_pfc.data.synthetic`) and read back
through the records reader the trainer uses: every case planted.json lists is what the set holds.
"""
import json
import os
import subprocess
import sys

import numpy as np

from launch import REPO
from mxnet_pfc.data import synthetic_set
from mxnet_pfc.data.records import open_records, read_record, unpack_image_record

SMALL = ["--images-per-identity", "6", "--val-identities", "4", "--val-pairs", "10"]


def synthetic(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mxnet_pfc.data.synthetic", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})


def labels_by_key(folder) -> "dict[int, int]":
    reader, records = open_records(str(folder / "train.rec"))
    found = {}
    for key in records.image_records:
        raw = read_record(reader, int(key), records.rec_path)
        found[int(key)] = int(unpack_image_record(raw, int(key), reader.offset(int(key)), records.rec_path)[1])
    return found


def test_a_planted_set_holds_what_planted_json_says(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    assert synthetic("--output", str(a), "--identities", "20", *SMALL).returncode == 0
    done = synthetic("--output", str(b), "--seed", "1", "--identities", "16", *SMALL, "--label-noise", "0.2",
                     "--split-identities", "3", "--share", "5", "--share-with", str(a))
    assert done.returncode == 0, done.stderr
    truth = json.loads((b / "planted.json").read_text())
    labels = labels_by_key(b)
    assert (b / "property").read_text().split(",")[0] == "19"                  # 16 identities + 3 second labels
    assert sorted(set(labels.values())) == list(range(19))                      # every label keeps images
    assert len(labels) == 16 * 6 and len(truth["noise"]) == round(0.2 * 16 * 6)
    owner = {label: label for label in range(16)} | {s["labels"][1]: s["identity"] for s in truth["split"]}
    for case in truth["noise"]:
        assert labels[case["key"]] == case["label"] and owner[case["label"]] != case["identity"]
    assert len(truth["split"]) == 3 and all(s["labels"][1] >= 16 for s in truth["split"])
    # the shared identities are the other set's own draws, under labels of their own here
    pairs = truth["shared"]["pairs"]
    assert len(pairs) == 5 and truth["shared"]["seed"] == 0 and truth["shared"]["identities"] == 20
    ids_a = synthetic_set.draw_identities(np.random.default_rng(0), 20)
    ids_b = synthetic_set.plant(16, 6, 1, synthetic_set.shared_from(str(a), 5))[0]
    for here, there in pairs:
        assert all(np.array_equal(ids_b[name][here], ids_a[name][there]) for name in ids_a)
    others = set(range(16)) - {here for here, _ in pairs}
    assert not any(np.array_equal(ids_b["skin"][here], ids_a["skin"][there]) for here in others for there in range(20))


def test_a_clean_set_is_written_as_before(tmp_path):
    """No planted.json, the stamp of the version before, and the same identities whatever is planted."""
    synthetic_set.generate(str(tmp_path), identities=4, images_per_identity=2, val_identities=2, val_pairs=4)
    assert not (tmp_path / "planted.json").exists()
    assert (tmp_path / "COMPLETE").read_text() == "version=4 identities=4 images_per_identity=2 val_pairs=4 seed=0\n"
    clean = synthetic_set.plant(4, 2, 0, synthetic_set.Planted())
    noisy = synthetic_set.plant(4, 2, 0, synthetic_set.Planted(label_noise=0.25, split_identities=1))
    assert all(np.array_equal(clean[0][name], noisy[0][name]) for name in clean[0])
    assert np.array_equal(clean[1], noisy[1]) and not np.array_equal(clean[2], noisy[2])


def test_impossible_plantings_are_refused_naming_them(tmp_path):
    for args, said in ((["--label-noise", "1.5"], "label noise 1.5 is not a share in [0, 1)"),
                       (["--split-identities", "9"], "9 split identities of 4"),
                       (["--share", "2"], "--share and --share-with go together"),
                       (["--share", "2", "--share-with", str(tmp_path)], "not a finished synthetic set")):
        done = synthetic("--output", str(tmp_path / "out"), "--identities", "4", *SMALL, *args)
        assert done.returncode != 0 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
