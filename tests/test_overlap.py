"""The overlap command: identities shared by the sets of a run, found by their centers on 1 and 2 ranks, merged.

A hand-made checkpoint of a run of three sets (state.json format 4, the banks as the trainer saves them, on
3 ranks) with planted shared classes: `python -m mxnet_pfc.overlap` on 1 and 2 ranks finds exactly them
(one center per class, and sub-centers sharing one mode), writes the table, report and histogram, and
--merge writes one set (a RecordIO set and an image folder merged) whose labels follow label_map.tsv and
which holds every image once. Refused with the reason: a run of one set, damaged extra_heads or shards,
an output folder inside a set's folder. The end-to-end test on trained synthetic sets: test_overlap_run.py.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from launch import REPO, run_ranks
from mxnet_pfc import overlap
from mxnet_pfc.data.records import RecordWriter, open_records, unpack_image_record
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.errors import CheckpointError

D = 128                 # random unit centers' cosines have a spread of 1/sqrt(128) = 0.09: none near 0.5
SIZES = (30, 25, 20)
SAVED_WORLD = 3
# (set, class, set, class) of the same identity; 0:4 ~ 1:7 ~ 2:2 is one group of three
PLANTED = {(0, 4, 1, 7), (1, 7, 2, 2), (0, 4, 2, 2), (0, 11, 1, 0), (0, 29, 2, 19), (1, 24, 2, 5)}


def planted_centers(rng, K: int) -> "list[np.ndarray]":
    """Each set's centers (classes x K x D); a planted pair shares one identity direction (with K > 1: one
    sub-center each, the others random)."""
    centers = [rng.normal(size=(n, K, D)).astype(np.float32) for n in SIZES]
    identity = {}
    for sa, a, sb, b in sorted(PLANTED):
        direction = identity.setdefault((sa, a), centers[sa][a, 0])
        identity[sb, b] = direction
        centers[sb][b, K - 1] = direction + 0.3 * rng.normal(size=D) / np.sqrt(D) * np.linalg.norm(direction)
    return centers


def write_checkpoint(folder, centers, K: int, config: dict, extra_heads=None) -> None:
    """A checkpoint of a run of len(centers) sets on SAVED_WORLD ranks, as the trainer writes it."""
    heads = []
    for s, rows in enumerate(centers):
        shards = [list(shard_range(len(rows), r, SAVED_WORLD)) for r in range(SAVED_WORLD)]
        where = checkpoints.head_folder(str(folder), s)
        os.makedirs(where, exist_ok=True)
        for r, (start, count) in enumerate(shards):
            shard = rows[start:start + count].reshape(count * K, D)
            np.save(os.path.join(where, f"centers-rank{r:05d}.npy"), shard)
            np.save(os.path.join(where, f"momentum-rank{r:05d}.npy"), np.zeros_like(shard))
        heads.append({"num_classes": len(rows), "shards": shards})
    checkpoints.State(format=checkpoints.SETS_FORMAT if len(heads) > 1 else 3, step=10, world_size=SAVED_WORLD,
                      num_classes=heads[0]["num_classes"], embedding_size=D, shards=heads[0]["shards"],
                      steps_per_epoch=5, global_batch=24, max_update=10, samples_seen=240,
                      config={"network": "r18-lite", **config}, sequence=1, subcenters=K,
                      extra_heads=heads[1:] if extra_heads is None else extra_heads).write(str(folder))


def write_sets(root) -> "tuple[dict, dict]":
    """Sets 0 and 2 as RecordIO sets, set 1 as an image folder; each image's bytes name it. (config, images
    {(set, class): [bytes, ...]})."""
    images = {}
    for s, n in enumerate(SIZES):
        for c in range(n):
            images[s, c] = [f"set{s}-class{c}-image{i}".encode() for i in range(1 + (s + c) % 3)]
    for s in (0, 2):
        writer = RecordWriter(str(root / f"set{s}"), sum(len(images[s, c]) for c in range(SIZES[s])), SIZES[s])
        for c in range(SIZES[s]):
            for payload in images[s, c]:
                writer.add(c, payload)
        writer.close()
    for c in range(SIZES[1]):
        folder = root / "set1" / f"person{c:03d}"
        folder.mkdir(parents=True)
        for i, payload in enumerate(images[1, c]):
            (folder / f"{i}.jpg").write_bytes(payload)
    config = {"rec": str(root / "set0" / "train.rec"),
              "extra_sets": [f"images:{root / 'set1'}", f"rec:{root / 'set2' / 'train.rec'}"]}
    return config, images


def read_set(folder) -> "list[tuple[bytes, int]]":
    reader, records = open_records(str(folder / "train.rec"))
    found = []
    for key in records.image_records:
        payload, label, _ = unpack_image_record(reader.read(int(key)), int(key), reader.offset(int(key)),
                                                records.rec_path)
        found.append((payload, int(label)))
    return found


def found_pairs(out) -> "dict[tuple, float]":
    lines = (out / "overlap.tsv").read_text().splitlines()
    assert lines[0] == "set\tclass\tset\tclass\tcosine"
    return {tuple(int(v) for v in line.split("\t")[:4]): float(line.split("\t")[4]) for line in lines[1:]}


@pytest.fixture(scope="module")
def three_sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("overlap")
    config, images = write_sets(root)
    run = root / "run"
    ckpt = run / "checkpoints" / checkpoints.folder_name(1, 10)
    write_checkpoint(ckpt, planted_centers(np.random.default_rng(0), 1), 1, config)
    return root, run, ckpt, images


def test_two_ranks_find_exactly_the_planted_pairs_and_merge_every_image_once(three_sets):
    root, run, _, images = three_sets
    out, merged = root / "found", root / "merged"
    proc = run_ranks(2, ["-m", "mxnet_pfc.overlap", run, "--out", out, "--merge", merged, "--block-rows", 4],
                     timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    pairs = found_pairs(out)
    assert set(pairs) == PLANTED and min(pairs.values()) > 0.85
    report = json.loads((out / "report.json").read_text())
    assert report["pairs"] == 6 and [p["pairs"] for p in report["pairs_of_sets"]] == [2, 2, 2]
    assert all(sum(h) == SIZES[int(name[0])] for name, h in report["best_cosine_histogram"].items() if name != "edges")
    assert (out / "cosines.png").stat().st_size > 0
    assert "set 0 and set 1: 2 pairs at cosine >= 0.5" in proc.stdout

    # the merged set: 75 classes, 4 groups of two or three members (5 classes fewer): 70 labels
    table = [line.split("\t") for line in (merged / "label_map.tsv").read_text().splitlines()[1:]]
    new_label = {(int(s), int(c)): int(label) for s, c, label in table}
    assert sorted(set(new_label.values())) == list(range(70)) and report["merged"]["labels"] == 70
    for sa, a, sb, b in PLANTED:
        assert new_label[sa, a] == new_label[sb, b]
    assert len(set(new_label.values())) == len(new_label) - 5
    written = read_set(merged)
    assert sorted(payload for payload, _ in written) == sorted(p for ps in images.values() for p in ps)
    owner = {payload: key for key, ps in images.items() for payload in ps}
    assert all(label == new_label[owner[payload]] for payload, label in written)
    assert [label for _, label in written] == sorted(label for _, label in written), "identity by identity"
    assert (merged / "property").read_text().startswith("70,")
    groups = (merged / "merged.tsv").read_text().splitlines()
    assert groups[1] == f"{new_label[0, 4]}\t0:4 1:7(person007) 2:2" and len(groups) == 5


def test_one_rank_finds_classes_sharing_one_sub_center(tmp_path):
    """K = 2: a planted pair shares one sub-center each, the other random; the best pair of sub-centers
    finds it (the search runs on the rows, k x K of them, then keeps each class's best)."""
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, planted_centers(np.random.default_rng(1), 2), 2, {})
    out = tmp_path / "found"
    proc = run_ranks(1, ["-m", "mxnet_pfc.overlap", ckpt, "--out", out, "--top-k", 2], timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert set(found_pairs(out)) == PLANTED
    assert json.loads((out / "report.json").read_text())["subcenters"] == 2


def test_the_best_classes_of_sub_center_rows_are_exact():
    """class_top against the classes' best pair computed densely: rows' k*K best B rows give each A class's
    k best B classes, each once."""
    rng = np.random.default_rng(3)
    K, k, a, b = 3, 4, rng.normal(size=(7 * 3, 8)), rng.normal(size=(9 * 3, 8))
    cos = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    rows = np.argsort(-cos, axis=1)[:, :k * K]
    best, ids = overlap.class_top(np.take_along_axis(cos, rows, 1), rows, K, k)
    dense = cos.reshape(7, K, 9, K).max(axis=(1, 3))
    assert np.array_equal(ids, np.argsort(-dense, axis=1)[:, :k])
    assert np.allclose(best, -np.sort(-dense, axis=1)[:, :k])


def test_unusable_inputs_are_refused_naming_the_problem(three_sets, tmp_path):
    root, run, ckpt, _ = three_sets
    one = tmp_path / "one"
    write_checkpoint(one, planted_centers(np.random.default_rng(0), 1)[:1], 1, {})
    with pytest.raises(overlap.OverlapError, match="a run of one set"):
        overlap.run_sets(str(one), checkpoints.State.read(str(one)))
    damaged = tmp_path / "damaged"
    write_checkpoint(damaged, planted_centers(np.random.default_rng(0), 1), 1, {},
                     extra_heads=[{"num_classes": 25, "shards": [[0, 10], [10, 10], [20, 4]]}, {"num_classes": 20}])
    with pytest.raises(CheckpointError, match=r"extra_heads\[0\].shards' does not split 25 classes"):
        checkpoints.State.read(str(damaged))
    state = checkpoints.State.read(str(ckpt))
    sets = overlap.run_sets(str(ckpt), state)
    for inside in (root / "set0", root / "set1" / "out", root / "set2" / "x" / "y"):
        with pytest.raises(overlap.OverlapError, match="inside it"):
            overlap.check_output(str(inside), sets, "--out")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(overlap.OverlapError, match="did not write"):
        overlap.check_output(str(tmp_path / "busy"), sets, "--merge")

    # the command itself: a shard cut short, and a one-set run, each a message on stderr, exit status 1
    cut = tmp_path / "cut"
    write_checkpoint(cut, planted_centers(np.random.default_rng(0), 1), 1, {})
    shard = checkpoints.head_folder(str(cut), 2) + "/centers-rank00001.npy"
    os.truncate(shard, os.path.getsize(shard) - 100)
    for folder, said in ((cut, "set-2/centers-rank00001.npy"),
                         (one, "a run of one set")):
        done = subprocess.run([sys.executable, "-m", "mxnet_pfc.overlap", str(folder), "--out", str(tmp_path / "o")],
                              cwd=REPO, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 1 and said in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_groups_join_pairs_transitively_numbered_by_their_first_member():
    sets = [overlap.SetHead(s, None, n, [], "") for s, n in enumerate((4, 3, 2))]
    group = overlap.groups(sets, {(0, 3, 1, 0), (1, 0, 2, 1), (0, 1, 2, 0)})
    assert [g.tolist() for g in group] == [[0, 1, 2, 3], [3, 4, 5], [1, 3]]
