"""Rank 0's training figures: metrics.jsonl, TensorBoard events, and the throughput of each window.

MetricsLog writes one JSON line per record and the same scalars to TensorBoard
(mxboard, optional). Throughput measures the steps between two log lines:
samples per second per rank and in total, the share of time spent waiting for
data, and the time left; evaluation and checkpoint time is left out.
"""
from __future__ import annotations

import json
import logging
import os
import time

from mxnet_pfc.runtime.files import atomic_path
from mxnet_pfc.runtime.run_folder import RunFolder

log = logging.getLogger(__name__)


class MetricsLog:
    """Rank 0's figures: JSON lines in OUTPUT/metrics.jsonl and TensorBoard events (mxboard).

    One record per step: a run resumed at step S first drops the records of
    steps after S (the lost run's, which it recomputes) from metrics.jsonl, and
    writes TensorBoard's restart marker (a SessionLog START event at step S + 1),
    on which TensorBoard discards the earlier events of steps S + 1 and later.
    With `samples_of` every record also holds the samples trained by its step,
    which keeps growing when a resume on another world size renumbers the steps;
    records that have it are then dropped by it (beyond `saved_samples`).
    """

    def __init__(self, run: RunFolder, tensorboard: bool, start_step: int = 0, saved_step: "int | None" = None,
                 samples_of=None, saved_samples: "int | None" = None):
        """start_step: the first step this run trains is start_step + 1; saved_step: the checkpoint's
        step in its own run's numbering (they differ when resuming on another global batch)."""
        self.path = run.metrics
        self._samples_of = samples_of
        self._keep_until(start_step if saved_step is None else saved_step, saved_samples)
        self._file = open(self.path, "a")
        self._board = None
        if tensorboard:
            try:
                from mxboard import SummaryWriter
                from mxboard.proto.event_pb2 import Event, SessionLog
                self._board = SummaryWriter(logdir=run.tensorboard)
                self._board._file_writer.add_event(Event(wall_time=time.time(), step=start_step + 1,
                                                         session_log=SessionLog(status=SessionLog.START)))
            except Exception as error:     # mxboard is optional for training
                log.warning(f"TensorBoard logging off: {error}")

    def _keep_until(self, step: int, samples: "int | None") -> None:
        """Rewrite metrics.jsonl without the records after `samples` (records without samples: after
        `step`) and half-written lines."""
        if not os.path.exists(self.path):
            return
        kept = []
        for line in open(self.path):
            try:
                record = json.loads(line)
                if (record["samples"] <= samples) if samples is not None and "samples" in record \
                        else record["step"] <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                continue
        with atomic_path(self.path) as tmp:
            with open(tmp, "w") as f:
                f.writelines(kept)

    def write(self, step: int, **values) -> None:
        if self._samples_of is not None:
            values = {"samples": self._samples_of(step), **values}
        self._file.write(json.dumps({"step": step, "time": round(time.time(), 3), **values}) + "\n")
        self._file.flush()
        if self._board is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)):
                    self._board.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        self._file.close()
        if self._board is not None:
            self._board.close()


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


def progress_line(done: int, max_update: int, grad_accum: int, epoch: int, loss: float, lr: float,
                  figures: dict) -> str:
    """The log line of a window (figures: Throughput.close_window's): where the run is, how fast, where
    a step's time goes."""
    shares = " ".join(f"{name} {share:.0%}" for name, share in figures["phases"].items() if name != "data")
    micro = f" ({grad_accum} micro-batches each)" if grad_accum > 1 else ""
    return (f"step {done}/{max_update}{micro} epoch {epoch} loss {loss:.4f} lr {lr:.5f} | "
            f"{figures['samples_per_sec_per_rank']:.1f} samples/s per rank, {figures['samples_per_sec']:.1f} total | "
            f"data wait {figures['data_wait_fraction']:.0%}{' | ' + shares if shares else ''} | "
            f"eta {format_duration(figures['eta_seconds'])}")


class Throughput:
    """Counts one window of steps (from one log line to the next) on one rank."""

    def __init__(self, batch_size: int, world_size: int):
        self.batch_size, self.world_size = batch_size, world_size
        self._restart()

    def _restart(self) -> None:
        self.started, self.steps, self.data_wait = time.time(), 0, 0.0
        self.phase_seconds = None      # the timed step's {phase: seconds}, once it has run

    def timing_next_step(self) -> "dict | None":
        """The dict the next step records its phases into, for the window's first step; else None."""
        if self.steps == 0 and self.phase_seconds is None:
            self.phase_seconds = {}
            return self.phase_seconds
        return None

    def waited_for_data(self, seconds: float) -> None:
        self.data_wait += seconds

    def step_done(self) -> None:
        self.steps += 1

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` (evaluation, saving) out of the window's time."""
        self.started += seconds

    def close_window(self, steps_left: int) -> dict:
        """The window's figures, then a new window: samples/s per rank and in all, data-wait share, eta (s)."""
        elapsed = max(time.time() - self.started, 1e-9)
        per_rank = self.steps * self.batch_size / elapsed
        figures = dict(samples_per_sec_per_rank=per_rank, samples_per_sec=per_rank * self.world_size,
                       data_wait_fraction=self.data_wait / elapsed,
                       eta_seconds=steps_left * elapsed / max(self.steps, 1), phases=self.phase_fractions())
        self._restart()
        return figures

    def phase_fractions(self) -> "dict[str, float]":
        """Each phase's share of a step: the window's data-wait share, and the rest of the
        step divided as the timed step's phases divide it ({} when no step was timed)."""
        timed = self.phase_seconds or {}
        total = sum(timed.values())
        if total <= 0:
            return {}
        elapsed = max(time.time() - self.started, 1e-9)
        compute = max(0.0, 1.0 - self.data_wait / elapsed)
        return {"data": 1.0 - compute, **{name: compute * seconds / total for name, seconds in timed.items()}}
