"""Every path under a run's output folder, OUTPUT: the one place that names them.

Old runs, the elastic supervisor and the tests depend on these names and
places: change none. Plain paths (no MXNet), so that every layer may import
it. Folders inside OUTPUT/checkpoints are checkpoint.py's to name; the lock
file of a held folder is run_lock.py's. See docs/DESIGN.md sections 5 and 6.5.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

MODEL = "model"          # OUTPUT/model: the prefix of the model for inference the trainer exports


def split_prefix(spec: str) -> "tuple[str, int]":
    """'PREFIX,EPOCH' -> (PREFIX, EPOCH); 'PREFIX' -> (PREFIX, 0), as InsightFace names its models. Only a
    whole number after the last comma is an epoch: a comma in a folder's name stays in the prefix."""
    prefix, comma, epoch = spec.rpartition(",")
    if comma and epoch.strip().isdigit():
        return prefix, int(epoch)
    return spec, 0


@dataclass(frozen=True)
class ModelFiles:
    """The files of a model PREFIX, wherever it is: MXNet's own naming (PREFIX-symbol.json and
    PREFIX-EPOCH.params, as mx.model.save_checkpoint writes them) and what the trainer (the verification)
    and the export command (ONNX and its check) write beside them."""

    prefix: str

    @property
    def symbol(self) -> str:
        return self.prefix + "-symbol.json"

    def params(self, epoch: int = 0) -> str:
        return f"{self.prefix}-{epoch:04d}.params"

    @property
    def verification(self) -> str:
        """The final verification of the model (the trainer's), read by embed for its threshold."""
        return self.prefix + "-verification.json"

    @property
    def onnx(self) -> str:
        return self.prefix + ".onnx"

    @property
    def onnx_check(self) -> str:
        return self.prefix + "-onnx-check.json"

    def written(self) -> "tuple[str, ...]":
        """Every file the project writes for this prefix."""
        return self.symbol, self.params(0), self.verification, self.onnx, self.onnx_check


@dataclass(frozen=True)
class RunFolder:
    """The output folder of one run, OUTPUT, and the paths in it."""
    root: str

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    # -- what a run writes (--start_over moves all of it aside: run_files)
    @property
    def checkpoints(self) -> str:
        return self._path("checkpoints")

    @property
    def logs(self) -> str:
        return self._path("logs")

    @property
    def metrics(self) -> str:
        return self._path("metrics.jsonl")

    @property
    def tensorboard(self) -> str:
        return self._path("tensorboard")

    @property
    def config(self) -> str:
        return self._path("config.json")

    @property
    def model(self) -> str:
        """The prefix of the exported model (MXNet's PREFIX-symbol.json + PREFIX-0000.params)."""
        return self._path(MODEL)

    @property
    def images_index(self) -> str:
        """The cached listing of an --images folder (data/folders.py): a cache, kept by --start_over."""
        return self.images_index_of(0)

    def images_index_of(self, set_number: int) -> str:
        """The cached listing of set `set_number`'s --images folder (set 0: images_index)."""
        return self._path("images-index.json" if set_number == 0 else f"images-index-set-{set_number}.json")

    @property
    def model_files(self) -> ModelFiles:
        return ModelFiles(self.model)

    def run_files(self) -> "tuple[str, ...]":
        """Every path a run writes into OUTPUT: what --start_over moves aside together. The run lock, the
        elastic supervisor's files and the image index (a cache of the data) are not among them."""
        return (self.checkpoints, self.logs, self.metrics, self.tensorboard, self.config,
                *self.model_files.written())

    @property
    def earlier_runs(self) -> str:
        """Where --start_over moves an earlier run (OUTPUT/earlier-runs/TIME/)."""
        return self._path("earlier-runs")

    # -- OUTPUT/logs: each rank's log and records (runtime/logs.py, stops.py, watchdog.py)
    def log_file(self, rank: int) -> str:
        return self._path("logs", f"rank{rank}.log")

    def failure_record(self, rank: "int | str") -> str:
        """Why a rank stopped (stops.py); rank '*' makes a glob pattern of every rank's."""
        return self._path("logs", f"failed-rank{rank}.txt")

    def crash_record(self, rank: "int | str") -> str:
        """faulthandler's dump of a rank that crashed inside MXNet or Horovod."""
        return self._path("logs", f"crash-rank{rank}.txt")

    def stacks_record(self, rank: "int | str") -> str:
        """The watchdog's dump of every thread's stack of a rank that made no progress."""
        return self._path("logs", f"stacks-rank{rank}.txt")

    def progress_record(self, rank: "int | str") -> str:
        """A rank's progress count, which the watchdogs of ranks waiting in a collective read."""
        return self._path("logs", f"progress-rank{rank}.txt")

    def reading_record(self, rank: "int | str") -> str:
        """The file a rank is reading whole (a .bin set, an array file), there only while it reads: left
        behind by a rank that died reading it (supervisor_messages.reading)."""
        return self._path("logs", f"reading-rank{rank}.txt")

    @property
    def finished_record(self) -> str:
        """The run's own word that it ended normally (runtime/supervisor_messages.py)."""
        return self._path("logs", "finished.json")

    # -- the elastic supervisor's (runtime/supervisor.py; the protocol with the trainer: supervisor_messages.py)
    @property
    def elastic(self) -> str:
        """OUTPUT/elastic: the supervisor's folder (it holds the supervisor's run lock too)."""
        return self._path("elastic")

    @property
    def stop_request(self) -> str:
        """Its presence asks the running trainer to stop after its next periodic checkpoint."""
        return self._path("elastic", "stop-at-checkpoint")

    @property
    def stopped_record(self) -> str:
        """The trainer's word that it stopped at a checkpoint on request (JSON: step, world size)."""
        return self._path("elastic", "stopped-at-checkpoint.json")

    @property
    def busy_record(self) -> str:
        """The trainer's word that the output lock refused it (JSON: the holder, the launch id)."""
        return self._path("elastic", "output-busy.json")

    @property
    def job_record(self) -> str:
        """The supervisor's record of the job it launched, for a supervisor that adopts it."""
        return self._path("elastic", "job.json")

    @property
    def timeline(self) -> str:
        """Every change of the elastic job's world, one line each."""
        return self._path("elastic-timeline.tsv")

    @classmethod
    def holding(cls, checkpoint_folder: str) -> "RunFolder | None":
        """The run folder whose checkpoints folder holds `checkpoint_folder`, or None."""
        parent = os.path.dirname(os.path.abspath(checkpoint_folder))
        run = cls(os.path.dirname(parent))
        return run if run.checkpoints == parent else None
