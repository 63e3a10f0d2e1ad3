"""Training on your own data: an image folder without packing, its class count, its verification sets.

An image folder without packing (the same epoch logic as RecordIO, its file list cached beside the output),
the class count checked against the set, verification sets beside the set found, the float32 label limit, a
help sentence for every option."""
import dataclasses
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from launch import TOY, config_sh, rank_stop_line, run_command
from mxnet_pfc.data import folders, synthetic_set
from mxnet_pfc.data.faces import ImageError, decode_face
from mxnet_pfc.data.iterators import FolderIter, RecordIter, epoch_order
from mxnet_pfc.data.pack import pack
from mxnet_pfc.data.records import MAX_CLASSES, DataError, RecordWriter, read_property
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training.config import resolve_config
from test_damaged_images import damaged

IDENTITIES, PER_IDENTITY = 60, 6


def write_folder_set(root, identities=IDENTITIES, per_identity=PER_IDENTITY, seed=0):
    """ROOT/<identity>/<image>.jpg rendered by the synthetic generator."""
    rng = np.random.default_rng(seed)
    ids = synthetic_set.draw_identities(rng, identities)
    images = synthetic_set.render({k: np.repeat(v, per_identity, axis=0) for k, v in ids.items()}, rng)
    for i, image in enumerate(images):
        folder = root / f"person_{i // per_identity:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i % per_identity:02d}.jpg").write_bytes(synthetic_set.encode(image))
    return root


@pytest.fixture(scope="module")
def faces(tmp_path_factory):
    return write_folder_set(tmp_path_factory.mktemp("own") / "faces")


def test_folder_trains_through_config_sh_and_its_index_is_reused(faces, tmp_path):
    run = tmp_path / "run"
    args = (*TOY, "--images", faces, "--batch_size", 8, "--frequent", 1, "--output", run)
    proc = run_command(config_sh(*args, "--max_update", 3), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"num_classes = {IDENTITIES}, read from the set" in proc.stdout and "step 3/3" in proc.stdout
    assert f"listed {faces}: {IDENTITIES * PER_IDENTITY} images" in proc.stdout
    index = Path(RunFolder(str(run)).images_index)
    written = index.stat().st_mtime_ns
    # a restart (resumed) reads the index, does not list ROOT again
    proc = run_command(config_sh(*args, "--max_update", 4, "--resume", "latest"), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "from the index" in proc.stdout and f"listed {faces}" not in proc.stdout, proc.stdout[-3000:]
    assert index.stat().st_mtime_ns == written and "step 4/4" in proc.stdout


def test_damaged_jpeg_in_a_folder_stops_every_rank_naming_the_file(faces, tmp_path):
    root = tmp_path / "faces"
    shutil.copytree(faces, root)
    index = folders.scan(str(root))
    first = int(epoch_order(len(index), 8, 1, 2, 0, 0)[0, 0])         # rank 1's first image
    path = root / index.paths[first]
    bad = damaged(path.read_bytes(), 0.5, 1)[1]
    with pytest.raises(ImageError):
        decode_face(bad, "bad")
    path.write_bytes(bad)
    proc = run_command(config_sh(*TOY, "--images", root, "--batch_size", 8, "--max_update", 3,
                                 "--output", tmp_path / "run"), timeout=240)
    assert proc.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(proc.stdout, rank)
        assert f"{path} has damaged JPEG data" in line, proc.stdout[-4000:]


def test_packed_folder_gives_the_same_batches(faces, tmp_path):
    """The folder source and the RecordIO source share ShardedIter: same order, mirrors, pixels."""
    pack(str(faces), str(tmp_path / "rec"), threads=2)
    index = folders.scan(str(faces))
    for rank in (0, 1):
        options = dict(rank=rank, world_size=2, seed=3, threads=2)
        a = RecordIter(str(tmp_path / "rec" / "train.rec"), 8, IDENTITIES, **options)
        b = FolderIter(index, 8, IDENTITIES, **options)
        b.seek(a.steps_per_epoch - 1)                      # across an epoch boundary, too
        a.seek(a.steps_per_epoch - 1)
        for _ in range(3):
            x, y = next(a), next(b)
            assert (x.labels == y.labels).all() and x.epoch == y.epoch
            assert (x.data.asnumpy() == y.data.asnumpy()).all()
        a.close(), b.close()


def test_index_is_rebuilt_when_root_changes(faces, tmp_path, caplog):
    root = tmp_path / "faces"
    shutil.copytree(faces, root)
    caplog.set_level(logging.INFO)
    first = folders.load_index(str(root), str(tmp_path / "out"), write=True)
    again = folders.load_index(str(root), str(tmp_path / "out"), write=True)
    assert "from the index" in caplog.text and again.paths == first.paths and (again.labels == first.labels).all()
    shutil.copy(root / "person_000" / "00.jpg", root / "person_001" / "new.jpg")
    changed = folders.load_index(str(root), str(tmp_path / "out"), write=True)
    assert "changed since" in caplog.text and len(changed) == len(first) + 1
    assert changed.paths[PER_IDENTITY * 2] == os.path.join("person_001", "new.jpg")


def own_config(*argv):
    return config_lib.parse_args([str(a) for a in argv])


def test_num_classes_must_cover_the_set(faces, tmp_path, caplog):
    rec = tmp_path / "rec" / "train.rec"
    pack(str(faces), str(rec.parent), threads=2)
    assert resolve_config(own_config("--rec", rec), 2).num_classes == IDENTITIES
    assert resolve_config(own_config("--rec", rec, "--num_classes", IDENTITIES), 2).num_classes == IDENTITIES
    with pytest.raises(config_lib.ConfigError, match=f"num_classes = {IDENTITIES - 1} was given, but the set states "
                       f"{IDENTITIES} identities .{rec.parent / 'property'}"):
        resolve_config(own_config("--rec", rec, "--num_classes", IDENTITIES - 1), 2)
    with caplog.at_level("WARNING"):      # more classes than the set: kept, and said
        assert resolve_config(own_config("--rec", rec, "--num_classes", 70), 2).num_classes == 70
    assert f"the {70 - IDENTITIES} classes above them have no images" in caplog.text
    index = folders.scan(str(faces))
    with pytest.raises(config_lib.ConfigError, match=f"num_classes = 50 was given.*states {IDENTITIES}.*{faces}"):
        resolve_config(own_config("--images", faces, "--num_classes", 50), 2, index)
    both = own_config("--images", faces, "--rec", rec)       # two sets, a head each (test_sets_training)
    assert (both.images, both.rec, both.extra_sets) == (str(faces), "", (f"rec:{rec}",))
    with pytest.raises(config_lib.ConfigError, match="--images and --rec .* are both set 0"):
        config_lib.make_config({"images": str(faces), "rec": str(rec)})
    # --images drops the preset's data fields, as --rec does
    cfg = own_config("--images", faces)
    assert (cfg.rec, cfg.num_classes, cfg.synthetic_identities) == ("", 0, 0)


def test_verification_sets_beside_the_set_are_found(tmp_path, caplog):
    rec = tmp_path / "train.rec"
    for name in ("lfw.bin", "agedb_30.bin", "mine.bin"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "property").write_text("5,112,112\n")
    caplog.set_level(logging.INFO)
    cfg = resolve_config(own_config("--rec", rec), 1)
    assert cfg.val_targets == tuple(str(tmp_path / n) for n in ("agedb_30.bin", "lfw.bin", "mine.bin"))
    assert "verification sets found beside the set" in caplog.text and "lfw.bin" in caplog.text
    assert resolve_config(own_config("--rec", rec, "--val_targets", ""), 1).val_targets == ()
    named = str(tmp_path / "lfw.bin")
    assert resolve_config(own_config("--rec", rec, "--val_targets", named), 1).val_targets == (named,)
    # a preset's own set keeps the preset's list
    assert own_config("--dataset", "emore").val_targets[0] == "data/faces_emore/lfw.bin"


def test_labels_beyond_float32_are_refused(tmp_path):
    writer = RecordWriter(str(tmp_path / "w"), 1, 1)
    with pytest.raises(DataError, match="class id 16,777,217: RecordIO labels are float32.*2\\^24"):
        writer.add(MAX_CLASSES + 1, b"")
    with pytest.raises(DataError, match="2\\^24"):
        RecordWriter(str(tmp_path / "w2"), 1, MAX_CLASSES + 1)
    (tmp_path / "property").write_text(f"{MAX_CLASSES + 1},112,112\n")
    with pytest.raises(DataError, match=f"{tmp_path / 'property'}: states 16,777,217 identities.*float32"):
        read_property(str(tmp_path))


def test_every_field_has_a_help_sentence():
    names = {f.name for f in dataclasses.fields(config_lib.Config)}
    assert set(config_lib.FIELD_HELP) == names
    parser = config_lib.build_parser()
    for action in parser._actions:
        if action.dest in names:
            assert action.help.startswith(config_lib.FIELD_HELP[action.dest]) and "Default:" in action.help
