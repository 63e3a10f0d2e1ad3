"""Files read are bounded and stay where the user put them (issue 22, items 6 and 7).

Tried as users run the tools (`python -m mxnet_pfc.data.pack`, config.sh under horovodrun) on folders changed
the way a person's or an attacker's tools change them: a .rec header rewritten, an edited images-index.json,
symlinks out of the image folder, a FIFO or /dev/zero named *.jpg, two packs into one folder, a pack stopped
midway, a folder name that is not UTF-8.

Commands that could read /dev/zero or allocate by a forged count run under `ulimit -v`, so a
regression fails the test with a MemoryError instead of taking the machine's memory.
"""
import json
import os
import signal
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from launch import TOY, config_sh, finish_command, rank_stop_line, run_command, start_command, wait_until
from mxnet_pfc.data import folders, synthetic_set
from mxnet_pfc.data.faces import ImageError, read_file
from mxnet_pfc.data.records import open_records
from mxnet_pfc.runtime.run_folder import RunFolder

PACK = [sys.executable, "-m", "mxnet_pfc.data.pack"]
CHECK = [sys.executable, "-m", "mxnet_pfc.data.check"]
MEMORY_KB = 4_000_000          # ulimit -v for a single command: ample for it, far below the machine
NOT_UTF8 = os.fsdecode(b"caf\xe9")


def limited(cmd: list, kb: int = MEMORY_KB) -> list:
    """CMD under `ulimit -v kb` (address space), so a runaway allocation fails at once."""
    return ["bash", "-c", f'ulimit -v {kb} && exec "$@"', "limited", *[str(c) for c in cmd]]


def write_faces(root, identities: int, per_identity: int, seed: int = 0, names=None):
    """ROOT/<identity>/<nn>.jpg rendered by the synthetic generator; returns ROOT."""
    rng = np.random.default_rng(seed)
    ids = synthetic_set.draw_identities(rng, identities)
    images = synthetic_set.render({k: np.repeat(v, per_identity, axis=0) for k, v in ids.items()}, rng)
    names = names or [f"person_{k:03d}" for k in range(identities)]
    for i, image in enumerate(images):
        folder = root / names[i // per_identity]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{i % per_identity:02d}.jpg").write_bytes(synthetic_set.encode(image))
    return root


def leftovers(folder) -> list:
    return sorted(name for name in os.listdir(folder) if ".tmp" in name or name == ".pack.lock")


# -- 1. a .rec header's counts are claims, checked against the index before allocating by them

def forge_header(rec, first_identity: float, end: float) -> None:
    """Rewrite the 8 bytes of the header record's label (first_identity_record, end), as a hex editor would."""
    with open(rec, "r+b") as f:
        f.seek(8 + struct.calcsize("IfQQ"))           # RecordIO head, then the IRHeader; the label follows
        f.write(struct.pack("<ff", first_identity, end))


def test_header_claiming_a_billion_images_is_refused_before_allocating(tmp_path):
    data = tmp_path / "data"
    synthetic_set.generate(str(data), identities=8, images_per_identity=4, val_identities=8, val_pairs=20)
    forge_header(data / "train.rec", 1e9, 1e9 + 64)          # both exact in float32
    proc = run_command(limited(CHECK + [data]), timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert (f"{data / 'train.rec'}: the header record claims 1,000,000,064 records (999,999,999 images, "
            f"64 identities), but {data / 'train.idx'} lists 41") in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout and "MemoryError" not in proc.stdout
    # training: every rank refuses the set, naming both numbers, and the job ends
    run = run_command(config_sh(*TOY, "--rec", data / "train.rec", "--val_targets", "", "--batch_size", 4,
                                "--max_update", 2, "--output", tmp_path / "run"), timeout=120)
    assert run.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(run.stdout, rank)
        assert "claims 1,000,000,064 records" in line and "lists 41" in line, run.stdout[-4000:]
    assert "MemoryError" not in run.stdout


def test_header_label_that_is_not_two_numbers_is_named(tmp_path):
    data = tmp_path / "data"
    synthetic_set.generate(str(data), identities=4, images_per_identity=2, val_identities=4, val_pairs=10)
    forge_header(data / "train.rec", float("nan"), 12)
    proc = run_command(limited(CHECK + [data]), timeout=120)
    assert proc.returncode == 1 and "header record has label [nan, 12.0]" in proc.stdout, proc.stdout[-3000:]


def test_an_index_with_a_negative_or_shared_offset_and_a_property_file_without_classes_are_named(tmp_path):
    """Issue 26: a .idx line edited to a negative offset or to another record's offset passed the start-up
    check; a property file of 0 or -5 identities gave a line per record instead of naming the file; and the
    check of a folder without train.rec said 'no header and no property file' instead of 'no such file'."""
    data = tmp_path / "data"
    synthetic_set.generate(str(data), identities=4, images_per_identity=2, val_identities=4, val_pairs=10)
    index = (data / "train.idx").read_text().splitlines()
    for edit, expected in (
            (lambda lines: lines[:2] + [lines[2].split("\t")[0] + "\t-8"] + lines[3:],
             "record 2 has byte offset -8, before the start of"),
            (lambda lines: lines[:3] + [lines[3].split("\t")[0] + "\t" + lines[2].split("\t")[1]] + lines[4:],
             "records 2 and 3 both start at byte")):
        (data / "train.idx").write_text("\n".join(edit(index)) + "\n")
        proc = run_command(limited(CHECK + [data]), timeout=120)
        assert proc.returncode == 1 and expected in proc.stdout and "index is damaged" in proc.stdout, \
            proc.stdout[-3000:]
    (data / "train.idx").write_text("\n".join(index) + "\n")
    for count in ("0", "-5"):
        (data / "property").write_text(f"{count},112,112")
        proc = run_command(limited(CHECK + [data]), timeout=120)
        assert proc.returncode == 1 and f"property: states {count} identities: a training set has at least one" \
            in proc.stdout, proc.stdout[-3000:]
        assert "damaged record" not in proc.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_command(limited(CHECK + [empty]), timeout=120)
    assert proc.returncode == 1 and f"{empty / 'train.rec'}: no such file" in proc.stdout, proc.stdout[-3000:]


# -- 2. OUTPUT/images-index.json is checked against ROOT, not believed

def test_edited_index_entries_are_not_opened(tmp_path, caplog):
    root = write_faces(tmp_path / "faces", 4, 3)
    out = tmp_path / "out"
    folders.load_index(str(root), str(out), write=True)
    index_path = Path(RunFolder(str(out)).images_index)
    good = json.loads(index_path.read_text())
    for problem, edit in [
            ("files[0] holds '../../../../etc/passwd'",
             lambda s: s["files"][0].__setitem__(0, "../../../../etc/passwd")),
            ("files[1] holds '/dev/zero'", lambda s: s["files"][1].__setitem__(0, "/dev/zero")),
            ("identities[2] = '..' is not a folder under ROOT", lambda s: s["identities"].__setitem__(2, "..")),
            ("identities[0] = '/etc' is not a folder under ROOT", lambda s: s["identities"].__setitem__(0, "/etc"))]:
        saved = json.loads(json.dumps(good))
        edit(saved)
        index_path.write_text(json.dumps(saved))
        caplog.clear()
        index = folders.load_index(str(root), str(out), write=False)
        assert f"{index_path} is not used: {problem}" in caplog.text and "listing" in caplog.text
        real_root = os.path.realpath(root)
        assert all(os.path.realpath(os.path.join(root, p)).startswith(real_root + os.sep) for p in index.paths)
        assert len(index) == 12


def test_training_relists_a_tampered_index_and_reads_only_under_root(tmp_path):
    """An index edited to name files outside ROOT (an image elsewhere, a FIFO that would block a
    rank) is named and ROOT listed again: the resumed run reads only ROOT's images."""
    root = write_faces(tmp_path / "faces", 6, 4)
    elsewhere = write_faces(tmp_path / "elsewhere", 1, 1)
    os.mkfifo(tmp_path / "elsewhere" / "blocks.jpg")
    run = tmp_path / "run"
    args = (*TOY, "--images", root, "--batch_size", 4, "--frequent", 1, "--val_targets", "", "--output", run)
    proc = run_command(config_sh(*args, "--max_update", 2), timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    index_path = Path(RunFolder(str(run)).images_index)
    saved = json.loads(index_path.read_text())
    saved["files"][0] = ["../../elsewhere/person_000/00.jpg", str(elsewhere / "blocks.jpg")] + saved["files"][0][2:]
    index_path.write_text(json.dumps(saved))
    proc = run_command(config_sh(*args, "--max_update", 12, "--resume", "latest"), timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"{index_path} is not used: files[0] holds '../../elsewhere/person_000/00.jpg'" in proc.stdout
    assert f"listed {root}: 24 images of 6 identities" in proc.stdout and "step 12/12" in proc.stdout


def test_training_from_a_folder_name_that_is_not_utf8(tmp_path):
    """Its files are read and indexed like any other; messages show its name's bytes as \\xNN."""
    root = write_faces(tmp_path / "faces", 4, 4, names=["a", NOT_UTF8, "p", "q"])
    os.mkfifo(root / NOT_UTF8 / "zz.jpg")             # skipped, and named in a warning
    run = tmp_path / "run"
    proc = run_command(config_sh(*TOY, "--images", root, "--batch_size", 4, "--max_update", 4, "--val_targets", "",
                                 "--output", run), timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"{root}/caf\\xe9/zz.jpg (a FIFO)" in proc.stdout and "Logging error" not in proc.stdout, proc.stdout
    assert f"listed {root}: 16 images of 4 identities" in proc.stdout and "step 4/4" in proc.stdout
    assert json.loads((Path(RunFolder(str(run)).images_index)).read_text())["identities"][1] == NOT_UTF8


# -- 3. image folders: regular files under ROOT only, bounded, never blocking

def hostile_folder(tmp_path, identities=20, per_identity=4):
    """A folder set with what an attacker (or a careless tool) leaves in one; returns (root, skipped names)."""
    root = write_faces(tmp_path / "faces", identities, per_identity)
    outside = write_faces(tmp_path / "outside", 2, 1)
    os.mkfifo(root / "person_000" / "zz_fifo.jpg")
    os.symlink(outside / "person_000" / "00.jpg", root / "person_001" / "zz_out.jpg")
    os.symlink("/etc/passwd", root / "person_002" / "zz_passwd.jpg")
    os.symlink(outside / "person_001", root / "zz_outside_identity")
    os.symlink("../person_004/00.jpg", root / "person_003" / "zz_inside.jpg")      # inside ROOT: kept
    skipped = {"person_000/zz_fifo.jpg": "(a FIFO)",
               "person_001/zz_out.jpg": f"(a symlink to {outside / 'person_000' / '00.jpg'}, outside {root})",
               "person_002/zz_passwd.jpg": f"(a symlink to /etc/passwd, outside {root})",
               "zz_outside_identity": f"(a symlink to {outside / 'person_001'}, outside {root})"}
    return root, skipped


def test_pack_reads_only_regular_files_under_root(tmp_path):
    root, skipped = hostile_folder(tmp_path, 5, 2)
    os.symlink("/dev/zero", root / "person_004" / "zz_zero.jpg")
    skipped["person_004/zz_zero.jpg"] = f"(a symlink to /dev/zero, outside {root})"
    proc = run_command(limited(PACK + [root, tmp_path / "out"]), timeout=60)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"{root}: skipped 5 entries, not a regular file under it: " in proc.stdout, proc.stdout
    for name, why in skipped.items():
        line = next(line for line in proc.stdout.splitlines() if "skipped" in line)
        assert f"{root / name} {why}" in line, line
    assert "11 images of 5 identities" in proc.stdout          # 10 + the symlink inside ROOT
    assert run_command(CHECK + [tmp_path / "out"], timeout=120).returncode == 0


def test_training_from_a_folder_with_a_fifo_and_symlinks_out_of_root(tmp_path):
    """Under horovodrun, each rank skips what is not a regular file under ROOT (the FIFO used to
    block a rank forever, which hung the job): the run trains two epochs and ends."""
    root, skipped = hostile_folder(tmp_path)
    proc = run_command(config_sh(*TOY, "--images", root, "--batch_size", 4, "--max_update", 20, "--val_targets", "",
                                 "--output", tmp_path / "run"), timeout=120)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"listed {root}: 81 images of 20 identities" in proc.stdout and "step 20/20" in proc.stdout
    for name, why in skipped.items():
        assert f"{root / name} {why}" in proc.stdout, proc.stdout[-4000:]


def test_read_file_refuses_what_is_not_a_bounded_regular_file(tmp_path):
    from mxnet_pfc.data.faces import MAX_IMAGE_BYTES
    os.mkfifo(tmp_path / "fifo.jpg")
    with pytest.raises(ImageError, match="fifo.jpg is not a regular file \\(a FIFO\\)"):
        read_file(str(tmp_path / "fifo.jpg"))              # returns at once: opening a FIFO would block
    with pytest.raises(ImageError, match="/dev/zero is not a regular file \\(a character device\\)"):
        read_file("/dev/zero")
    big = tmp_path / "big.jpg"
    with open(big, "wb") as f:
        f.truncate(MAX_IMAGE_BYTES + 1)                    # sparse: no disk used
    with pytest.raises(ImageError, match=f"big.jpg is {MAX_IMAGE_BYTES + 1:,} bytes, more than an image may be"):
        read_file(str(big))
    # a symlink swapped in after the caller checked the path: the file opened is what is checked
    root, outside = tmp_path / "root", tmp_path / "secret.jpg"
    root.mkdir()
    outside.write_bytes(b"not for us")
    (root / "a.jpg").symlink_to(outside)
    with pytest.raises(ImageError, match="a.jpg leads to .*secret.jpg, outside .*root: only files under"):
        read_file(str(root / "a.jpg"), within=os.path.realpath(root))


# -- 4. one pack per output folder; nothing half-written left behind

def many_faces(root, identities=200, per_identity=20):
    """Enough images (hard links of a few) for a pack to take a moment."""
    write_faces(root / "src", 4, 1)
    sources = sorted((root / "src").rglob("*.jpg"))
    faces = root / "faces"
    for k in range(identities):
        (faces / f"id{k:03d}").mkdir(parents=True)
        for j in range(per_identity):
            os.link(sources[(k + j) % len(sources)], faces / f"id{k:03d}" / f"{j:02d}.jpg")
    return faces


def stopped_pack(faces, out):
    """A pack of FACES into OUT, stopped (as by Ctrl-Z) once it holds OUT."""
    proc = start_command(PACK + [faces, out])
    wait_until(lambda: (out / ".pack.lock").exists() and b"pid" in (out / ".pack.lock").read_bytes(), 120,
               "the pack to take its folder", proc=proc)
    proc.send_signal(signal.SIGSTOP)
    assert not (out / "train.rec").exists()                 # stopped midway
    return proc


def test_second_pack_into_a_folder_is_refused_and_the_first_completes(tmp_path):
    faces, out = many_faces(tmp_path), tmp_path / "out"
    first = stopped_pack(faces, out)
    try:
        second = run_command(PACK + [faces, out], timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 1, second.stdout[-3000:]
    assert f"pack: {out} is being written by another pack (pid {first.pid} on " in second.stdout, second.stdout
    assert "Traceback" not in second.stdout
    assert "4000 images of 200 identities" in finish_command(first, 120) and first.returncode == 0
    assert run_command(CHECK + [out], timeout=120).returncode == 0
    assert leftovers(out) == []


def test_stopped_or_failed_pack_leaves_no_temporary_files(tmp_path):
    faces, out = many_faces(tmp_path), tmp_path / "out"
    proc = stopped_pack(faces, out)                          # kill (SIGTERM): cleans up as Ctrl-C does
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    assert "interrupted; nothing was written" in finish_command(proc, 60)
    assert leftovers(out) == [] and not (out / "train.rec").exists()
    proc = stopped_pack(faces, out)                          # SIGKILL: the next pack removes what it left
    proc.kill()
    finish_command(proc, 60)
    assert any(".tmp" in name for name in leftovers(out))
    (faces / "id050" / "05.jpg").unlink()
    (faces / "id050" / "05.jpg").write_bytes(b"\xff\xd8 not a JPEG")       # fails midway
    proc = run_command(PACK + [faces, out], timeout=120)
    assert proc.returncode == 1 and f"{faces / 'id050' / '05.jpg'}" in proc.stdout, proc.stdout[-3000:]
    assert "left by an earlier pack that was stopped; removed" in proc.stdout
    assert leftovers(out) == [] and not (out / "train.rec").exists()


# -- 5. every error says what happened

def test_pack_of_a_folder_name_that_is_not_utf8_keeps_the_name(tmp_path):
    root = write_faces(tmp_path / "faces", 3, 2, names=["a", NOT_UTF8, "z"])
    proc = run_command(PACK + [root, tmp_path / "out"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "out" / "identities.txt").read_bytes() == b"0\ta\n1\tcaf\xe9\n2\tz\n"
    _, records = open_records(str(tmp_path / "out" / "train.rec"))
    assert records.num_identities == 3 and len(records.image_records) == 6


def test_pack_on_devices_names_the_path(tmp_path):
    root = write_faces(tmp_path / "faces", 2, 1)
    for args, message in [((tmp_path / "faces", "/dev/zero"), "pack: /dev/zero: not a folder (pack writes"),
                          (("/dev/zero", tmp_path / "out"), "pack: /dev/zero: not a folder")]:
        proc = run_command(limited(PACK + list(args)), timeout=60)
        assert proc.returncode == 1 and message in proc.stdout and "Traceback" not in proc.stdout, proc.stdout
    assert root.exists()


def test_a_messy_folder_is_listed_without_its_hidden_entries_and_checked_in_one_pass(tmp_path):
    """Issue 26: a hidden folder (.ipynb_checkpoints) became class 0; images in sub-folders, identities of only
    sub-folders, .webp files and empty folders were dropped without a word; and pack stopped at the first bad
    file (a messy folder took 4 rounds). Now hidden entries are never identities or images, every entry left
    out is reported by reason, and `data.check FOLDER` names every damaged image in one pass."""
    root = write_faces(tmp_path / "faces", 4, 3)
    hidden = write_faces(tmp_path / "faces" / ".ipynb_checkpoints", 1, 2)       # a notebook's copies
    (root / ".Trash-1000").mkdir()
    (root / ".DS_Store").write_bytes(b"\0")
    (root / "person_000" / "face.webp").write_bytes(b"RIFF")
    (root / "person_001" / "more").mkdir()
    ((root / "person_001" / "more") / "01.jpg").write_bytes((root / "person_001" / "00.jpg").read_bytes())
    (root / "only_subfolders" / "inner").mkdir(parents=True)
    (root / "empty").mkdir()
    for name in ("person_002/01.jpg", "person_003/02.jpg"):       # two damaged images, in two identities
        data = bytearray((root / name).read_bytes())
        data[200:400] = b"\0" * 200
        (root / name).write_bytes(bytes(data))
    proc = run_command(CHECK + [root], timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:]
    for line in (f"{root}: skipped 3 entries, hidden: {root}/.DS_Store, {root}/.Trash-1000, {hidden}",
                 f"{root}: skipped 1 entry, not a jpg/jpeg/png/bmp image: {root}/person_000/face.webp",
                 f"{root}: skipped 2 entries, a folder inside an identity folder (its images are not read): "
                 f"{root}/only_subfolders/inner, {root}/person_001/more",
                 f"{root}: skipped 1 entry, an identity folder without images: {root}/empty",
                 f"{root}: skipped 1 entry, an identity folder without images (only sub-folders): "
                 f"{root}/only_subfolders"):
        assert line in proc.stdout, (line, proc.stdout[-3000:])
    assert f"{root}/person_002/01.jpg" in proc.stdout and f"{root}/person_003/02.jpg" in proc.stdout
    assert f"{root}: 12 images of 4 identities: 2 damaged image(s)" in proc.stdout
    # the index training reads has the same four identities, in the same order: the hidden folder is not class 0
    index = folders.load_index(str(root), str(tmp_path / "out"), write=True)
    assert index.identities == ["person_000", "person_001", "person_002", "person_003"] and len(index) == 12
