"""A run's checkpoints as files, without MXNet: their names, their order, and state.json.

One folder per checkpoint, OUTPUT/checkpoints/ckpt-SSSSSS-step-NNNNNNNN/ (the
S-th checkpoint written in this output folder, at step N of the run that wrote
it); a folder is complete once state.json is in it (written last, then the
folder renamed from its .tmp twin). Which files a checkpoint holds, who writes
them and the atomic save: docs/DESIGN.md section 5.1. Writing and loading the
arrays is training/checkpoint.py's (and models/inference.py's for the backbone);
everything a reader needs without MXNet (the supervisor, a resume's checks,
the commands that find a run's model) is here.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields

from mxnet_pfc.runtime.errors import CheckpointError, quoted
from mxnet_pfc.runtime.files import read_json, write_json
from mxnet_pfc.runtime.run_folder import RunFolder

# 4: a run of several sets (one head per set: extra_heads, their banks in set-S/); 3: state.json without the fields
# nobody read (network and seed are the configuration's); 2: optimizer-states.params (arrays only); 1: MXNet's
# pickled optimizer.states. A run of one set writes format 3, which earlier versions read.
FORMAT_VERSION = 3
SETS_FORMAT = 4
READABLE_FORMATS = (1, 2, 3, 4)
STATE_FILE = "state.json"
STATE_BYTES = 64 << 20      # a state.json holds a shard per rank: a few KB at 10,000 ranks
MODEL = "model"                                      # rank 0's backbone, MXNet's checkpoint PREFIX
AVERAGE_MODEL = "model-average"                      # the same with parameters averaged over ranks
OPTIMIZER_FILE = "optimizer-states.params"          # MXNet's array format: no code can be in it
LEGACY_OPTIMIZER_FILE = "optimizer.states"          # format 1: a pickle, read only through an arrays-only unpickler
_FOLDER = re.compile(r"^ckpt-(\d{6,})-step-(\d{8,})$")
_LEGACY_FOLDER = re.compile(r"^step-(\d{8})$")     # format 1 named folders by step alone


def is_checkpoint(folder: str) -> bool:
    """Whether `folder` is a complete checkpoint: state.json is written last, into the folder before it is
    published."""
    return os.path.isfile(os.path.join(folder, STATE_FILE))


def aux_file(folder: str, rank: int) -> str:
    """Rank `rank`'s own BatchNorm statistics in a checkpoint folder."""
    return os.path.join(folder, f"aux-rank{rank:05d}.params")


def head_folder(folder: str, set_index: int) -> str:
    """Where set `set_index`'s memory bank lies in a checkpoint folder: set 0's (the only one of a run of
    one set) in the folder itself, as format 3 has it; set S >= 1's in its set-S/ subfolder."""
    return folder if set_index == 0 else os.path.join(folder, f"set-{set_index}")


def folder_name(sequence: int, step: int) -> str:
    """A checkpoint's folder: its place in the output folder's history, then its step label.

    Step labels are not unique over a run's history (a larger global batch after
    an elastic grow or a changed --batch_size renumbers steps downwards); the
    sequence number is, and it orders checkpoints by when they were written.
    """
    return f"ckpt-{sequence:06d}-step-{step:08d}"


@dataclass(frozen=True)
class RunState:
    """The run's part of state.json, which the trainer hands to checkpoint.save: where the run stands in
    its data and schedule, and how it was configured. save adds the checkpoint's own part (State)."""
    steps_per_epoch: int
    global_batch: int
    max_update: int            # the plan's length in steps of this global batch
    samples_seen: int          # over the run's whole history (resumes on other world sizes included)
    num_images: int
    best: dict                 # the best verification figures so far
    config: dict               # Config.to_dict(): network, seed, loss, the max_update asked for ...
    # the margin's running statistics after this step (Margin.state(); {}: a margin without any)
    margin_state: dict = field(default_factory=dict)
    # the backbone trains from this many samples seen on (--freeze_backbone_steps at the first run's global batch)
    freeze_until_samples: int = 0


# field: (type, smallest value) of what a resume relies on; State.read refuses a checkpoint without them
_CHECKED = {
    "step": (int, 0), "world_size": (int, 1), "num_classes": (int, 1), "embedding_size": (int, 1),
    "global_batch": (int, 1), "steps_per_epoch": (int, 1), "max_update": (int, 1), "shards": (list, None),
    "config": (dict, None), "config.network": (str, None),
}


def _field(raw: dict, name: str):
    """The value of field `name` ('config.network': a field of a field), None when missing."""
    value = raw
    for key in name.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


@dataclass(frozen=True)
class State:
    """A checkpoint's state.json, typed: the run's part (RunState) and the checkpoint's own.

    Fields older formats did not write carry their meaning when missing, here and nowhere else:
    samples_seen (step x global_batch), subcenters (1), num_images, margin_state and
    freeze_until_samples (None: not recorded), best ({}). Fields checked only by their readers
    (margin_state by resume, which names it when damaged) are kept as written.
    """
    format: int
    step: int
    world_size: int
    num_classes: int
    embedding_size: int
    shards: list               # rank r's [first class, count], contiguous from class 0
    steps_per_epoch: int
    global_batch: int
    max_update: int
    samples_seen: int
    config: dict               # the configuration of the run that wrote it (Config.to_dict())
    sequence: int = 0          # 0: a format-1 checkpoint (its folder has no sequence)
    subcenters: int = 1
    num_images: "int | None" = None
    best: dict = field(default_factory=dict)
    margin_state: object = None
    freeze_until_samples: "int | None" = None
    saved_at: str = ""
    # sets 1, 2, ... of a run of several sets (format 4): [{"num_classes": n, "shards": [[first, count], ...]}]
    # each, with set 0's embedding_size and subcenters; set 0's head is num_classes and shards above
    extra_heads: list = field(default_factory=list)

    def heads(self) -> "list[tuple[int, list]]":
        """(num_classes, shards) of every set's head, set 0 first."""
        return [(self.num_classes, self.shards)] + [(h["num_classes"], h["shards"]) for h in self.extra_heads]

    @property
    def network(self) -> str:
        """The network the checkpoint's run trained (a name, or a symbol file's path)."""
        return self.config["network"]

    @classmethod
    def of(cls, run: RunState, **checkpoint_fields) -> "State":
        """The state.json of a checkpoint being saved: the run's part, then the checkpoint's own."""
        several = bool(checkpoint_fields.get("extra_heads"))
        return cls(format=SETS_FORMAT if several else FORMAT_VERSION, **asdict(run), **checkpoint_fields)

    def write(self, folder: str) -> None:
        write_json(os.path.join(folder, STATE_FILE), asdict(self))

    @classmethod
    def read(cls, folder: str) -> "State":
        """state.json of the checkpoint in `folder`, its fields checked: a message names a missing or wrong one.

        Checkpoints of formats 1 and 2 hold fields nobody reads (network and seed beside the configuration's,
        epoch, next_lr, data): they are left out.
        """
        file = os.path.join(folder, STATE_FILE)
        try:
            raw = read_json(file, STATE_BYTES)         # a regular file of bounded size and nesting
        except (OSError, ValueError) as error:
            raise CheckpointError(f"{folder}: cannot read state.json: {error}") from None
        if not isinstance(raw, dict):
            raise CheckpointError(f"{file}: not a JSON object")
        if raw.get("format") not in READABLE_FORMATS:
            raise CheckpointError(f"{folder}: checkpoint format {quoted(raw.get('format'))}, this version reads "
                                  f"{', '.join(map(str, READABLE_FORMATS))}")
        checked = dict(_CHECKED, **({"samples_seen": (int, 0)} if "samples_seen" in raw else {}))
        for name, (kind, least) in checked.items():
            value = _field(raw, name)
            if not isinstance(value, kind) or isinstance(value, bool) or (least is not None and value < least):
                wanted = kind.__name__ + (f" >= {least}" if least is not None else "")
                raise CheckpointError(f"{file}: field {name!r} is {quoted(value)} (missing or damaged; "
                                      f"expected {wanted})")
        _check_shards(file, "shards", raw["shards"], raw["num_classes"], raw["world_size"])
        extra = raw.get("extra_heads", [])
        if not isinstance(extra, list) or (extra and raw["format"] != SETS_FORMAT):
            raise CheckpointError(f"{file}: field 'extra_heads' is {quoted(extra)} (a list of the heads of sets "
                                  f"1, 2, ..., in format {SETS_FORMAT} only)")
        for number, head in enumerate(extra, start=1):
            count = head.get("num_classes") if isinstance(head, dict) else None
            if type(count) is not int or count < 1:
                raise CheckpointError(f"{file}: extra_heads[{number - 1}] (set {number}) has num_classes "
                                      f"{quoted(count)} (missing or damaged; expected int >= 1)")
            _check_shards(file, f"extra_heads[{number - 1}].shards", head.get("shards"), count, raw["world_size"])
        known = {f.name for f in fields(cls)}
        values = {name: value for name, value in raw.items() if name in known}
        values.setdefault("samples_seen", raw["step"] * raw["global_batch"])
        values.setdefault("best", {})
        return cls(**values)


def _check_shards(file: str, name: str, shards, num_classes: int, world_size: int) -> None:
    """Refuse a head's shards that do not split its classes over the ranks (a resume would leave rows unset)."""
    if (not isinstance(shards, list) or len(shards) != world_size
            or not all(isinstance(s, list) and len(s) == 2 and all(type(v) is int and v >= 0 for v in s)
                       for s in shards)
            or not tiles(shards, num_classes)):
        raise CheckpointError(f"{file}: field {name!r} does not split {num_classes} classes over "
                              f"{world_size} ranks (rank r's [first class, count], contiguous from 0, "
                              f"none empty): {quoted(shards)}")


def tiles(shards: "list[list[int]]", num_classes: int) -> bool:
    """Whether shards[r] = [class_start, num_local] of rank r cover classes 0 .. num_classes - 1 once each, in
    rank order and none empty, as shard_range gives them: a resume fills each rank's rows from them, and a
    gap or an overlap would leave rows unset."""
    start = 0
    for class_start, count in shards:
        if class_start != start or count < 1:
            return False
        start += count
    return start == num_classes


@dataclass(frozen=True)
class Saved:
    """A complete checkpoint under OUTPUT/checkpoints, and what it holds."""
    path: str
    sequence: int               # 1, 2, ... in the order written (0 for format-1 folders)
    step: int                   # the step label of the run that wrote it
    samples_seen: "int | None"  # samples trained over the run's whole history (None: state.json unreadable)
    world_size: "int | None"

    def describe(self) -> str:
        held = (f"{self.samples_seen:,} samples seen, step {self.step} on {self.world_size} rank(s)"
                if self.samples_seen is not None else f"step {self.step}, state.json unreadable")
        return f"{os.path.basename(self.path)} ({held})"


def _saved(root: str, name: str) -> "Saved | None":
    """The checkpoint in folder `name` of root, or None if it is not a complete one."""
    match, legacy = _FOLDER.match(name), _LEGACY_FOLDER.match(name)
    path = os.path.join(root, name)
    if not (match or legacy) or not is_checkpoint(path):
        return None
    sequence, step = (int(match.group(1)), int(match.group(2))) if match else (0, int(legacy.group(1)))
    try:
        state = State.read(path)
        samples, world = state.samples_seen, state.world_size
    except CheckpointError:
        samples, world = None, None
    return Saved(path, sequence, step, samples, world)


def list_checkpoints(root: str) -> "list[Saved]":
    """The complete checkpoints under root, oldest first: by the order they were written.

    Format-1 folders (step-NNNNNNNN, no sequence) come before every newer one, in
    the order of the samples they hold. Never by step label alone.
    """
    if not os.path.isdir(root):
        return []
    found = [saved for saved in (_saved(root, name) for name in os.listdir(root)) if saved is not None]
    return sorted(found, key=lambda c: (c.sequence, c.samples_seen if c.samples_seen is not None else -1, c.step))


def latest(root: str) -> "Saved | None":
    """The checkpoint written last under root, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def locate(root: str, which: str) -> str:
    """The checkpoint folder for --resume: 'latest', a step label, a folder name under root, or a folder path."""
    found = list_checkpoints(root)
    if which == "latest":
        if not found:
            raise CheckpointError(f"--resume latest: no complete checkpoint in {root}")
        return found[-1].path
    if which.isdigit():
        same = [c for c in found if c.step == int(which)]
        if len(same) == 1:
            return same[0].path
        if not same:
            raise CheckpointError(f"--resume {which}: no complete checkpoint at step {int(which)} in {root} "
                                  f"(complete: {', '.join(c.describe() for c in found) or 'none'})")
        raise CheckpointError(f"--resume {which}: {len(same)} checkpoints in {root} are labelled step {int(which)} "
                              f"(the step size changed between them): {'; '.join(c.describe() for c in same)}. "
                              f"Name one: --resume {same[-1].path}")
    for candidate in (which, os.path.join(root, which)):
        if is_checkpoint(candidate):
            return candidate
    raise CheckpointError(f"--resume {which}: not a complete checkpoint folder (no state.json)")


def of_run(run: str) -> str:
    """The checkpoint a command's RUN argument names: a checkpoint folder itself, or a run folder's latest."""
    if is_checkpoint(run):
        return run
    newest = latest(RunFolder(run).checkpoints)
    if newest is None:
        raise CheckpointError(f"{run}: neither a checkpoint folder (state.json) nor a run folder with checkpoints/")
    return newest.path


def head_mismatches(state: State, num_classes: int, embedding_size: int, subcenters: int = 1) -> "list[str]":
    """How a checkpoint's memory bank differs from this run's head (classes, width, sub-centers), one
    phrase each; [] when it fits."""
    problems = []
    if state.subcenters != subcenters:
        problems.append(f"its memory bank has {quoted(state.subcenters)} center(s) per class, this run {subcenters} "
                        "(--loss subcenter-arcface and subcenter_k)")
    if state.num_classes != num_classes:
        problems.append(f"it has {state.num_classes} classes, the configuration {num_classes} (num_classes)")
    if state.embedding_size != embedding_size:
        problems.append(f"its embedding size is {state.embedding_size}, the configuration's {embedding_size} "
                        "(embedding_size)")
    return problems


def check_params(params: dict, expected: dict, path: str, network: str) -> None:
    """Same parameter names and shapes as the configured network, or a message naming the first differences."""
    missing = sorted(set(expected) - set(params))
    extra = sorted(set(params) - set(expected))
    shapes = [f"{name}: {tuple(params[name].shape)} in the checkpoint, {tuple(expected[name])} in {network}"
              for name in sorted(set(params) & set(expected)) if tuple(params[name].shape) != tuple(expected[name])]
    problems = []
    if missing:
        problems.append(f"missing {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if extra:
        problems.append(f"unexpected {', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    if shapes:
        problems.append("shape mismatch " + "; ".join(shapes[:5]))
    if problems:
        raise CheckpointError(f"checkpoint {path}: backbone parameters do not fit network {network}: "
                              + "; ".join(problems))


def resume_position(state: State, steps_per_epoch: int, global_batch: int) -> "tuple[int, int]":
    """(step, epoch) to continue from: the saved step, or on another global batch the same samples seen.

    The epoch is kept; within it, the steps done are converted by global batch size.
    """
    if state.global_batch == global_batch and state.steps_per_epoch == steps_per_epoch:
        return state.step, state.step // steps_per_epoch
    epoch = state.step // state.steps_per_epoch
    within = (state.step % state.steps_per_epoch) * state.global_batch // global_batch
    return epoch * steps_per_epoch + min(within, steps_per_epoch - 1), epoch
