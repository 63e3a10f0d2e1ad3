"""Files written whole or not at all: a crash mid-write never leaves a file that loads half."""
from __future__ import annotations

import contextlib
import json
import os


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
