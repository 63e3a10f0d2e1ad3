"""The one decoder of face images, for all four places that read them.

The training iterator (and the check command) decode RecordIO payloads, the
verification loader decodes the images of a .bin pair set, the packing tool
decodes its input files and the embed command the files it is given. All of
them call `decode_face` (pack calls its two halves), so a face is decoded,
coloured, sized and refused the same way everywhere.

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
import stat

import cv2
import numpy as np
import simplejpeg

from mxnet_pfc.runtime.errors import PfcError

FACE_SIZE = 112       # side of an aligned face crop, in pixels, unless configured otherwise
MAX_IMAGE_BYTES = 64 << 20     # no face image is near this: a larger file is refused unread


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
    (with `interpolation`) when `resize`, else refused with WrongSize.
    """
    return fit_size(decode_image(payload, source, strict), source, size, resize, interpolation)


def decode_image(payload: bytes, source: str, strict: bool = True) -> np.ndarray:
    """RGB uint8 (H, W, 3) pixels of an encoded image of any size; ImageError naming `source` if it is not one.

    JPEGs are decoded strictly: libjpeg's warnings (`Corrupt JPEG data: ...`,
    `Premature end of JPEG file`), which cv2.imdecode prints on stderr while it
    returns the damaged picture, raise DamagedJPEG, as do its fatal errors. The
    decoder is libjpeg-turbo through simplejpeg (its pixels equal cv2.imdecode's:
    the same integer DCT and upsampling), asked for RGB directly so that no
    channel swap is needed. Other formats (PNG, BMP) go through cv2.imdecode,
    whose BGR is swapped in place. strict=False decodes JPEGs as cv2.imdecode
    does, warnings ignored.
    """
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
        raise WrongSize(f"{source} is {image.shape[1]}x{image.shape[0]}, expected {width}x{height} (an aligned face)")
    return cv2.resize(image, (width, height), interpolation=interpolation)


def printable(path: str) -> str:
    """`path` for a message: bytes of a name that is not UTF-8 shown as \\xNN (printing the
    surrogates Python decodes them to would fail on a UTF-8 stream)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def inside(real_root: str, path: str) -> bool:
    """Whether `path`, all symlinks resolved, lies in `real_root` (itself resolved)."""
    return os.path.commonpath([real_root, os.path.realpath(path)]) == real_root


def read_file(path: str, limit: int = MAX_IMAGE_BYTES, within: "str | None" = None) -> bytes:
    """A regular file's bytes; ImageError naming it when it cannot be read, is not a regular file,
    is larger than `limit`, or (with `within`, a resolved folder) is not a file under `within`.

    A folder of images may hold anything: a FIFO named *.jpg would block open() and read()
    forever, and /dev/zero (or a symlink to it) would be read until memory runs out. So the
    file is opened non-blocking, checked to be a regular file (before and after opening:
    it may be swapped between the two) and read to at most `limit` + 1 bytes.
    """
    shown = printable(path)
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ImageError(f"{shown} is not a regular file ({file_kind(path)}): only image files are read")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ImageError(f"{shown} is not a regular file ({file_kind(path)}): only image files are read")
            opened = os.readlink(f"/proc/self/fd/{fd}") if within and os.path.isdir("/proc/self/fd") else None
            if opened is not None and not inside(within, opened):
                # checked on the file opened: a symlink swapped in after the caller's check leads nowhere else
                raise ImageError(f"{shown} leads to {printable(opened)}, outside {printable(within)}: only files "
                                 "under the image folder are read")
            if st.st_size > limit:
                raise ImageError(f"{shown} is {st.st_size:,} bytes, more than any face image "
                                 f"(the limit is {limit:,} bytes)")
            data = f.read(limit + 1)
    except OSError as error:
        raise ImageError(f"{shown} cannot be read: {error.strerror or error}") from None
    if len(data) > limit:
        raise ImageError(f"{shown} grew past {limit:,} bytes while it was read (the limit of a face image)")
    return data


def file_kind(path: str) -> str:
    """What a path that is not a regular file is, in words (for messages)."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        return error.strerror or str(error)
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"
