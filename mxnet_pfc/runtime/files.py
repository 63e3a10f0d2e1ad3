"""Files written whole or not at all: a crash mid-write never leaves a file that loads half. JSON records
read with bounds: a file another process (or a person) wrote is data, never a way to hang or crash the reader."""
from __future__ import annotations

import contextlib
import json
import os
import re
import stat

from mxnet_pfc.runtime.errors import PfcError

RECORD_BYTES = 1 << 20      # more than any record of a run's own (a lock, job.json: a few hundred bytes)
RECORD_DEPTH = 32           # nesting of a record's JSON: a few levels are real; 100,000 exhaust the parser


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a temporary name next to `path`; renamed to `path` only if the block succeeds."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path: str, value, indent: "int | None" = 2) -> None:
    """JSON written in full (flushed to disk) or not at all; indent=None for a large file read by programs only."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            json.dump(value, f, indent=indent)
            f.flush()
            os.fsync(f.fileno())


class RecordFileError(PfcError, ValueError):
    """A record file (JSON, or a line of text) that is not a small record: not a regular file, too large,
    nested too deeply, not JSON."""


def json_depth(text: str) -> int:
    """How deeply the arrays and objects of JSON `text` nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string, escaped_at = False, -1
    for match in re.finditer(r'[\[\]{}"\\]', text):
        at, char = match.start(), match.group()
        if at == escaped_at:
            continue
        if in_string:
            if char == "\\":
                escaped_at = at + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def read_record_bytes(path: str, max_bytes: int = RECORD_BYTES) -> bytes:
    """The bytes of the record file `path`, which another process (or a person) may have written (see
    opened_regular); RecordFileError naming the file and the problem; FileNotFoundError when there is none."""
    with opened_regular(path, max_bytes, "a record", RecordFileError) as (f, size):
        return _read_whole(f, size, path, "a record", RecordFileError)


def read_json(path: str, max_bytes: int = RECORD_BYTES, max_depth: int = RECORD_DEPTH):
    """The value of the JSON record file `path` (read_record_bytes), nested at most `max_depth` deep (json's
    parser recurses: 100,000 levels end in a RecursionError). Else RecordFileError naming the file and the
    problem; OSError (FileNotFoundError) when it cannot be opened."""
    data = read_record_bytes(path, max_bytes)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RecordFileError(f"{path}: not JSON: not UTF-8 text (byte {error.start})") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise RecordFileError(f"{path}: nested {depth:,} levels deep (at most {max_depth}): not a record")
    try:
        return json.loads(text)
    except ValueError as error:
        raise RecordFileError(f"{path}: not JSON: {error}") from None


def printable(path: str) -> str:
    """`path` for a message: bytes of a name that is not UTF-8 shown as \\xNN (printing the surrogates Python
    decodes them to would fail on a UTF-8 stream)."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


@contextlib.contextmanager
def opened_regular(path: str, limit: int, what: str, error_type: "type[Exception]", within: "str | None" = None):
    """(binary file object, size) of `path`, a regular file of at most `limit` bytes; error_type naming the
    file and the problem otherwise (`what` names the kind: "a verification .bin"). FileNotFoundError passes.

    The one way this project opens a file it was handed (an image, a .bin, an array or symbol file, a
    record another process wrote): a FIFO would block open() and read() forever, and /dev/zero (or a
    symlink to it) would be read until memory runs out. So the file is opened non-blocking and checked to
    be a regular file on the descriptor opened (a path swapped in after a caller's check changes nothing);
    with `within` (a resolved folder), the file opened must lie under it, symlinks resolved.
    """
    shown = printable(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as error:
        raise error_type(f"{shown} cannot be read: {error.strerror or error}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise error_type(f"{shown} is not a regular file ({file_kind(st.st_mode)}): {what} is read only from a "
                         "regular file")
    with os.fdopen(fd, "rb") as f:
        opened = os.readlink(f"/proc/self/fd/{fd}") if within and os.path.isdir("/proc/self/fd") else None
        if opened is not None and os.path.commonpath([within, opened]) != within:
            raise error_type(f"{shown} leads to {printable(opened)}, outside {printable(within)}: only files under "
                             f"{printable(within)} are read")
        if st.st_size > limit:
            raise error_type(f"{shown} is {st.st_size:,} bytes, more than {what} may be (the limit is {limit:,} "
                             "bytes)")
        yield f, st.st_size


def _read_whole(f, size: int, path: str, what: str, error_type) -> bytes:
    """The `size` bytes of opened_regular's file (a read of the limit would allocate all of it at once)."""
    data = f.read(size + 1)
    if len(data) > size:
        raise error_type(f"{printable(path)} grew while it was read: {what} is read when it is complete")
    return data


def read_regular_file(path: str, limit: int, what: str, error_type: "type[Exception]" = OSError,
                      within: "str | None" = None) -> bytes:
    """The bytes of `path`, a regular file of at most `limit` bytes (opened_regular); error_type naming the
    file otherwise, a missing file included."""
    try:
        with opened_regular(path, limit, what, error_type, within) as (f, size):
            return _read_whole(f, size, path, what, error_type)
    except OSError as error:
        if isinstance(error, error_type):
            raise
        raise error_type(f"{printable(path)} cannot be read: {error.strerror or error}") from None


def file_kind(mode_or_path: "int | str") -> str:
    """What a file that is not a regular one is, in words (for messages), from its mode or its path."""
    if isinstance(mode_or_path, str):
        try:
            mode_or_path = os.stat(mode_or_path).st_mode
        except OSError as error:
            return error.strerror or str(error)
    for test, kind in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode_or_path):
            return kind
    return "not a regular file"
