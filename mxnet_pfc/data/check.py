"""Read every record of a RecordIO set, or every image of a folder, once and report every damaged one,
before a long run.

    python -m mxnet_pfc.data.check DATA/            (or DATA/train.rec)
    python -m mxnet_pfc.data.check FACES/           (FACES/<identity>/<image>, as --images and data.pack read it)

Training stops at the first bad record it meets, which may be days in; this
finds them all in one pass: the index and file size (as at training start),
then each image record's RecordIO header, label range and decoding (a JPEG
strictly, as in training: libjpeg's `Corrupt JPEG data` warnings, which OpenCV
only prints, make it a damaged record). The class count is --num-classes, else
DATA/property, else the header record (as in training). A folder without
train.rec but with sub-folders is an image folder: every entry left out of it
(hidden, not an image, in a sub-folder, an identity without images ...) is
listed by reason, then every image is read and decoded as training decodes
it, so one pass names every file to mend. Exit status 0 when the set is
sound, 1 when anything is wrong (each problem listed).
"""
from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE, ImageError, read_file
from mxnet_pfc.data.folders import list_identities
from mxnet_pfc.data.iterators import count_classes
from mxnet_pfc.data.records import (
    DataError,
    check_identity_count,
    decode_image_record,
    decode_item,
    open_records,
    read_record,
)
from mxnet_pfc.runtime.errors import exit_status
from mxnet_pfc.runtime.files import printable


def check_records(rec_path: str, num_classes: int, image_size: "tuple[int, int]", threads: int = 4,
                  progress: bool = True) -> "tuple[int, list[str]]":
    """(image records read, problems found); a set that cannot be opened at all raises DataError."""
    reader, records = open_records(rec_path)
    keys = records.image_records           # an array: a chunk at a time becomes Python ints
    problems = []
    try:
        check_identity_count(records, num_classes)
    except DataError as error:
        problems.append(str(error))

    # One reader: reads stay in order on this thread; decoding (it releases the GIL) runs in the pool.
    with ThreadPoolExecutor(max_workers=threads) as pool:
        chunk = 1024
        with tqdm(total=len(keys), desc="records", unit="img", disable=not progress, file=sys.stderr,
                  mininterval=2) as bar:
            for start in range(0, len(keys), chunk):
                part = keys[start:start + chunk].tolist()
                raws = []
                for key in part:
                    try:
                        raws.append((key, read_record(reader, key, rec_path)))
                    except DataError as error:
                        problems.append(str(error))
                found = pool.map(lambda item: _decode_problem(*item, reader.offset(item[0]), rec_path, num_classes,
                                                              image_size), raws)
                problems.extend(p for p in found if p)
                bar.update(len(part))
    reader.close()
    return len(keys), problems


def check_folder(root: str, image_size: "tuple[int, int]", threads: int = 4, progress: bool = True,
                 report=print) -> "tuple[int, int, list[str]]":
    """(images read, identities, problems found) of an image folder; `report` gets the lines of what the
    listing left out. A folder with no identity sub-folder with images raises DataError."""
    identities = list_identities(root, report=report)
    items = [(path, label) for label, (_, paths) in enumerate(identities) for path in paths]
    real_root = os.path.realpath(root)

    def problem(item) -> "str | None":
        path, label = item
        try:
            decode_item(read_file(path, within=real_root), label, printable(path), len(identities), image_size)
        except (DataError, ImageError) as error:
            return str(error)
        return None

    problems = []
    with ThreadPoolExecutor(max_workers=threads) as pool, \
            tqdm(total=len(items), desc="images", unit="img", disable=not progress, file=sys.stderr,
                 mininterval=2) as bar:
        for found in pool.map(problem, items):
            if found:
                problems.append(found)
            bar.update(1)
    return len(items), len(identities), problems


def _decode_problem(key, raw, offset, rec_path, num_classes, image_size) -> "str | None":
    try:
        decode_image_record(raw, key, offset, rec_path, num_classes, image_size)
    except DataError as error:
        return str(error)
    return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m mxnet_pfc.data.check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="the set's folder (with train.rec, train.idx, property) or its .rec file, or a folder "
                                "of identity sub-folders of images")
    p.add_argument("--num-classes", "--num_classes", type=int,      # the spelling count_classes' message gives
                   help="class count (default: the folder's property file, else the header record)")
    p.add_argument("--image-size", type=int, default=FACE_SIZE, help=f"expected width and height (default {FACE_SIZE})")
    p.add_argument("--threads", type=int, default=4, help="decoding threads (default 4)")
    p.add_argument("--show", type=int, default=20, help="problems listed in full (default 20; all are counted)")
    return p


def run(args, rec: str) -> int:
    num_classes = args.num_classes or count_classes(rec)
    total, problems = check_records(rec, num_classes, (args.image_size, args.image_size), args.threads)
    return verdict(problems, args.show, f"{rec}: {total} image records, {num_classes} classes", "record")


def run_folder(args) -> int:
    total, identities, problems = check_folder(args.data, (args.image_size, args.image_size), args.threads)
    return verdict(problems, args.show, f"{args.data}: {total} images of {identities} identities", "image")


def verdict(problems: "list[str]", show: int, what: str, item: str) -> int:
    """Print the first `show` problems and the summary line; the exit status (1 if any problem)."""
    for problem in problems[:show]:
        print(problem)
    if len(problems) > show:
        print(f"... and {len(problems) - show} more")
    print(f"{what}: {'sound' if not problems else f'{len(problems)} damaged {item}(s)'}")
    return 1 if problems else 0


def is_image_folder(path: str) -> bool:
    """A folder without train.rec that holds sub-folders: ROOT/<identity>/<image>."""
    if not os.path.isdir(path) or os.path.exists(os.path.join(path, "train.rec")):
        return False
    with os.scandir(path) as entries:
        return any(entry.is_dir() and not entry.name.startswith(".") for entry in entries)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if is_image_folder(args.data):
        return exit_status(f"{args.data}: cannot be used", run_folder, args)
    rec = args.data if args.data.endswith(".rec") else os.path.join(args.data, "train.rec")
    return exit_status(f"{rec}: cannot be used", run, args, rec)


if __name__ == "__main__":
    sys.exit(main())
