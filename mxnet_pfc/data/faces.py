"""The one decoder of face images, for all four places that read them.

The training iterator (and the check command) decode RecordIO payloads, the
verification loader decodes the images of a .bin pair set, the packing tool
decodes its input files and the embed command the files it is given. All of
them call `decode_face` (pack with --resize calls its two halves; the IJB
reader calls decode_image, for a loose crop), so a face is decoded, coloured,
sized and refused the same way everywhere.

What comes out: RGB uint8 pixels (H, W, 3), C-contiguous, 0..255 -- the
order the networks take (the callers only transpose to (3, H, W) and, for
training, mirror). Faces are aligned size x size crops (112 by default).
An image of another size is refused unless the caller asks for a resize
(INTER_AREA by default): the iterator, the check command and pack without
--resize refuse; embed refuses unless --resize; the verification loader always
resizes (bilinear), as InsightFace's loader does. JPEGs are decoded strictly
(a damaged one is refused) everywhere but in the verification loader, which
decodes the published pair sets as OpenCV always has (libjpeg's warnings
ignored), so that a harmless warning in a set users already have cannot stop
a run.

Nothing is decoded on the strength of what a file claims: the width and height
are read from the header first (image_dimensions: JPEG's frame header, PNG's
IHDR, BMP's info header; other formats are refused), and an image larger than
the caller's bound is refused before a pixel is decoded. A 900 KB PNG can
claim 30,000 x 30,000 pixels (2.7 GB decoded). The bounds: MAX_FACE_PIXELS
(4096 x 4096, 50 MB decoded) for a face, MAX_FRAME_PIXELS (8192 x 8192) for
an IJB image, a loose crop from which the face is cut; a caller that takes
no resize refuses every other size than its own from the header alone.

A problem raises ImageError (DamagedJPEG and WrongSize are kinds of it) whose
message starts with the source the caller named: a file path,
"train.rec: record 7 (byte 5568)" or "lfw.bin: image 3 (pair 1)". Each caller
re-raises it as its own error class (DataError, BinFormatError, EmbedError),
adding ", or pass --resize" to the size message where it has that option.

It is a module of its own, not part of records.py, because three of its callers
have nothing to do with RecordIO, and it needs no MXNet.
"""
from __future__ import annotations

import os
import re
import struct

import cv2
import numpy as np
import simplejpeg

from mxnet_pfc.runtime.errors import PfcError
from mxnet_pfc.runtime.files import read_regular_file

FACE_SIZE = 112       # side of an aligned face crop, in pixels, unless configured otherwise
MAX_IMAGE_BYTES = 64 << 20     # no face image is near this: a larger file is refused unread
MAX_FACE_PIXELS = 4096 * 4096  # a face image to decode (aligned crops are 112x112; larger ones are resized)
MAX_FRAME_PIXELS = 8192 * 8192  # an IJB image: a loose crop around a face, aligned by its landmarks
FORMATS = "JPEG, PNG or BMP"   # what image_dimensions reads (folders.IMAGE_SUFFIXES: .jpg .jpeg .png .bmp)


class ImageError(PfcError, ValueError):
    """An image that cannot be used as a face; the message starts with its source."""


class DamagedJPEG(ImageError):
    """libjpeg reported a JPEG as damaged (its message is quoted)."""


class WrongSize(ImageError):
    """A sound image that is not size x size, when no resize was asked for."""


def full_batch(images: np.ndarray, batch_size: int) -> np.ndarray:
    """n <= batch_size face arrays (n, 3, H, W) as float32, followed by zero images up to batch_size: an MXNet
    module is bound for full batches; the caller keeps the first n outputs."""
    if len(images) > batch_size:
        raise ValueError(f"a batch of at most {batch_size} images, got {len(images)}")
    batch = np.zeros((batch_size, *images.shape[1:]), np.float32)
    batch[:len(images)] = images
    return batch


def decode_face(payload: bytes, source: str, size: "int | tuple[int, int]" = FACE_SIZE,
                resize: bool = False, strict: bool = True, interpolation: int = cv2.INTER_AREA) -> np.ndarray:
    """RGB uint8 (height, width, 3) pixels of an encoded face; ImageError naming `source` if it is not one.

    `size` is the side, or (height, width); an image of another size is resized
    (with `interpolation`) when `resize`, else refused with WrongSize, from its
    header, before it is decoded.
    """
    height, width = (size, size) if isinstance(size, int) else size
    found = checked_dimensions(payload, source, MAX_FACE_PIXELS)
    if not resize and found not in ((width, height), (height, width)):   # turned by an EXIF tag: fit_size decides
        raise WrongSize(wrong_size(source, found, (width, height)))
    return fit_size(_decode(payload, source, strict), source, size, resize, interpolation)


def image_dimensions(payload: bytes, source: str) -> "tuple[int, int]":
    """(width, height) as the header of a JPEG, PNG or BMP image states them, read without decoding;
    ImageError naming `source` for any other content or a header that states no size."""
    width = height = 0
    if payload[:3] == b"\xff\xd8\xff":                          # the signatures cv2.imdecode goes by
        width, height = _jpeg_dimensions(payload)
    elif payload[:8] == b"\x89PNG\r\n\x1a\n":
        if payload[12:16] == b"IHDR" and len(payload) >= 24:     # the first chunk, by the PNG standard
            width, height = struct.unpack(">II", payload[16:24])
    elif payload[:2] == b"BM":
        header_size, = struct.unpack("<I", payload[14:18]) if len(payload) >= 26 else (0,)
        if header_size == 12:                                     # OS/2 1.x: 16-bit sizes
            width, height = struct.unpack("<HH", payload[18:22])
        elif header_size >= 36:                                   # Windows: 32-bit, a negative height is top-down
            width, height = (abs(v) for v in struct.unpack("<ii", payload[18:26]))
    else:
        raise ImageError(f"{source} does not decode as an image (not a {FORMATS} file)")
    if width <= 0 or height <= 0:
        raise ImageError(f"{source} does not decode as an image (its header states no width and height)")
    return width, height


def _jpeg_dimensions(payload: bytes) -> "tuple[int, int]":
    """(width, height) of a JPEG's frame header (SOFn), found by walking the marker segments before it;
    (0, 0) when there is none before the scan data or the data ends."""
    at = 2
    while at + 4 <= len(payload):
        if payload[at] != 0xFF:                                   # stray bytes: libjpeg skips them too
            at += 1
            continue
        marker = payload[at + 1]
        if marker == 0xFF:                                        # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):                  # markers without a segment
            at += 2
            continue
        if marker in (0xD9, 0xDA):                                # end of image, start of scan: no frame header
            return 0, 0
        length, = struct.unpack(">H", payload[at + 2:at + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            if at + 9 > len(payload):
                return 0, 0
            height, width = struct.unpack(">HH", payload[at + 5:at + 9])
            return width, height
        at += 2 + length
    return 0, 0


def checked_dimensions(payload: bytes, source: str, max_pixels: int) -> "tuple[int, int]":
    """(width, height) from the header, when the image has at most `max_pixels`; else ImageError naming
    `source` and its size, before anything is decoded."""
    width, height = image_dimensions(payload, source)
    if width * height > max_pixels:
        side = int(max_pixels ** 0.5)
        raise ImageError(f"{source} is {width}x{height} pixels, more than an image read here may have "
                         f"({max_pixels:,}, {side}x{side}): not decoded (it would take "
                         f"{width * height * 3 / 1e9:.1f} GB)")
    return width, height


def wrong_size(source: str, found: "tuple[int, int]", expected: "tuple[int, int]") -> str:
    """The message of WrongSize: `found` and `expected` are (width, height)."""
    return f"{source} is {found[0]}x{found[1]}, expected {expected[0]}x{expected[1]} (an aligned face)"


def decode_image(payload: bytes, source: str, strict: bool = True, max_pixels: int = MAX_FACE_PIXELS) -> np.ndarray:
    """RGB uint8 (H, W, 3) pixels of an encoded image of at most `max_pixels` (its header says how many,
    checked first); ImageError naming `source` if it is not one.

    JPEGs are decoded strictly: libjpeg's warnings (`Corrupt JPEG data: ...`,
    `Premature end of JPEG file`), which cv2.imdecode prints on stderr while it
    returns the damaged picture, raise DamagedJPEG, as do its fatal errors. The
    decoder is libjpeg-turbo through simplejpeg (its pixels equal cv2.imdecode's:
    the same integer DCT and upsampling), asked for RGB directly so that no
    channel swap is needed. Other formats (PNG, BMP) go through cv2.imdecode,
    whose BGR is swapped in place. strict=False decodes JPEGs as cv2.imdecode
    does, warnings ignored.
    """
    checked_dimensions(payload, source, max_pixels)
    return _decode(payload, source, strict)


def _decode(payload: bytes, source: str, strict: bool) -> np.ndarray:
    """decode_image's decoding, once the header's size was checked."""
    if strict and payload[:2] == b"\xff\xd8":
        try:
            image = simplejpeg.decode_jpeg(payload, colorspace="RGB", strict=True)
        except ValueError as error:
            libjpeg = re.sub(r"^tj\w+\(\): ", "", str(error))
            raise DamagedJPEG(f"{source} has damaged JPEG data (libjpeg: {libjpeg})") from None
        if b"Exif\0\0" not in payload:
            return image
        # cv2.imdecode turns the image by an EXIF orientation tag, simplejpeg does not:
        # keep cv2's pixels for these (the data was checked above)
    image = cv2.imdecode(np.frombuffer(payload, dtype=np.uint8), cv2.IMREAD_COLOR) if len(payload) else None
    if image is None:
        raise ImageError(f"{source} does not decode as an image")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB, dst=image)


def fit_size(image: np.ndarray, source: str, size: "int | tuple[int, int]" = FACE_SIZE,
             resize: bool = False, interpolation: int = cv2.INTER_AREA) -> np.ndarray:
    """The image when it is size x size (int, or (height, width)); else resized, or refused with WrongSize."""
    height, width = (size, size) if isinstance(size, int) else size
    if image.shape[:2] == (height, width):
        return image
    if not resize:
        raise WrongSize(wrong_size(source, (image.shape[1], image.shape[0]), (width, height)))
    return cv2.resize(image, (width, height), interpolation=interpolation)


def inside(real_root: str, path: str) -> bool:
    """Whether `path`, all symlinks resolved, lies in `real_root` (itself resolved)."""
    return os.path.commonpath([real_root, os.path.realpath(path)]) == real_root


def read_file(path: str, limit: int = MAX_IMAGE_BYTES, within: "str | None" = None) -> bytes:
    """An image file's bytes; ImageError naming it when it cannot be read, is not a regular file (a FIFO
    named *.jpg, /dev/zero), is larger than `limit`, or (with `within`, a resolved folder) is not a file
    under `within` (runtime/files.opened_regular says how)."""
    return read_regular_file(path, limit, "an image", ImageError, within)
