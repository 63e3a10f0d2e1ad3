"""Where an export goes, and which verification figures go with it (the export command's library).

A training output folder and its latest checkpoint export to OUTPUT/model, where the training writes its
model; any other checkpoint beside its own folder, so that an earlier checkpoint never replaces the run's
model. The figures of a training's final verification (embed's default threshold) go with the export only
when they measured exactly the parameters exported.
"""
from __future__ import annotations

import os

import numpy as np

from mxnet_pfc.models.inference import ModelError, load_model
from mxnet_pfc.runtime import checkpoints
from mxnet_pfc.runtime.run_folder import ModelFiles, RunFolder, split_prefix


def default_prefix(model: str) -> str:
    """Where MODEL is exported without --prefix: OUTPUT/model for a training output folder or its latest
    checkpoint (where the training exports its model); beside any other checkpoint folder, under its name
    (it is not the run's model, and a checkpoint outside a run has no OUTPUT/model)."""
    folder = os.path.abspath(model)
    if checkpoints.is_checkpoint(folder):
        run = RunFolder.holding(folder)
        newest = checkpoints.latest(run.checkpoints) if run is not None else None
        if newest is not None and os.path.realpath(newest.path) == os.path.realpath(folder):
            return run.model
        return folder
    if os.path.isdir(folder):
        return RunFolder(folder).model
    raise ModelError(f"{model} is a prefix: name the exported one with --prefix")


def prefix_for(model: str, given: str) -> str:
    """The prefix an export of MODEL writes: --prefix (`given`), else default_prefix; refused where it would
    overwrite the model it reads, or inside a checkpoint's folder (replaced files, pruned with it)."""
    prefix = given or default_prefix(model)
    if not os.path.isdir(model) and os.path.abspath(prefix) == os.path.abspath(split_prefix(model)[0]):
        raise ModelError(f"--prefix {prefix} would overwrite the model it reads; choose another")
    if checkpoints.is_checkpoint(os.path.dirname(os.path.abspath(prefix))):
        raise ModelError(f"--prefix {prefix} is inside a checkpoint's folder, whose files it could replace and "
                         "which is removed when newer checkpoints are kept; choose another")
    return prefix


def source_verification(model: str) -> "tuple[str, str] | None":
    """(the model prefix a training verified at its end, its verification file) for what MODEL names: a run
    folder, one of its checkpoints, or an exported prefix; None when there is none."""
    folder = os.path.abspath(split_prefix(model)[0])
    if checkpoints.is_checkpoint(folder):
        run = RunFolder.holding(folder)
        prefix = run.model if run is not None else None
    else:
        prefix = RunFolder(folder).model if os.path.isdir(folder) else split_prefix(model)[0]
    if prefix is None or not os.path.isfile(ModelFiles(prefix).verification):
        return None
    return prefix, ModelFiles(prefix).verification


def _measured(prefix: str, arg_params: dict, aux_params: dict) -> bool:
    """Whether the model at `prefix` holds exactly these parameters (what its verification file measured)."""
    try:
        _, arg, aux = load_model(prefix)[:3]
    except ModelError:
        return False
    return all(name in arg and np.array_equal(arg[name].asnumpy(), value.asnumpy())
               for name, value in arg_params.items()) and \
        all(name in aux and np.array_equal(aux[name].asnumpy(), value.asnumpy()) for name, value in aux_params.items())


def verification_of(model: str, prefix: str, arg_params: dict, aux_params: dict) -> "tuple[str | None, str]":
    """(a verification file that measured exactly these parameters, else None; why): the training's final
    one for what MODEL names, else the one already beside PREFIX. Asked before the export writes anything:
    the verified model may be the one it is about to replace."""
    found = source_verification(model)
    target = ModelFiles(prefix).verification
    kept = f"verification figures (embed's threshold) kept in {target}: they measured these parameters"
    if found is not None and _measured(found[0], arg_params, aux_params):
        if os.path.abspath(found[1]) == os.path.abspath(target):
            return target, kept
        return found[1], f"verification figures (embed's threshold) carried from {found[1]}"
    if os.path.isfile(target) and _measured(prefix, arg_params, aux_params):
        return target, kept
    if found is not None:
        return None, (f"{found[1]} not carried: it measured other parameters than these (embed --pair will need "
                      "--threshold, or run verify)")
    return None, "no verification figures for this model: embed --pair will need --threshold (or run verify)"


def clear_verification(keep: "str | None", prefix: str) -> str:
    """Remove the verification file beside PREFIX unless it is `keep`, before the export replaces the model it
    measured (were the export stopped half-way, its threshold would pass for other parameters). Returns
    what the log adds ('' when nothing was there)."""
    target = ModelFiles(prefix).verification
    if not os.path.exists(target) or (keep is not None and os.path.abspath(keep) == os.path.abspath(target)):
        return ""
    os.remove(target)
    return "" if keep is not None else (f"; {target} removed: it measured the parameters this export replaced "
                                        "(a training's final figures stay in its metrics.jsonl)")
