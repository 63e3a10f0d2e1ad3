"""Pack a folder of identity sub-folders into the InsightFace RecordIO layout.

    python -m mxnet_pfc.data.pack FACES/ OUT/ [--resize]

FACES/ holds one sub-folder per identity (sorted names -> class ids 0, 1, ...)
with aligned face images. OUT/ receives train.rec, train.idx, property and
identities.txt (class id -> folder name). Images already 112x112 are stored as
they are (no re-encoding); others are refused, or resized with --resize.
Images are decoded as training decodes them (data.faces): a damaged JPEG is refused.

Only files under FACES/ are read: symlinks that lead out of it, FIFOs, devices
and other entries that are not regular files are skipped and named. OUT/ is
held by one pack at a time (OUT/.pack.lock); the files are written under
temporary names and appear together at the end, so a pack that fails or is
stopped (Ctrl-C, kill) leaves OUT/ as it was.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import logging
import os
import signal
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import cv2
from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE, ImageError, WrongSize, decode_face, decode_image, fit_size, read_file
from mxnet_pfc.data.folders import list_identities
from mxnet_pfc.data.records import DataError, RecordWriter
from mxnet_pfc.runtime.errors import PfcError, exit_status

log = logging.getLogger(__name__)

LOCK_NAME = ".pack.lock"
WRITTEN = ("train.rec", "train.idx", "property", "identities.txt")


class FolderBusy(PfcError, RuntimeError):
    """Another pack is writing into the output folder."""


@contextlib.contextmanager
def hold_folder(folder: str):
    """Hold `folder` for this pack (an fcntl lock on FOLDER/.pack.lock, released when the process ends,
    however it ends): two packs into one folder would interleave their records."""
    path = os.path.join(folder, LOCK_NAME)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "starting"
            os.close(fd)
            raise FolderBusy(f"{folder} is being written by another pack ({holder}): wait for it to end, "
                             "or pack into another folder") from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)          # locked a file its holder removed as it ended: take the new one
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    try:
        yield
    finally:
        os.remove(path)       # before the lock goes: a waiting pack then finds another file, and retries
        os.close(fd)


def remove_leftovers(folder: str) -> None:
    """Remove the temporary files of earlier packs into `folder` that were killed (called under its lock)."""
    for name in os.listdir(folder):
        base, dot, tail = name.rpartition(".tmp")
        if dot and base in WRITTEN and (tail == "" or tail.isdigit()):
            log.warning(f"{os.path.join(folder, name)}: left by an earlier pack that was stopped; removed")
            os.remove(os.path.join(folder, name))


def load_image(path: str, size: int, resize: bool) -> bytes:
    """The bytes to store: the file itself when it is a sound size x size image, else a resized JPEG.

    Decoded by faces, strictly as training will: a damaged JPEG is refused here, and so is an image of
    another size (without --resize) or above faces.MAX_FACE_PIXELS, from its header, before decoding.
    """
    try:
        raw = read_file(path)
        if not resize:
            decode_face(raw, path, size)
            return raw                   # stored as it is: no re-encoding
        image = decode_image(raw, path)
        if image.shape[:2] == (size, size):
            return raw
        face = fit_size(image, path, size, resize)
    except WrongSize as error:
        raise DataError(f"{error}, or pass --resize") from None
    except ImageError as error:
        raise DataError(str(error)) from None
    ok, encoded = cv2.imencode(".jpg", cv2.cvtColor(face, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 95])
    return encoded.tobytes()


def pack(root: str, output: str, size: int = FACE_SIZE, resize: bool = False, threads: int = 4,
         finishing=contextlib.nullcontext) -> "tuple[int, int]":
    """Write OUT/train.rec etc.; returns (images, identities).

    Everything is checked that can be before a byte is written; the files are written under
    temporary names, renamed when all are complete (inside the context `finishing()`), and removed
    if the pack fails or is stopped.
    """
    identities = list_identities(root)
    for name, _ in identities:
        if "\t" in name or "\n" in name:
            raise DataError(f"{os.path.join(root, name)!r}: a tab or newline in an identity folder's name "
                            "(identities.txt holds one 'class id<TAB>name' line each): rename the folder")
    # the names exactly as the file system holds them (os.fsencode: a name that is not UTF-8 stays as it is)
    names = b"".join(b"%d\t%s\n" % (class_id, os.fsencode(name)) for class_id, (name, _) in enumerate(identities))
    jobs = [(class_id, path) for class_id, (_, paths) in enumerate(identities) for path in paths]
    if os.path.exists(output) and not os.path.isdir(output):
        raise DataError(f"{output}: not a folder (pack writes train.rec, train.idx, property, identities.txt into one)")
    os.makedirs(output, exist_ok=True)
    with hold_folder(output):
        remove_leftovers(output)
        writer = None
        pool = ThreadPoolExecutor(max_workers=threads)
        try:
            writer = RecordWriter(output, len(jobs), len(identities))
            encoded = pool.map(lambda job: load_image(job[1], size, resize), jobs)
            for (class_id, _), payload in tqdm(zip(jobs, encoded), total=len(jobs), desc="pack", unit="img"):
                writer.add(class_id, payload)
            with finishing():
                writer.close((size, size), {"identities.txt": names})
        except BaseException:
            if writer is not None:
                writer.abort()
            raise
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
    return len(jobs), len(identities)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.data.pack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("faces", help="folder of identity sub-folders")
    parser.add_argument("output", help="folder for train.rec, train.idx, property, identities.txt")
    parser.add_argument("--size", type=int, default=FACE_SIZE, help="image side in pixels (default: %(default)s)")
    parser.add_argument("--resize", action="store_true",
                        help="resize images of another size to --size x --size (default: refuse them, naming the file)")
    parser.add_argument("--threads", type=int, default=4,
                        help="threads that read and check the images (default: %(default)s)")
    return parser


class StopOnce:
    """The SIGINT (Ctrl-C) and SIGTERM (kill) handler of the command: the first signal raises KeyboardInterrupt,
    on which the pack removes its files, releases its folder and says so in one line; later ones are ignored,
    so that this clean-up is not cut short (a second signal during it left 0-byte .tmp files and a traceback
    from inside tqdm). A signal while the finished files are renamed into place (`finishing`, milliseconds)
    stops nothing: the pack completes and says so."""

    def __init__(self):
        self.stopping = self.in_finish = False

    def __call__(self, signum, frame) -> None:
        if self.stopping or self.in_finish:
            self.stopping = True
            return
        self.stopping = True
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def finishing(self):
        self.in_finish = True
        try:
            yield
        finally:
            self.in_finish = False


def run(args, stop: "StopOnce | None" = None) -> None:
    finishing = stop.finishing if stop else contextlib.nullcontext
    try:
        images, identities = pack(args.faces, args.output, args.size, args.resize, args.threads, finishing)
    except OSError as error:        # the file system's own complaint (a full disk, no permission ...), named
        raise DataError(f"{error.filename or args.output}: {error.strerror or error}") from None
    print(f"wrote {args.output}/train.rec, train.idx, property, identities.txt: "
          f"{images} images of {identities} identities")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(format="pack: %(message)s", level=logging.INFO)
    stop = StopOnce()
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)      # `kill` cleans up as Ctrl-C does
    try:
        return exit_status("pack", run, args, stop)
    except KeyboardInterrupt:
        print(f"pack: interrupted; nothing was written to {args.output}", file=sys.stderr, flush=True)
        # Its files are removed and the folder released. The interrupt may have come while the image pool held
        # one of concurrent.futures' locks (submitting), which the interpreter's exit then waits for forever
        # (seen in CI: the message printed, the process never ended): leave without that exit.
        os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
