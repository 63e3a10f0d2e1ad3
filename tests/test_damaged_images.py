"""JPEG data damaged inside a record stops the trainer and the check command, naming the record.

Libjpeg only warns (`Corrupt JPEG data: ...` on stderr) and cv2.imdecode returns the damaged picture, so
decoding is strict: the trainer and the check command stop on such a record, naming it (docs/failures.md,
'Damaged data')."""
import os
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest

from mxnet_pfc.data import check, synthetic_set
from mxnet_pfc.data.iterators import RecordIter
from mxnet_pfc.data.records import DataError, RecordWriter, decode_image_record, open_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGES_PER_IDENTITY = (3, 2, 3)        # records 1-3, 4-5, 6-8; identity 1's images are PNG
PNG_CLASS = 1
# Records damaged by 200 random bytes at a fraction of their entropy-coded data (seeded):
# chosen so that libjpeg notices (damage that decodes as valid data goes unnoticed) and cv2 still decodes.
DAMAGE = {3: (0.5, 1), 7: (0.3, 2)}


def faces(count: int, seed: int = 0) -> np.ndarray:
    """Face-like BGR images (the synthetic set's renderer), uint8 (count, 112, 112, 3)."""
    rng = np.random.default_rng(seed)
    return synthetic_set.render(synthetic_set.draw_identities(rng, count), rng)[:, :, :, ::-1]


def encode(image: np.ndarray, ext: str) -> bytes:
    ok, buffer = cv2.imencode(ext, image, [cv2.IMWRITE_JPEG_QUALITY, 95] if ext == ".jpg" else [])
    assert ok
    return buffer.tobytes()


def write_set(folder) -> "dict[int, bytes]":
    """A set as InsightFace tools write it; returns each image record's encoded payload."""
    images = faces(sum(IMAGES_PER_IDENTITY))
    writer = RecordWriter(str(folder), len(images), len(IMAGES_PER_IDENTITY))
    payloads, key = {}, 1
    for class_id, count in enumerate(IMAGES_PER_IDENTITY):
        for _ in range(count):
            payloads[key] = encode(images[key - 1], ".png" if class_id == PNG_CLASS else ".jpg")
            writer.add(class_id, payloads[key])
            key += 1
    writer.close()
    return payloads


def scan_bounds(jpeg: bytes) -> "tuple[int, int]":
    """(first byte of the entropy-coded data after the SOS header, position of EOI)."""
    assert jpeg[:2] == b"\xff\xd8" and jpeg[-2:] == b"\xff\xd9"
    i = 2
    while jpeg[i + 1] != 0xDA:
        i += 2 + int.from_bytes(jpeg[i + 2:i + 4], "big")
    return i + 2 + int.from_bytes(jpeg[i + 2:i + 4], "big"), len(jpeg) - 2


def damaged(jpeg: bytes, fraction: float, seed: int) -> "tuple[int, bytes]":
    """(position in the JPEG, the JPEG with 200 random bytes written there, inside its scan)."""
    start, eoi = scan_bounds(jpeg)
    position = start + int(fraction * (eoi - 200 - start))
    noise = np.random.default_rng(seed).integers(0, 256, 200, dtype=np.uint8).tobytes()
    return position, jpeg[:position] + noise + jpeg[position + 200:]


def damage_records(folder, payloads, keys) -> "dict[int, int]":
    """Overwrite 200 bytes inside the JPEG data of records `keys` in train.rec; their byte offsets."""
    rec = str(folder / "train.rec")
    reader, _ = open_records(rec)
    offsets = {key: reader.idx[key] for key in keys}
    with open(rec, "r+b") as f:
        for key in keys:
            # a record: 8 bytes of RecordIO head, the 24-byte image header (scalar label), the image
            payload_at = offsets[key] + 8 + 24
            f.seek(payload_at)
            assert f.read(len(payloads[key])) == payloads[key]
            position, bad = damaged(payloads[key], *DAMAGE[key])
            f.seek(payload_at + position)
            f.write(bad[position:position + 200])
    for key in keys:
        assert mx.recordio.unpack(reader.read_idx(key))[1] == damaged(payloads[key], *DAMAGE[key])[1]
    reader.close()
    return offsets


def test_the_damage_is_what_opencv_lets_through(capfd):
    """The defect: cv2.imdecode prints libjpeg's warning and returns a (damaged) 112x112 picture."""
    payloads = {key: encode(image, ".jpg") for key, image in enumerate(faces(8), start=1)}
    for key in DAMAGE:
        _, bad = damaged(payloads[key], *DAMAGE[key])
        capfd.readouterr()
        image = cv2.imdecode(np.frombuffer(bad, np.uint8), cv2.IMREAD_COLOR)
        assert image is not None and image.shape == (112, 112, 3)
        assert "Corrupt JPEG data" in capfd.readouterr().err
        good = cv2.imdecode(np.frombuffer(payloads[key], np.uint8), cv2.IMREAD_COLOR)
        assert np.abs(image.astype(int) - good).max() > 50


def test_check_command_names_every_damaged_jpeg(tmp_path, capsys):
    payloads = write_set(tmp_path)
    assert check.main([str(tmp_path)]) == 0
    assert "8 image records, 3 classes: sound" in capsys.readouterr().out
    offsets = damage_records(tmp_path, payloads, list(DAMAGE))
    proc = subprocess.run([sys.executable, "-m", "mxnet_pfc.data.check", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for key in DAMAGE:
        assert (f"train.rec: record {key} (byte {offsets[key]}) has damaged JPEG data (libjpeg: Corrupt JPEG data: "
                in proc.stdout), proc.stdout
    assert "2 damaged record(s)" in proc.stdout, proc.stdout


def test_training_iterator_stops_on_the_damaged_record(tmp_path):
    payloads = write_set(tmp_path)
    key = 3
    offsets = damage_records(tmp_path, payloads, [key])
    it = RecordIter(str(tmp_path / "train.rec"), batch_size=8, num_classes=3, rand_mirror=False)
    with pytest.raises(DataError, match=rf"train.rec: record {key} \(byte {offsets[key]}\) has damaged JPEG data "
                                        r"\(libjpeg: Corrupt JPEG data: [^)]+\)$"):
        next(it)


def test_decode_is_strict_and_gives_opencvs_pixels(tmp_path):
    """Sound records (JPEG and PNG) decode to cv2.imdecode's pixels exactly, in RGB order; a damaged one raises."""
    payloads = write_set(tmp_path)
    rec = str(tmp_path / "train.rec")
    reader, records = open_records(rec)
    for key in records.image_records.tolist():
        raw = reader.read_idx(key)
        image, label = decode_image_record(raw, key, reader.idx[key], rec, 3, (112, 112))
        expected = cv2.imdecode(np.frombuffer(payloads[key], np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1]
        assert image.dtype == np.uint8 and image.shape == (112, 112, 3) and np.array_equal(image, expected)
        assert label == mx.recordio.unpack(raw)[0].label
    reader.close()
    offsets = damage_records(tmp_path, payloads, [7])
    reader, _ = open_records(rec)
    with pytest.raises(DataError, match=rf"record 7 \(byte {offsets[7]}\) has damaged JPEG data \(libjpeg: "):
        decode_image_record(reader.read_idx(7), 7, reader.idx[7], rec, 3, (112, 112))
    reader.close()
    truncated = payloads[1][:len(payloads[1]) // 2]           # cv2.imdecode refuses it too
    with pytest.raises(DataError, match=r"damaged JPEG data \(libjpeg: Premature end of JPEG file\)"):
        decode_image_record(mx.recordio.pack(mx.recordio.IRHeader(0, 0.0, 1, 0), truncated), 1, 0, rec, 3,
                            (112, 112))
    with pytest.raises(DataError, match=r"record 1 \(byte 0\) does not decode as an image"):    # not cv2.error
        decode_image_record(mx.recordio.pack(mx.recordio.IRHeader(0, 0.0, 1, 0), b""), 1, 0, rec, 3, (112, 112))


def exif_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The JPEG with an APP1 Exif segment holding only an orientation tag, after SOI."""
    tiff = (b"MM\x00\x2a\x00\x00\x00\x08" + b"\x00\x01" + b"\x01\x12\x00\x03\x00\x00\x00\x01"
            + orientation.to_bytes(2, "big") + b"\x00\x00" + b"\x00\x00\x00\x00")
    body = b"Exif\x00\x00" + tiff
    return jpeg[:2] + b"\xff\xe1" + (len(body) + 2).to_bytes(2, "big") + body + jpeg[2:]


@pytest.mark.parametrize("orientation", [1, 3, 6])
def test_exif_orientation_is_applied_as_opencv_does(orientation):
    """cv2.imdecode turns a JPEG by its EXIF orientation tag: the pixels stay cv2's (in RGB order)."""
    jpeg = exif_orientation(encode(faces(1)[0], ".jpg"), orientation)
    expected = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    plain = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    assert np.array_equal(expected, plain) == (orientation == 1)
    raw = mx.recordio.pack(mx.recordio.IRHeader(0, 0.0, 1, 0), jpeg)
    image, _ = decode_image_record(raw, 1, 0, "train.rec", 1, (112, 112))
    assert np.array_equal(image, expected[:, :, ::-1])
