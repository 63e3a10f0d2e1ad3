"""Timing shared by the benchmark scripts: every rank starts a timed piece of work together."""
from __future__ import annotations

import json
import time

import mxnet as mx

from mxnet_pfc.runtime import comm


def synced(fn) -> float:
    """Seconds of fn() with nothing in flight before it and everything finished after it."""
    mx.nd.waitall()     # host sync: nothing else is in flight while timing
    comm.barrier()      # ranks start together, as they run a step together
    start = time.perf_counter()
    fn()
    mx.nd.waitall()
    return time.perf_counter() - start


def append_json(path: str, record: dict) -> None:
    """One JSON line more in `path` (the benchmarks' --json results; make bench collects them)."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
