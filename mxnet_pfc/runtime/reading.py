"""The file a rank is reading whole, noted where the elastic supervisor finds it if the rank dies reading it.

A file a user was handed (a .bin set, an array file) can kill the rank that reads it: a crash in a
library, the out-of-memory killer. Relaunched, the rank reads it again and dies again, which without a
word looks like a lost rank. So a trainer's rank notes the file in OUTPUT/logs/reading-rankR.txt
(RunFolder.reading_record) while it reads it; a note left behind by a rank that ended without a word of
its own is read by supervisor_messages.died_reading. Outside a trainer's rank (the verify command) nothing is
noted. Ground floor: imports nothing of the project, so that the loaders (errors.py) may use it.
"""
from __future__ import annotations

import contextlib
import functools
import os

_state = {"record": None, "file": None}     # this rank's reading record (None: not a trainer's rank); the file


def note_in(record: str) -> None:
    """Note the files this rank reads in `record` (its RunFolder.reading_record), from now on."""
    _state["record"] = record


@contextlib.contextmanager
def reading(file: str):
    """`file` (its real path) noted as being read for the block: the note stays only if the process dies
    inside it. A nested read notes its file, then the outer one's again."""
    record, before = _state["record"], _state["file"]
    if record is None:
        yield
        return
    _state["file"] = os.path.realpath(file)
    _note(record, _state["file"])
    try:
        yield
    finally:
        _state["file"] = before
        _note(record, before)


def _note(record: str, file: "str | None") -> None:
    try:
        if file is None:
            os.remove(record)
        else:
            with open(record, "w") as f:
                f.write(file + "\n")
    except OSError:             # a full disk, a note already gone: a help, never a reason to fail the read
        pass


def reads_file(load):
    """`load(file, ...)` noted as reading `file`: a decorator for the loaders of files users are handed."""
    @functools.wraps(load)
    def noted(file, *args, **kwargs):
        with reading(file):
            return load(file, *args, **kwargs)
    return noted
