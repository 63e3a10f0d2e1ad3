"""Images and the files naming them are data from others (issue 33, items 6, 4 and 8).

Tried as users run the tools on files written the way an attacker would write them:

- a 110 KB PNG or a 16x16 JPEG whose header claims 30,000 x 30,000 pixels (2.7 GB decoded) is refused from
  its header, naming it and its size, by every reader of one image: pack, check, embed, the verification
  .bin loader (verify), IJB and the trainer's iterator; each runs under `ulimit -v`, so the code before the
  bound ran out of memory there (or, without the limit, took 5 GB and accepted the picture);
- IJB image names that are absolute, hold '..' or are symlinks out of ROOT/loose_crop are named, not opened;
- `embed --out NAME` names NAME.npy and NAME.txt in --help and replaces neither unless --force;
- a pack stopped twice (Ctrl-C, then a kill while it cleans up) leaves no .tmp file and no traceback.
"""
import os
import pickle
import shutil
import signal
import struct
import subprocess
import sys
import zlib

import cv2
import numpy as np
import pytest

from launch import TOY, config_sh, finish_command, rank_stop_line, run_command, start_command, wait_until
from mxnet_pfc import ijb
from mxnet_pfc.data import faces
from mxnet_pfc.data.records import RecordWriter
from mxnet_pfc.data.synthetic_ijb import write_ijb
from test_damaged_images import encode
from test_damaged_images import faces as face_images
from test_data_safety import CHECK, PACK, leftovers, many_faces, write_faces
from test_ijb import colour_grid_model

HUGE = 30_000                 # a side: 30,000^2 RGB pixels are 2.7 GB decoded
COMMAND_KB = 2_000_000        # ulimit -v of pack, check, embed, verify, ijb: ample for each, less than one decode
TRAINER_KB = 3_000_000        # and of each rank of a 2-rank training run (it needs 2-3 GB of address space)
EMBED = [sys.executable, "-m", "mxnet_pfc.embed"]


def limited(cmd: list, kb: int = COMMAND_KB) -> list:
    """CMD under `ulimit -v kb`: an image decoded in full fails at once instead of taking the machine's memory."""
    return ["bash", "-c", f'ulimit -v {kb} && exec "$@"', "limited", *[str(c) for c in cmd]]


def png_claiming(width: int, height: int) -> bytes:
    """A valid PNG of a blank width x height picture at 1 bit per pixel, written with zlib by hand:
    30,000 x 30,000 is 110 KB on disk (the 8-bit one of the issue, 875 KB, takes seconds to write)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row = b"\0" * (1 + (width + 7) // 8)                   # filter byte, then the row's bits
    deflate = zlib.compressobj(9)
    idat = b"".join(deflate.compress(row * 256) for _ in range(height // 256))
    idat += deflate.compress(row * (height % 256)) + deflate.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)      # 1-bit greyscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def jpeg_claiming(width: int, height: int) -> bytes:
    """A 16x16 JPEG as cv2 writes it, its frame header (SOF0) edited to state width x height."""
    data = bytearray(encode(np.full((16, 16, 3), 128, np.uint8), ".jpg"))
    at = data.index(b"\xff\xc0")
    data[at + 5:at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


CLAIMS = {"png": (png_claiming, ".png"), "jpeg": (jpeg_claiming, ".jpg")}
REFUSED = f"is {HUGE}x{HUGE} pixels, more than an image read here may have"


def refused(out: str, source: str) -> bool:
    return f"{source} {REFUSED}" in out and "Traceback" not in out and "MemoryError" not in out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return colour_grid_model(tmp_path_factory.mktemp("model") / "grid")


# -- the header's size, read and bounded before decoding

@pytest.mark.parametrize("ext, params", [(".jpg", []), (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]),
                                         (".png", []), (".bmp", [])])
@pytest.mark.parametrize("width, height", [(112, 112), (97, 130), (1, 3)])
def test_the_header_states_the_size_opencv_decodes(ext, params, width, height):
    ok, encoded = cv2.imencode(ext, np.zeros((height, width, 3), np.uint8), params)
    assert faces.image_dimensions(encoded.tobytes(), "x") == (width, height)
    exif = encoded.tobytes()[:2] + b"\xff\xe1\x00\x10Exif\0\0" + b"\xff" * 8 + encoded.tobytes()[2:]
    if ext == ".jpg":          # segments before the frame header (an EXIF block with 0xff bytes in it) are skipped
        assert faces.image_dimensions(exif, "x") == (width, height)


@pytest.mark.parametrize("payload, words", [
    (encode(np.zeros((8, 8, 3), np.uint8), ".tiff"), "not a JPEG, PNG or BMP file"),
    (encode(np.zeros((8, 8, 3), np.uint8), ".webp"), "not a JPEG, PNG or BMP file"),
    (b"", "not a JPEG, PNG or BMP file"),
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "its header states no width and height"),      # cut before the frame
    (png_claiming(3, 3)[:20], "its header states no width and height"),
    (jpeg_claiming(0, 16), "its header states no width and height"),
], ids=["tiff", "webp", "empty", "jpeg-without-frame", "png-cut", "jpeg-of-width-0"])
def test_what_states_no_size_is_refused_naming_it(payload, words):
    with pytest.raises(faces.ImageError, match=r"^a/b\.img does not decode as an image \(" + words):
        faces.decode_image(payload, "a/b.img")


def test_the_bound_is_the_callers_and_checked_before_decoding():
    """At the bound decodes, one pixel more is refused; IJB's bound (a loose crop) is above a face's."""
    assert faces.decode_image(png_claiming(10, 10), "a", max_pixels=100).shape == (10, 10, 3)
    with pytest.raises(faces.ImageError, match=r"^a is 101x1 pixels, more than an image read here may have "
                                               r"\(100, 10x10\): not decoded"):
        faces.decode_image(png_claiming(101, 1), "a", max_pixels=100)
    frame = png_claiming(5000, 5000)
    assert faces.decode_image(frame, "frame", max_pixels=faces.MAX_FRAME_PIXELS).shape == (5000, 5000, 3)
    with pytest.raises(faces.ImageError, match=r"^face is 5000x5000 pixels, .* \(16,777,216, 4096x4096\)"):
        faces.decode_face(frame, "face", resize=True)
    with pytest.raises(faces.WrongSize, match=r"^face is 200x100, expected 112x112 \(an aligned face\)$"):
        faces.decode_face(b"BM" + b"\0" * 12 + struct.pack("<Iii", 40, 200, -100), "face")    # from the header alone


# -- every reader of one image, as users run it, under a memory limit

@pytest.mark.parametrize("claim", CLAIMS)
@pytest.mark.parametrize("resize", [[], ["--resize"]])
def test_pack_refuses_a_huge_image_from_its_header(tmp_path, claim, resize):
    make, ext = CLAIMS[claim]
    root = write_faces(tmp_path / "faces", 2, 2)
    huge = root / "person_001" / f"huge{ext}"
    huge.write_bytes(make(HUGE, HUGE))
    proc = run_command(limited(PACK + [root, tmp_path / "out", *resize]), timeout=120)
    assert proc.returncode == 1 and refused(proc.stdout, f"pack: {huge}"), proc.stdout[-3000:]
    assert os.listdir(tmp_path / "out") == []


def test_check_refuses_a_huge_image_in_a_folder_and_in_a_record(tmp_path):
    root = write_faces(tmp_path / "faces", 2, 2)
    huge = root / "person_000" / "huge.png"
    huge.write_bytes(png_claiming(HUGE, HUGE))
    proc = run_command(limited(CHECK + [root]), timeout=120)
    assert proc.returncode == 1 and refused(proc.stdout, str(huge)), proc.stdout[-3000:]
    assert "1 damaged image(s)" in proc.stdout
    data = tmp_path / "data"
    record_set(data, png_claiming(HUGE, HUGE))
    proc = run_command(limited(CHECK + [data]), timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert refused(proc.stdout, f"{data / 'train.rec'}: record 1 (byte 40)"), proc.stdout[-3000:]


@pytest.mark.parametrize("claim", CLAIMS)
@pytest.mark.parametrize("resize", [[], ["--resize"]])
def test_embed_refuses_a_huge_image_from_its_header(tmp_path, model, claim, resize):
    make, ext = CLAIMS[claim]
    huge = tmp_path / f"huge{ext}"
    huge.write_bytes(make(HUGE, HUGE))
    proc = run_command(limited(EMBED + [model, huge, "--out", tmp_path / "emb.npy", *resize]), timeout=120)
    assert proc.returncode == 1 and refused(proc.stdout, f"mxnet_pfc.embed: {huge}"), proc.stdout[-3000:]
    assert not (tmp_path / "emb.npy").exists()


def test_verify_refuses_a_huge_image_in_a_pair_set(tmp_path, model):
    """The .bin loader resizes whatever size it meets (as InsightFace's does), up to the face bound."""
    images = [encode(image, ".jpg") for image in face_images(40)]
    images[5] = png_claiming(HUGE, HUGE)
    with open(tmp_path / "pairs.bin", "wb") as f:
        pickle.dump((images, [k % 2 == 0 for k in range(20)]), f)
    # the limit of a rank: verify reads the .bin into a buffer of its largest size (1 GB) first
    proc = run_command(limited([sys.executable, "-m", "mxnet_pfc.verify", model, tmp_path / "pairs.bin"], TRAINER_KB),
                       timeout=120)
    assert proc.returncode == 1 and refused(proc.stdout, f"{tmp_path / 'pairs.bin'}: image 5 (pair 2)"), \
        proc.stdout[-3000:]


def record_set(folder, payload: bytes, identities: int = 2, per_identity: int = 8) -> None:
    """A RecordIO set of synthetic faces whose first image record holds `payload`."""
    images = face_images(identities * per_identity)
    writer = RecordWriter(str(folder), len(images), identities)
    for k, image in enumerate(images):
        writer.add(k // per_identity, payload if k == 0 else encode(image, ".jpg"))
    writer.close()


def test_training_stops_on_a_huge_record_naming_it_on_every_rank(tmp_path):
    data = tmp_path / "data"
    record_set(data, png_claiming(HUGE, HUGE))          # 16 images: the first step of 2 x 8 reads them all
    proc = run_command(limited(config_sh(*TOY, "--rec", data / "train.rec", "--val_targets", "", "--batch_size", 8,
                                         "--max_update", 3, "--output", tmp_path / "run"), TRAINER_KB), timeout=240)
    assert proc.returncode != 0
    for rank in (0, 1):
        line = rank_stop_line(proc.stdout, rank)
        assert f"{data / 'train.rec'}: record 1 (byte " in line and REFUSED in line, proc.stdout[-4000:]
    assert "MemoryError" not in proc.stdout and "Insufficient memory" not in proc.stdout


# -- IJB: images bounded, and read only under ROOT/loose_crop

@pytest.fixture(scope="module")
def ijb_source(tmp_path_factory):
    root = tmp_path_factory.mktemp("ijb") / "IJBC"
    write_ijb(str(root), "IJBC", subjects=6, templates_per_subject=2, seed=0)
    return root


@pytest.fixture
def ijb_root(ijb_source, tmp_path):
    root = tmp_path / "IJBC"
    shutil.copytree(ijb_source, root)
    return root


def run_ijb(model, root, tmp_path, capsys) -> "tuple[int, str]":
    code = ijb.main([model, "--root", str(root), "--target", "IJBC", "--output", str(tmp_path / "out")])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_ijb_refuses_a_huge_image_from_its_header(ijb_root, tmp_path, model):
    huge = ijb_root / "loose_crop" / "2.jpg"
    huge.write_bytes(png_claiming(HUGE, HUGE))
    proc = run_command(limited([sys.executable, "-m", "mxnet_pfc.ijb", model, "--root", ijb_root,
                                "--output", tmp_path / "out"]), timeout=120)
    where = f"{ijb_root / 'meta' / 'ijbc_name_5pts_score.txt'}:2"
    assert proc.returncode == 1 and refused(proc.stdout, f"mxnet_pfc.ijb: {huge} (listed at {where})"), \
        proc.stdout[-3000:]
    assert "(67,108,864, 8192x8192)" in proc.stdout           # an IJB image's bound, above a face's


def rename_first_image(root, name: str) -> None:
    """Give the first image of the meta files another name, as an edited list would."""
    for meta in ("ijbc_face_tid_mid.txt", "ijbc_name_5pts_score.txt"):
        path = root / "meta" / meta
        first, rest = path.read_text().split("\n", 1)
        path.write_text(" ".join([name] + first.split()[1:]) + "\n" + rest)


@pytest.mark.parametrize("how", ["absolute", "dot-dot"])
def test_ijb_image_names_out_of_the_root_are_refused(ijb_root, tmp_path, model, capsys, how):
    outside = tmp_path / "private" / "secret.jpg"
    outside.parent.mkdir()
    shutil.copy(ijb_root / "loose_crop" / "1.jpg", outside)       # a readable face: the old code embedded it
    name = str(outside) if how == "absolute" else "../../private/secret.jpg"
    rename_first_image(ijb_root, name)
    code, out = run_ijb(model, ijb_root, tmp_path, capsys)
    assert code == 1, out[-3000:]
    assert f"{ijb_root / 'meta' / 'ijbc_face_tid_mid.txt'}:1: image name {name!r} leads out of " \
           f"{ijb_root / 'loose_crop'}: image names are paths under it" in out, out[-3000:]


def test_ijb_symlinks_out_of_the_root_are_refused(ijb_root, tmp_path, model, capsys):
    outside = tmp_path / "private" / "secret.jpg"
    outside.parent.mkdir()
    shutil.move(ijb_root / "loose_crop" / "1.jpg", outside)
    os.symlink(outside, ijb_root / "loose_crop" / "1.jpg")
    code, out = run_ijb(model, ijb_root, tmp_path, capsys)
    assert code == 1, out[-3000:]
    assert f"{ijb_root / 'loose_crop' / '1.jpg'} (listed at {ijb_root / 'meta' / 'ijbc_name_5pts_score.txt'}:1) " \
           f"leads to {outside}, outside {ijb_root / 'loose_crop'}: only images under it are read" in out, out[-3000:]
    # a loose_crop folder that is itself a symlink (a set kept elsewhere) is read as before
    os.remove(ijb_root / "loose_crop" / "1.jpg")
    shutil.move(outside, ijb_root / "loose_crop" / "1.jpg")
    shutil.move(ijb_root / "loose_crop", tmp_path / "crops")
    os.symlink(tmp_path / "crops", ijb_root / "loose_crop")
    code, out = run_ijb(model, ijb_root, tmp_path, capsys)
    assert code == 0, out[-3000:]


# -- embed --out: both files named, neither replaced unless --force

def test_embed_help_names_both_outputs():
    out = subprocess.run(EMBED + ["--help"], capture_output=True, text=True, timeout=60).stdout
    assert "NAME.npy" in out and "NAME.txt" in out and "--force" in out, out


@pytest.mark.parametrize("existing", ["emb.txt", "emb.npy"])
def test_embed_replaces_no_file_unless_forced(tmp_path, model, existing):
    face = tmp_path / "face.jpg"
    face.write_bytes(encode(face_images(1)[0], ".jpg"))
    (tmp_path / existing).write_text("the user's own notes\n")
    cmd = EMBED + [model, face, "--out", tmp_path / "emb"]
    proc = run_command(cmd, timeout=120)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert f"mxnet_pfc.embed: {tmp_path / existing} exists (--out {tmp_path / 'emb'} writes {tmp_path / 'emb.npy'} " \
           f"and {tmp_path / 'emb.txt'}): pass --force to replace both" in proc.stdout, proc.stdout[-3000:]
    assert sorted(os.listdir(tmp_path)) == sorted(["face.jpg", existing])
    assert (tmp_path / existing).read_text() == "the user's own notes\n"
    proc = run_command(cmd + ["--force"], timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert np.load(tmp_path / "emb.npy").shape == (1, 147) and (tmp_path / "emb.txt").read_text() == f"{face}\n"
    assert [name for name in os.listdir(tmp_path) if ".tmp" in name] == []


# -- a pack stopped twice cleans up and says so in one line

def test_pack_stopped_again_while_it_cleans_up_leaves_nothing(tmp_path):
    """Ctrl-C, and a second stop before the first is handled (here: SIGINT and SIGTERM sent together while
    the pack is frozen mid-work, so that both arrive at once): it ends with 130 and one line, having removed
    its .tmp files. Before, the second interrupted the clean-up: a traceback from inside tqdm, and (as a
    second Ctrl-C did) 0-byte .tmp files left behind."""
    faces_root, out = many_faces(tmp_path), tmp_path / "out"
    proc = start_command(PACK + [faces_root, out])
    wait_until(lambda: any(name.startswith("train.rec.tmp") and os.path.getsize(out / name) > 100_000
                           for name in (os.listdir(out) if out.exists() else [])),
               120, "the pack to be mid-work", proc=proc)
    proc.send_signal(signal.SIGSTOP)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGCONT)
    output = finish_command(proc, 60)
    assert proc.returncode == 130, output[-3000:]
    assert output.count(f"pack: interrupted; nothing was written to {out}") == 1, output[-3000:]
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output[-3000:]
    assert leftovers(out) == [] and os.listdir(out) == []
