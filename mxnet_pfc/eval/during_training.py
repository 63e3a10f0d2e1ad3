"""Rank 0's evaluation during training: the .bin pair sets and the IJB-layout sets (--val_targets,
--ijb_targets), every --verbose steps and on the exported model; their log lines and metrics."""
from __future__ import annotations

import logging
import time

import mxnet as mx

from mxnet_pfc.eval.ijb_set import IJBSet, headline
from mxnet_pfc.eval.verification import Verifier
from mxnet_pfc.runtime.logs import ROOT_LOGGER

log = logging.getLogger(ROOT_LOGGER)


def ijb_target(entry: str) -> "tuple[str, str]":
    """(root, target) of an --ijb_targets entry: ROOT (IJB-C) or ROOT:IJBB / ROOT:IJBC."""
    root, _, target = entry.rpartition(":") if entry.upper().endswith((":IJBB", ":IJBC")) else (entry, "", "IJBC")
    return root, target.upper()


class TrainingEvaluation:
    """The sets rank 0 evaluates, read and checked once at setup (a wrong path stops the run before step 1)."""

    def __init__(self, val_targets, ijb_targets, symbol: mx.sym.Symbol, ctx: mx.Context, batch_size: int,
                 image_size: int):
        self.verifier = Verifier(val_targets, symbol, ctx, batch_size, image_size) if val_targets else None
        self.ijb_sets = tuple(IJBSet(*ijb_target(entry), symbol, ctx, batch_size) for entry in ijb_targets)
        for ijb_set in self.ijb_sets:
            log.info(f"IJB set {ijb_set.describe()}")

    def __bool__(self) -> bool:
        return self.verifier is not None or bool(self.ijb_sets)

    def evaluate(self, step: int, params, metrics, best: dict) -> dict:
        """The report of `params` (arg, aux) at `step`, logged and written to `metrics`.

        .bin sets: accuracy, and `best` (accuracy and step per set, kept in checkpoints) updated in place;
        IJB sets: their headline figures, and the whole report under "ijb-<name>".
        """
        reports = {}
        for ijb_set in self.ijb_sets:
            began = time.time()
            report, _ = ijb_set.evaluate(*params, progress=False)
            figures = headline(report)
            log.info(f"step {step}: IJB {ijb_set.target} [{ijb_set.mode}]: "
                     + ", ".join(f"{key} {value:.4f}" for key, value in figures.items())
                     + f" ({time.time() - began:.1f} s)")
            metrics.write(step, **{f"ijb/{ijb_set.name}/{key}": value for key, value in figures.items()})
            reports[f"ijb-{ijb_set.name}"] = report
        if self.verifier is None:
            return reports
        began = time.time()
        found = self.verifier.evaluate(*params)
        for name, result in found.items():
            if name not in best or result.accuracy > best[name]["accuracy"]:
                best[name] = dict(accuracy=result.accuracy, step=step)
            log.info(f"step {step}: verification {name}: accuracy {result}; best {best[name]['accuracy']:.4f} "
                     f"at step {best[name]['step']} ({time.time() - began:.1f} s)")
            metrics.write(step, **{f"val/{name}/{key}": value for key, value in result.as_dict().items()},
                          **{f"val/{name}/best_accuracy": best[name]["accuracy"]})
        return {**{name: result.as_dict() for name, result in found.items()}, **reports}
