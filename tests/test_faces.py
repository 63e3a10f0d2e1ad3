"""One decoder (mxnet_pfc.data.faces) behind the four readers of face images.

The training iterator, the verification .bin loader, the packing tool and the embed command. Each refuses a
damaged JPEG naming the image's source, reads PNG as well as JPEG, gives RGB, and meets an image of another
size with the same message (or resizes it, where that is the caller's way). The verification loader reads a
damaged JPEG as OpenCV always has (the published pair sets are read as they were), and refuses what does not
decode at all."""
import pickle

import cv2
import numpy as np
import pytest

from mxnet_pfc.data import check, faces, pack
from mxnet_pfc.data.iterators import RecordIter
from mxnet_pfc.data.records import DataError, RecordWriter
from mxnet_pfc.eval.embedding import EmbedError, read_face
from mxnet_pfc.eval.verification import BinFormatError, load_bin
from mxnet_pfc.runtime.errors import PfcError
from test_damaged_images import DAMAGE, damaged, encode
from test_damaged_images import faces as face_images


def red(size=112) -> np.ndarray:
    """A pure red image, in the BGR order cv2.imencode takes."""
    image = np.zeros((size, size, 3), np.uint8)
    image[:, :, 2] = 255
    return image


def damaged_jpeg() -> bytes:
    """A face JPEG with damage that libjpeg reports as a warning and cv2.imdecode lets through."""
    key = 3
    return damaged(encode(face_images(8)[key - 1], ".jpg"), *DAMAGE[key])[1]


# Each caller reads one encoded image given as bytes (written where that caller reads from)
# and returns its pixels as (H, W, 3), in the caller's channel order.

def first_image(folder):
    """The first image of the RecordIO set in `folder`, as the training iterator gives it."""
    it = RecordIter(str(folder / "train.rec"), batch_size=1, num_classes=1, rand_mirror=False)
    try:
        return next(it).data[0].asnumpy().transpose(1, 2, 0)
    finally:
        it.close()


def via_iterator(tmp_path, payload, ext, resize=False):
    writer = RecordWriter(str(tmp_path / "set"), 1, 1)
    writer.add(0, payload)
    writer.close()
    return first_image(tmp_path / "set")


def via_verification(tmp_path, payload, ext, resize=False):
    with open(tmp_path / "pairs.bin", "wb") as f:       # 10 pairs, same and different: a set that can be evaluated
        pickle.dump(([encode(red(), ".png"), payload] + [encode(red(), ".png") for _ in range(18)],
                     [True] + [False] * 9), f)
    images, _ = load_bin(str(tmp_path / "pairs.bin"))
    return images[1].transpose(1, 2, 0)


def via_pack(tmp_path, payload, ext, resize=False):
    folder = tmp_path / "faces" / "person"
    folder.mkdir(parents=True)
    (folder / f"face{ext}").write_bytes(payload)
    pack.pack(str(tmp_path / "faces"), str(tmp_path / "packed"), resize=resize)
    return first_image(tmp_path / "packed")


def via_embed(tmp_path, payload, ext, resize=False):
    (tmp_path / f"face{ext}").write_bytes(payload)
    return read_face(str(tmp_path / f"face{ext}"), resize=resize).transpose(1, 2, 0)


# caller: (reader, its error class, how it names the image's source, as a regular expression)
CALLERS = {
    "iterator": (via_iterator, DataError, r"set/train\.rec: record 1 \(byte \d+\)"),
    "verification": (via_verification, BinFormatError, r"pairs\.bin: image 1 \(pair 0\)"),
    "pack": (via_pack, DataError, r"faces/person/face\.(jpg|png)"),
    "embed": (via_embed, EmbedError, r"/face\.(jpg|png)"),
}


BAD_IMAGES = {
    "damaged": (damaged_jpeg(), r" has damaged JPEG data \(libjpeg: Corrupt JPEG data: [^)]+\)"),
    "not-an-image": (b"not an image", r" does not decode as an image"),
    "empty": (b"", r" does not decode as an image"),
}


# the pair-set loader reads damaged JPEGs as OpenCV does (the next test)
@pytest.mark.parametrize("caller, case", [(caller, case) for caller in CALLERS for case in BAD_IMAGES
                                          if (caller, case) != ("verification", "damaged")])
def test_a_bad_image_is_refused_naming_its_source(tmp_path, caller, case):
    read, error_class, source = CALLERS[caller]
    payload, message = BAD_IMAGES[case]
    with pytest.raises(error_class, match=source + message) as caught:
        read(tmp_path, payload, ".jpg")
    assert isinstance(caught.value, PfcError)


def test_the_pair_set_loader_reads_a_damaged_jpeg_as_opencv_does(tmp_path):
    payload = damaged_jpeg()
    expected = cv2.cvtColor(cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)
    assert np.array_equal(via_verification(tmp_path, payload, ".jpg"), expected.astype(np.float32))


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("ext", [".jpg", ".png"])
def test_every_caller_gives_rgb_from_jpeg_and_png(tmp_path, caller, ext):
    read, _, _ = CALLERS[caller]
    image = read(tmp_path, encode(red(), ext), ext)
    assert image.shape == (112, 112, 3)
    assert image[:, :, 0].min() >= 250 and image[:, :, 1:].max() <= 5        # red is channel 0


@pytest.mark.parametrize("caller", ["iterator", "pack", "embed"])
def test_a_wrongly_sized_image_gets_the_same_message(tmp_path, caller):
    read, error_class, source = CALLERS[caller]
    hint = "" if caller == "iterator" else ", or pass --resize"          # the option pack and embed have
    with pytest.raises(error_class, match=source + r" is 96x96, expected 112x112 \(an aligned face\)" + hint + "$"):
        read(tmp_path, encode(red(96), ".png"), ".png")


@pytest.mark.parametrize("caller", ["verification", "pack", "embed"])
def test_a_wrongly_sized_image_is_resized_where_asked(tmp_path, caller):
    """pack and embed resize with --resize; the verification loader always does (as InsightFace's)."""
    read, _, _ = CALLERS[caller]
    image = read(tmp_path, encode(red(96), ".png"), ".png", resize=True)
    assert image.shape == (112, 112, 3)
    assert image[:, :, 0].min() >= 250 and image[:, :, 1:].max() <= 5


def test_decoder_contract():
    """RGB uint8, C-contiguous, cv2's pixels; errors are ImageError kinds; the old name still imports."""
    jpeg = encode(face_images(1)[0], ".jpg")
    image = faces.decode_face(jpeg, "a.jpg")
    assert image.dtype == np.uint8 and image.flags["C_CONTIGUOUS"]
    assert np.array_equal(image, cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)[:, :, ::-1])
    assert faces.decode_face(jpeg, "a.jpg", (112, 112)).shape == (112, 112, 3)
    with pytest.raises(faces.WrongSize, match=r"^a\.jpg is 112x112, expected 64x48 \(an aligned face\)$"):
        faces.decode_face(jpeg, "a.jpg", (48, 64))
    assert faces.decode_face(jpeg, "a.jpg", (48, 64), resize=True).shape == (48, 64, 3)
    assert issubclass(faces.DamagedJPEG, faces.ImageError) and issubclass(faces.WrongSize, faces.ImageError)
    assert issubclass(faces.ImageError, PfcError) and issubclass(faces.ImageError, ValueError)
    with pytest.raises(faces.ImageError, match=r"^missing\.jpg cannot be read: No such file"):
        faces.read_file("missing.jpg")


def test_embed_names_a_missing_file(tmp_path):
    with pytest.raises(EmbedError, match=r"nowhere\.jpg cannot be read: No such file or directory"):
        read_face(str(tmp_path / "nowhere.jpg"))


def test_check_command_counts_classes_as_training_does(tmp_path, capsys):
    """No property file: the class count comes from the header record (iterators.count_classes)."""
    writer = RecordWriter(str(tmp_path), 3, 2)
    for class_id in (0, 0, 1):
        writer.add(class_id, encode(red(), ".png"))
    writer.close()
    (tmp_path / "property").unlink()
    assert check.main([str(tmp_path)]) == 0
    assert "3 image records, 2 classes: sound" in capsys.readouterr().out
