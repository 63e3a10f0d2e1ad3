"""Pack a folder of identity sub-folders into the InsightFace RecordIO layout.

    python -m mxnet_pfc.data.pack FACES/ OUT/ [--resize]

FACES/ holds one sub-folder per identity (sorted names -> class ids 0, 1, ...)
with aligned face images. OUT/ receives train.rec, train.idx, property and
identities.txt (class id -> folder name). Images already 112x112 are stored as
they are (no re-encoding); others are refused, or resized with --resize.
Images are decoded as training decodes them (data.faces): a damaged JPEG is refused.
"""
from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import cv2
from tqdm import tqdm

from ..errors import PfcError
from .faces import ImageError, WrongSize, decode_image, fit_size, read_file
from .records import DataError, RecordWriter

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def list_identities(root: str) -> "list[tuple[str, list[str]]]":
    """[(identity folder name, sorted image paths)] for every sub-folder with images."""
    if not os.path.isdir(root):
        raise DataError(f"{root}: not a folder")
    identities = []
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            continue
        images = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.lower().endswith(IMAGE_SUFFIXES))
        if images:
            identities.append((name, images))
    if not identities:
        raise DataError(f"{root}: no identity sub-folders with images ({', '.join(IMAGE_SUFFIXES)})")
    return identities


def load_image(path: str, size: int, resize: bool) -> bytes:
    """The bytes to store: the file itself when it is a sound size x size image, else a resized JPEG.

    Decoded by faces.decode_image, strictly as training will: a damaged JPEG is refused here.
    """
    try:
        raw = read_file(path)
        image = decode_image(raw, path)
        if image.shape[:2] == (size, size):
            return raw                   # stored as it is: no re-encoding
        face = fit_size(image, path, size, resize)
    except WrongSize as error:
        raise DataError(f"{error}, or pass --resize") from None
    except ImageError as error:
        raise DataError(str(error)) from None
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(face, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
    return encoded.tobytes()


def pack(root: str, output: str, size: int = 112, resize: bool = False, threads: int = 4) -> "tuple[int, int]":
    """Write OUT/train.rec etc.; returns (images, identities)."""
    identities = list_identities(root)
    jobs = [(class_id, path) for class_id, (_, paths) in enumerate(identities) for path in paths]
    writer = RecordWriter(output, len(jobs), len(identities))
    with ThreadPoolExecutor(max_workers=threads) as pool:
        encoded = pool.map(lambda job: load_image(job[1], size, resize), jobs)
        for (class_id, _), payload in tqdm(zip(jobs, encoded), total=len(jobs), desc="pack", unit="img"):
            writer.add(class_id, payload)
    writer.close((size, size))
    with open(os.path.join(output, "identities.txt"), "w") as f:
        f.writelines(f"{class_id}\t{name}\n" for class_id, (name, _) in enumerate(identities))
    return len(jobs), len(identities)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.data.pack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("faces", help="folder of identity sub-folders")
    parser.add_argument("output", help="folder for train.rec, train.idx, property, identities.txt")
    parser.add_argument("--size", type=int, default=112, help="image side in pixels (default: %(default)s)")
    parser.add_argument("--resize", action="store_true", help="resize images of another size to --size x --size (default: refuse them, naming the file)")
    parser.add_argument("--threads", type=int, default=4, help="threads that read and check the images (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        images, identities = pack(args.faces, args.output, args.size, args.resize, args.threads)
    except PfcError as error:       # the project's errors (DataError, ImageError, ...)
        print(f"pack: {error}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}/train.rec, train.idx, property: {images} images of {identities} identities")
    return 0


if __name__ == "__main__":
    sys.exit(main())
