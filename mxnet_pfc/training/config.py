"""The training configuration: defaults, presets, command-line overrides, checks.

Precedence, lowest first: DEFAULTS, the recipe (RECIPES), the --dataset preset,
the --network preset, the --loss preset, then every `--FIELD VALUE` given. The
result is a frozen `Config`, printed at start and written to OUTPUT/config.json.

The recipe. Real data trains with the field's standard recipe from a named
source (RECIPES: arcface_torch's configs; --recipe picks another): your own set
(--rec or --images) gets arcface_torch-ms1mv3_r50 (iResNet-50, 512-d, ArcFace
s=64 m=0.5, 20 epochs, linear decay, lr 0.1 per global batch 1024), a named set
(--dataset emore, glint360k, webface) its own. The CPU-sized toy settings
(synthetic-toy) are the synthetic default's alone. The start-up log says in one
line which recipe is in force and where every other value came from.

Your own data. A --dataset preset describes its own set (DATA_FIELDS: rec,
images, num_classes, num_images, val_targets and the synthetic_* fields).
Giving --rec (a RecordIO set) or --images (a folder ROOT/<identity>/<image>)
drops all of those from the preset: your set is read as it is, never generated
or written to; num_classes is read from the set (its `property` file, header
record, or the number of identity folders) unless you give it, and a given one
may not be below the count the set states; val_targets is 'auto', every *.bin in the
set's folder (lfw.bin, cfp_fp.bin, agedb_30.bin as InsightFace ships them),
unless you name them (--val_targets '' for none).
A synthetic set is generated only when synthetic_identities > 0 (the default
preset's own set, or asked for by name), and only into a folder that is empty
or that the generator made.

Batch and learning rate: batch_size is per rank, `lr` is stated for a global
batch of lr_base_batch samples and scales linearly to the real one, N samples
over all ranks: effective lr = lr x N / lr_base_batch (docs/DESIGN.md 4.1; why
one step is one SGD step on the global batch: 4.2).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import logging
import math
import os
import textwrap
from dataclasses import dataclass, fields

import symbols
from mxnet_pfc.data.faces import FACE_SIZE, inside
from mxnet_pfc.data.iterators import DataError, TrainingSet, count_classes, stated_classes, training_sets
from mxnet_pfc.head import margin
from mxnet_pfc.runtime.errors import ConfigError, quoted
from mxnet_pfc.runtime.files import write_json
from mxnet_pfc.runtime.run_folder import split_prefix

log = logging.getLogger(__name__)

# Every configuration field of a margin parameter (margin_s, margin_m1..m3, adaface_*, elastic_*, magface_*,
# curricular_*, subcenter_k): its type, default and help are stated by head/margin.py's margin classes, the one
# place a loss is added. A loss's own fields are its --loss preset (LOSSES); the others may not be given with it.
MARGIN_FIELDS = margin.config_fields()


@dataclass(frozen=True)
class Config:
    """The run's settings; FIELD_HELP (what --help prints) says what each field means."""

    # --help groups the fields by SECTIONS (below); config.json keeps this order.
    dataset: str = "synthetic"
    recipe: str = ""        # '' = chosen from the data (RECIPE_FOR_OWN_DATA, or the --dataset preset's)
    rec: str = ""
    images: str = ""
    extra_sets: tuple = ()      # sets 2, 3, ... as "rec:PATH" / "images:PATH" (--rec, --images given again)
    num_classes: int = 0
    extra_classes: tuple = ()   # their class counts, read from them (as num_classes)
    set_shares: tuple = ()
    num_images: int = 0
    val_targets: tuple = ()
    ijb_targets: tuple = ()
    image_size: int = FACE_SIZE
    synthetic_identities: int = 0
    synthetic_images_per_identity: int = 20
    synthetic_val_pairs: int = 1000
    decode_threads: int = 2
    network: str = "r50"
    network_output: str = ""
    embedding_size: int = 512
    dropout: float = 0.0
    fp16: bool = False
    pretrained: str = ""
    teacher: str = ""
    distill_weight: float = 1.0
    loss: str = "arcface"
    set_weights: tuple = ()
    # margin_s .. subcenter_k (MARGIN_FIELDS), in this place and order: each added as a line `NAME: TYPE = DEFAULT`
    # would add it, to the class body's annotations and values (what @dataclass reads)
    __annotations__.update({name: f.type for name, f in MARGIN_FIELDS.items()})
    locals().update({name: f.default for name, f in MARGIN_FIELDS.items()})
    sample_rate: float = 1.0
    interclass_filtering_threshold: float = 0.0
    init_centers: str = "random"          # INIT_CENTERS or a folder
    batch_size: int = 128
    grad_accum: int = 1
    lr: float = 0.1
    lr_base_batch: int = 512
    momentum: float = 0.9
    weight_decay: float = 5e-4
    lr_schedule: str = "multistep"
    num_epoch: float = 20.0
    decay_epochs: tuple = (10.0, 16.0, 18.0)
    lr_factor: float = 0.1
    warmup_epochs: float = 0.0
    poly_power: float = 2.0
    max_update: int = 0
    freeze_backbone_steps: int = 0
    output: str = ""
    context: str = "auto"
    seed: int = 0
    frequent: int = 50
    verbose: int = 2000
    val_batch_size: int = 64
    tensorboard: bool = True
    val_at_start: bool = False
    save_interval: int = 2000
    keep_checkpoints: int = 3
    stall_timeout: float = 1200.0      # enforced by runtime/watchdog.py
    resume: str = ""
    start_over: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# --recipe: the standard recipes, one place for their numbers, each from a named source (RECIPE_SOURCES).
# arcface_torch states lr per GPU batch on 8 GPUs: lr 0.1 for 128 per GPU is 0.1 per global batch 1024
# (lr_base_batch), scaled linearly to yours (module docstring). Fields a recipe leaves out keep DEFAULTS.
ARCFACE_TORCH = "insightface recognition/arcface_torch/configs"
ARCFACE_TORCH_R50 = dict(
    # configs/base.py and ms1mv3_r50.py: network r50, embedding_size 512, sample_rate 1.0, momentum 0.9,
    # weight_decay 5e-4, batch_size 128 per GPU with lr 0.1 (8 GPUs: global 1024), num_epoch 20,
    # warmup_epoch 0, verbose 2000, frequent 10; margin_list (1.0, 0.5, 0.0) with s=64 (train_v2.py) is
    # ArcFace m=0.5; PolynomialLRWarmup (lr_scheduler.py) at its default power=1.0 (train_v2.py passes
    # none): linear decay to 0. Their fp16 = True is left out: float16 here is GPU-only (--fp16 true).
    network="r50", embedding_size=512, loss="arcface", sample_rate=1.0, momentum=0.9, weight_decay=5e-4,
    batch_size=128, lr=0.1, lr_base_batch=1024, num_epoch=20, warmup_epochs=0, lr_schedule="poly",
    poly_power=1.0, verbose=2000, frequent=10)
RECIPES = {
    "arcface_torch-ms1mv3_r50": ARCFACE_TORCH_R50,
    "arcface_torch-ms1mv2_r50": ARCFACE_TORCH_R50,     # configs/ms1mv2_r50.py: the same numbers
    # configs/glint360k_r50.py: margin_list (1.0, 0.0, 0.4), CosFace m=0.4 (s=64), and weight_decay 1e-4
    "arcface_torch-glint360k_r50": dict(ARCFACE_TORCH_R50, loss="cosface", weight_decay=1e-4),
    # this project's CPU-sized run of the synthetic default (docs/training.md): minutes on 2 CPU ranks
    "synthetic-toy": dict(network="r18-lite", loss="cosface-small", batch_size=32, lr=0.05, lr_base_batch=64,
                          num_epoch=1, lr_schedule="poly", warmup_epochs=0.1, frequent=25, verbose=125,
                          save_interval=125),
}
RECIPE_SOURCES = {
    "arcface_torch-ms1mv3_r50": f"{ARCFACE_TORCH}/ms1mv3_r50.py",
    "arcface_torch-ms1mv2_r50": f"{ARCFACE_TORCH}/ms1mv2_r50.py",
    "arcface_torch-glint360k_r50": f"{ARCFACE_TORCH}/glint360k_r50.py",
    "synthetic-toy": "this project's CPU-sized synthetic run, docs/training.md",
}
RECIPE_FOR_OWN_DATA = "arcface_torch-ms1mv3_r50"     # --rec or --images with no named set's recipe
TOY_RECIPE = "synthetic-toy"

DATASETS = {
    # InsightFace's packs as users have them: data/NAME/train.rec (+ .idx, property, *.bin).
    # faces_emore is MS1MV2 (arcface_torch's ms1mv2 configs read it)
    "emore": dict(rec="data/faces_emore/train.rec", num_classes=85742,
                  val_targets=("data/faces_emore/lfw.bin", "data/faces_emore/cfp_fp.bin",
                               "data/faces_emore/agedb_30.bin"),
                  recipe="arcface_torch-ms1mv2_r50"),
    "glint360k": dict(rec="data/glint360k/train.rec", num_classes=360232,
                      val_targets=("data/glint360k/lfw.bin", "data/glint360k/cfp_fp.bin",
                                   "data/glint360k/agedb_30.bin"),
                      recipe="arcface_torch-glint360k_r50"),
    # CASIA-WebFace: arcface_torch has no config of it (its wf* configs are WebFace4M-42M); the ms1mv3 one
    "webface": dict(rec="data/faces_webface_112x112/train.rec", num_classes=10572,
                    val_targets=("data/faces_webface_112x112/lfw.bin",),
                    recipe="arcface_torch-ms1mv3_r50"),
    # generated on first use; identities of val.bin are never seen in training
    "synthetic": dict(rec="output/data/synthetic/train.rec", num_classes=500,
                      val_targets=("output/data/synthetic/val.bin",), synthetic_identities=500,
                      synthetic_images_per_identity=32, recipe=TOY_RECIPE),
    # dummy data, no I/O: step time and memory at large identity counts
    "speed-1m": dict(rec="", num_classes=1_000_000, num_images=100_000, val_targets=(), max_update=200, frequent=10),
    "speed-10m": dict(rec="", num_classes=10_000_000, num_images=100_000, val_targets=(), max_update=200,
                      frequent=10, sample_rate=0.1),
    "speed-100m": dict(rec="", num_classes=100_000_000, num_images=100_000, val_targets=(), max_update=200,
                       frequent=10, sample_rate=0.1),
}
# --network: every network of the symbols registry, with the fields it sets beyond its name.
NETWORK_FIELDS = {
    # the CPU-sized iResNet-18 (quarter width, stride-4 stem) of the synthetic default and the tests
    "r18-lite": dict(embedding_size=128),
}
NETWORKS = {name: dict(network=name, **NETWORK_FIELDS.get(name, {})) for name in symbols.NETWORKS}
# --loss: the losses of margin.LOSSES, their parameters as configuration fields (margin.config_field).
LOSSES = {name: dict(loss=name, **{margin.config_field(kind, param): margin.preset_params(name)[param]
                                   for param in margin.config_params(kind)})
          for name, (kind, _) in margin.LOSSES.items()}
PRESET_FIELDS = {"recipe": RECIPES, "dataset": DATASETS, "network": NETWORKS, "loss": LOSSES}
# What a --dataset preset says about its own data set. Naming your own set with
# --rec or --images drops all of them: its class count, verification pairs and generation
# settings describe the preset's set, not yours (the rest of the preset applies).
DATA_FIELDS = ("rec", "images", "extra_sets", "num_classes", "extra_classes", "num_images", "val_targets",
               "synthetic_identities", "synthetic_images_per_identity", "synthetic_val_pairs")

# The groups of --help, in order: every field of Config in exactly one (checked below).
SECTIONS = {
    "data": ("dataset", "recipe", "rec", "images", "extra_sets", "num_classes", "extra_classes", "set_shares",
             "num_images", "image_size",
             "synthetic_identities", "synthetic_images_per_identity", "decode_threads"),
    "backbone": ("network", "network_output", "embedding_size", "dropout", "fp16", "pretrained", "teacher",
                 "distill_weight"),
    "head and loss": ("loss", "set_weights", *MARGIN_FIELDS, "sample_rate", "interclass_filtering_threshold",
                      "init_centers"),
    "optimisation (both optimizers)": ("batch_size", "grad_accum", "lr", "lr_base_batch", "momentum",
                                       "weight_decay", "lr_schedule", "num_epoch", "decay_epochs", "lr_factor",
                                       "warmup_epochs", "poly_power", "max_update", "freeze_backbone_steps"),
    "run and checkpoints": ("output", "seed", "frequent", "tensorboard", "save_interval", "keep_checkpoints",
                            "resume", "start_over"),
    "evaluation": ("val_targets", "ijb_targets", "synthetic_val_pairs", "verbose", "val_batch_size",
                   "val_at_start"),
    "distributed": ("context", "stall_timeout"),
}
assert sorted(name for names in SECTIONS.values() for name in names) == sorted(f.name for f in fields(Config))



def _own_fields_of_losses() -> str:
    """'margin_m1, margin_m2, margin_m3 for arcface, cosface, ...; adaface_m, ... for adaface; ...': each margin
    class's fields but margin_s, and its losses."""
    losses_of: "dict[tuple, list[str]]" = {}
    for name, preset in LOSSES.items():
        losses_of.setdefault(tuple(f for f in preset if f not in ("loss", "margin_s")), []).append(name)
    return "; ".join(f"{', '.join(own)} for {', '.join(names)}" for own, names in losses_of.items())


# One sentence per field for --help: what it is and its unit (argparse adds the default).
FIELD_HELP = {
    "dataset": "Preset of a data set: its files, class count, verification sets and recipe (the table in "
               "docs/training.md).",
    "recipe": "The standard settings the run starts from (network, loss, batch, learning rate and schedule): "
              "a name of RECIPES, each from a named source; '' chooses from the data: the --dataset preset's, "
              "arcface_torch-ms1mv3_r50 for your own --rec/--images. Presets and options given override it.",
    "rec": "Path of train.rec of an InsightFace RecordIO set (train.idx beside it); '' trains on random "
           "tensors (speed runs). Giving it drops the preset's data fields. Given more than once (and mixed "
           "with --images), each set trains its own head under one backbone (docs/training.md, several sets).",
    "images": "Folder ROOT/<identity>/<image> to train on without packing (sorted folder names are class ids "
              "0..C-1); the file list is cached in OUTPUT/images-index.json. Repeatable, as --rec.",
    "extra_sets": "The sets after the first, in order, as rec:PATH or images:PATH, comma-separated: what giving "
                  "--rec or --images more than once fills in (config.json records it).",
    "extra_classes": "Class counts of the sets after the first, comma-separated; '' reads each from its set "
                     "(as num_classes).",
    "set_shares": "Several sets: each set's share of every batch, comma-separated (e.g. 3,1); '' in proportion "
                  "to the sets' image counts. Every rank's batch holds the stated rows of each set, every step.",
    "set_weights": "Several sets: each set's loss weight, comma-separated; '' weights each 1. The loss is the "
                   "weighted sum of each set's mean Partial FC loss.",
    "num_classes": "Number of identities (classes); 0 reads it from the set (property file, header record or "
                   "folder count). Given, it may not be below the count the set states.",
    "num_images": "Images per epoch of the dummy iterator (--rec ''); a real set's count is read from it.",
    "val_targets": "Verification pair sets (.bin), comma-separated; 'auto' (the default with --rec/--images) "
                   "takes every *.bin beside your set; '' none.",
    "ijb_targets": "IJB-B/IJB-C-layout test sets verified with the .bin sets (rank 0, every --verbose steps), "
                   "comma-separated: ROOT (read as IJBC) or ROOT:IJBB; logs exact TAR at FAR 1e-4 and 1e-3 and "
                   "the 1:N mean top-1 (python -m mxnet_pfc.ijb gives the whole report).",
    "image_size": "Side of the square aligned face crops, in pixels (the backbones take 112).",
    "synthetic_identities": "Identities of a synthetic set generated at --rec if missing (only into a folder that "
                            "is empty or that the generator made); 0 generates nothing.",
    "synthetic_images_per_identity": "Images per identity of a generated synthetic set.",
    "synthetic_val_pairs": "Verification pairs in the generated val.bin (identities never seen in training).",
    "decode_threads": "Threads per rank that read and decode images, a few batches ahead.",
    "network": "Backbone: a name of symbols.NETWORKS, or the path of an MXNet symbol file (*-symbol.json: any "
               "graph from raw 3 x 112 x 112 RGB `data` to the embedding; its width sets embedding_size).",
    "network_output": "With a symbol file: the graph's output that is the embedding (e.g. fc1_output, as "
                      "InsightFace names it); '' takes its only output, or fc1_output when it has several.",
    "pretrained": "Start the backbone from MXNet parameters, matched by name and shape: PREFIX[,EPOCH] "
                  "(PREFIX-EPOCH.params, InsightFace's model-0000.params layout), a checkpoint folder or a run's "
                  "output folder; '' initialises at random. Ignored when resuming.",
    "embedding_size": "Length of the face embedding (the backbone's output features); with a symbol file as "
                      "--network, 0 reads it from the graph.",
    "dropout": "Dropout probability before the embedding's fully connected layer, in [0, 1).",
    "fp16": "Run the backbone body in float16 (GPU only), with float32 master weights.",
    "loss": "The loss (docs/losses.md); sets margin_s and the fields of its own parameters "
            f"({_own_fields_of_losses()}), each at its published value.",
    "sample_rate": "Share of each rank's class centers in a step's softmax, in (0, 1]; positives always included.",
    "interclass_filtering_threshold": "Inter-class filtering (Partial FC v2, for identities split across labels): "
                                      "a negative class whose cosine with a sample exceeds this counts as cosine 0 "
                                      "and gets no gradient; 0 = off, 0.4 is the published choice.",
    "teacher": "Distil from this frozen model (PREFIX[,EPOCH], a checkpoint or a run's output folder: any MXNet "
               "model embedding the same 3 x 112 x 112 faces): the loss adds distill_weight x mean(1 - cos(student, "
               "teacher)), through a learned projection when the widths differ; '' none.",
    "distill_weight": "Weight of the distillation term (with --teacher).",
    "init_centers": "Starting class centers: random; imprint (each class's normalised mean embedding of its "
                    "training images under the starting backbone, one pass over the set before step 1); or a "
                    "FOLDER holding centers and momentum: a checkpoint of this project (any world size) or an "
                    "output folder of InsightFace's MXNet Partial FC (RANK_centers.param and "
                    "RANK_centers_mom.param). Several sets: one for all (a FOLDER then holds a run of as many "
                    "sets), or one per set, comma-separated (a FOLDER: a run of that one set). Ignored when "
                    "resuming.",
    "batch_size": "Images per rank per micro-batch; a step trains on batch_size x ranks x grad_accum images.",
    "grad_accum": "Micro-batches per optimizer step (gradient accumulation): gradients add up over them and the "
                  "backbone and centers update once; steps, epochs and the schedule count optimizer steps.",
    "lr": "Peak learning rate for a global batch of lr_base_batch images (scaled linearly to yours).",
    "lr_base_batch": "Global batch size, in images, that lr is stated for.",
    "momentum": "SGD momentum of the backbone and the class centers.",
    "weight_decay": "L2 weight decay of the backbone and the class centers (none on biases and BN betas).",
    "lr_schedule": "Learning-rate decay after warm-up: multistep or poly.",
    "num_epoch": "Length of the run in epochs (of num_images // global batch steps), unless max_update is set.",
    "decay_epochs": "multistep: epochs at which the learning rate is multiplied by lr_factor, comma-separated.",
    "lr_factor": "multistep: factor applied at each decay epoch, in (0, 1].",
    "warmup_epochs": "Epochs of linear warm-up from 0 to the peak learning rate.",
    "poly_power": "poly: the learning rate is peak x (1 - progress)^poly_power.",
    "max_update": "Length of the run in steps; 0 uses num_epoch.",
    "freeze_backbone_steps": "The first this many steps train only the class centers (the backbone does not "
                             "move: warm-up of a new head on a pretrained backbone); the schedule counts them.",
    "output": "Output folder for logs, metrics, checkpoints and the model; default output/DATA_NETWORK_LOSS, "
              "DATA the --dataset name or your set's folder name (data/mine/train.rec or --images mine/: mine).",
    "context": "Device: auto (GPU local_rank when MXNet sees GPUs, else CPU), cpu or gpu.",
    "seed": "Seed of the epoch order, mirroring, initialisation and sampling.",
    "frequent": "Log progress every this many steps.",
    "verbose": "Run verification every this many steps (and at the end).",
    "val_batch_size": "Images per batch during verification.",
    "tensorboard": "Write TensorBoard events to OUTPUT/tensorboard.",
    "val_at_start": "Also verify the initial model before the first step (a baseline).",
    "save_interval": "Checkpoint every this many steps (and at the end); 0 only at the end.",
    "keep_checkpoints": "Number of newest checkpoints kept in OUTPUT/checkpoints.",
    "stall_timeout": ("Seconds a rank may make no progress (no step, no collective, setup, verification or a "
                      "checkpoint not moving) before it stops the job, naming the stuck rank and where it is, "
                      "with every thread's stack in OUTPUT/logs/stacks-rankR.txt; a warning at a quarter of it. "
                      "Above the slowest verification or checkpoint save of a real run; 0 turns the watchdog off."),
    "resume": "Continue a run: latest, a step number, or a checkpoint folder; '' starts afresh.",
    **{name: f.help for name, f in MARGIN_FIELDS.items()},
    "start_over": ("Start afresh in an --output that holds an earlier run's checkpoints: its files are moved to "
                   "OUTPUT/earlier-runs/TIME/ first (nothing is deleted). Without it such a folder is refused "
                   "unless --resume is given."),
}


AUTO_VAL = "auto"      # val_targets: every *.bin in the folder of your own set


def _parse_value(kind, text: str):
    if kind is bool:
        lowered = text.lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no"):
            raise argparse.ArgumentTypeError(f"expected true or false, got {quoted(text)}")
        return lowered in ("1", "true", "yes")
    if kind is tuple:
        return tuple(item for item in text.split(",") if item)
    return kind(text)


def _field_type(f: dataclasses.Field):
    return {"int": int, "float": float, "str": str, "bool": bool, "tuple": tuple}[f.type]


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that never breaks a name at its hyphen (cosface-small, elasticface-arc+ stay whole)."""

    def _split_lines(self, text: str, width: int) -> "list[str]":
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


class _SetOption(argparse.Action):
    """--rec and --images, each repeatable: every set given, in order, in namespace.training_sets; the
    field keeps the first of its kind (parse_args makes the first set set 0 and the others extra_sets)."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.training_sets = [*getattr(namespace, "training_sets", []), (self.dest, value)]
        if getattr(namespace, self.dest) is None:
            setattr(namespace, self.dest, value)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mxnet_pfc.train",
        description="Train a face-recognition backbone with Partial FC on one or more ranks. "
                    "Launch several ranks with `horovodrun -np N -H host:slots bash config.sh [ARGS]` "
                    "or `bash run.sh [ARGS]`.",
        epilog=__doc__.split("\n\n", 1)[1], formatter_class=_HelpFormatter)
    default_run = make_config({}).to_dict()
    PRESET_DEFAULTS = {f.name: default_run[f.name] for f in fields(Config)
                       if default_run[f.name] != f.default and f.name != "output"}
    known = {f.name: f for f in fields(Config)}
    for section, names in SECTIONS.items():
        group = parser.add_argument_group(section)
        for f in (known[name] for name in names):
            kind = _field_type(f)
            choices = PRESET_FIELDS.get(f.name)
            help_text = FIELD_HELP[f.name] + (f" One of {', '.join(choices)}." if choices else "")
            help_text += f" Default: {f.default!r}"
            if f.name in PRESET_DEFAULTS:
                help_text += f" ({PRESET_DEFAULTS[f.name]!r} with the default presets)"
            help_text += "."
            group.add_argument(f"--{f.name}", type=lambda text, kind=kind: _parse_value(kind, text),
                               default=None, metavar=kind.__name__.upper(), help=help_text,
                               **({"action": _SetOption} if f.name in ("rec", "images") else {}))
    parser.set_defaults(training_sets=[])
    return parser


def make_config(overrides: "dict | None" = None) -> Config:
    """Defaults, then the presets named in `overrides` (or the default ones), then `overrides`."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    known = {f.name: f for f in fields(Config)}
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ConfigError(f"unknown configuration field(s): {', '.join(unknown)}")
    values = {name: f.default for name, f in known.items()}
    values["recipe"] = recipe_for(overrides)            # a recipe chooses the network and loss
    for preset_field, table in PRESET_FIELDS.items():
        name = values["recipe"] if preset_field == "recipe" else overrides.get(preset_field, values[preset_field])
        if preset_field == "recipe" and not name:        # no recipe (the speed presets): DEFAULTS
            continue
        if preset_field == "network" and symbols.is_symbol_file(name):   # its width is read at start-up
            table = {name: dict(network=name, embedding_size=0)}
        if name not in table:
            raise ConfigError(f"unknown {preset_field} {quoted(name)}; choose one of: {', '.join(table)}")
        preset = {key: value for key, value in table[name].items() if key != "recipe"}   # chosen above
        if preset_field == "dataset" and ("rec" in overrides or "images" in overrides):
            preset = {key: value for key, value in preset.items() if key not in DATA_FIELDS}
        values.update(preset)
    for name, value in overrides.items():
        kind = _field_type(known[name])
        if kind is tuple and isinstance(value, str):
            value = _parse_value(tuple, value)
        values[name] = tuple(value) if kind is tuple else value
    loss_fields = set(LOSSES[values["loss"]])
    foreign = sorted(name for name, value in overrides.items()   # a saved config.json holds every field: at defaults
                     if name in MARGIN_FIELDS and name not in loss_fields and value != known[name].default)
    if foreign:
        raise ConfigError(f"{', '.join(foreign)}: not a parameter of --loss {values['loss']} (its own are "
                          f"{', '.join(sorted(loss_fields - {'loss'}))})")
    if values["synthetic_identities"] and not values["num_classes"]:     # a generated set has one class per identity
        values["num_classes"] = values["synthetic_identities"]
    for name, kind, example in (("decay_epochs", float, "epochs as numbers, comma-separated (e.g. 8,14)"),
                                ("set_weights", float, "one number per set, comma-separated (e.g. 1,0.5)"),
                                ("set_shares", float, "one number per set, comma-separated (e.g. 3,1)"),
                                ("extra_classes", int, "one class count per extra set, comma-separated")):
        try:
            values[name] = tuple(kind(v) for v in values[name])
        except (TypeError, ValueError):
            raise ConfigError(f"{name} = {','.join(map(str, values[name]))}: expected {example}") from None
    values["extra_sets"] = tuple(str(v) for v in values["extra_sets"])
    values["val_targets"] = tuple(str(v) for v in values["val_targets"])
    if (values["rec"] or values["images"]) and "val_targets" not in overrides and \
            ("rec" in overrides or "images" in overrides):
        values["val_targets"] = (AUTO_VAL,)       # your own set: the .bin files beside it (run_length finds them)
    if not values["output"]:
        network = values["network"]
        if symbols.is_symbol_file(network):        # zoo/ms1m-r100/model-symbol.json -> ms1m-r100-model
            folder = os.path.basename(os.path.dirname(os.path.abspath(network)))
            network = f"{folder}-{os.path.basename(network)[:-len('.json')].removesuffix('-symbol')}"
        values["output"] = os.path.join("output", f"{data_name(overrides, values)}_{network}_{values['loss']}")
    config = Config(**values)
    validate(config)
    return config


def _own_data(overrides: dict) -> bool:
    """Whether the command line names the user's own set (--rec or --images, not '')."""
    return bool(overrides.get("rec") or overrides.get("images"))


def recipe_for(overrides: dict) -> str:
    """The recipe a run starts from: --recipe, else the --dataset preset's, except that your own set
    (--rec, --images) never trains with the synthetic default's toy settings (nor with no recipe)."""
    if overrides.get("recipe"):
        name = overrides["recipe"]
    else:
        name = DATASETS.get(overrides.get("dataset", Config.dataset), {}).get("recipe", "")
        if _own_data(overrides) and name in ("", TOY_RECIPE):
            name = RECIPE_FOR_OWN_DATA
    if name and name not in RECIPES:
        raise ConfigError(f"unknown recipe {quoted(name)}; choose one of: {', '.join(RECIPES)}")
    return name


def data_name(overrides: dict, values: dict) -> str:
    """The data part of the default output folder: your own set's folder name (data/mine/train.rec or
    --images mine/ -> mine), else the --dataset name."""
    if not _own_data(overrides):
        return values["dataset"]
    try:
        sets = training_sets(values["rec"], values["images"], values["extra_sets"])
    except DataError as error:
        raise ConfigError(f"extra_sets: {error}") from None
    names = [os.path.basename(os.path.normpath(os.path.abspath(spec.path))) if spec.kind == "images"
             else os.path.basename(os.path.dirname(os.path.abspath(spec.path))) or "data" for spec in sets]
    return "+".join(names)      # several sets: a+b


INIT_RANDOM, INIT_IMPRINT = "random", "imprint"     # --init_centers: these, or the path of a folder of centers
INIT_CENTERS = (INIT_RANDOM, INIT_IMPRINT)


def validate(config: Config) -> None:
    def require(condition: bool, name: str, what: str) -> None:
        if not condition:
            raise ConfigError(f"{name} = {quoted(getattr(config, name))}: {what}")

    require(config.network in symbols.NETWORKS or symbols.is_symbol_file(config.network), "network",
            f"not a registered network ({', '.join(symbols.names())}) or a symbol file (*.json)")
    require(not config.network_output or symbols.is_symbol_file(config.network), "network_output",
            "names an output of a symbol file given as --network; the registered networks have one")
    require(not (symbols.is_symbol_file(config.network) and (config.fp16 or config.dropout)), "network",
            "a symbol file is trained as written: no --dropout, no --fp16 (build them into the graph)")
    starts = init_centers_of(config)
    require(all(start not in ("", "none") for start in starts), "init_centers",
            f"one of {', '.join(INIT_CENTERS)}, or a folder holding centers (a checkpoint, or an output folder of "
            "InsightFace's MXNet Partial FC); with several sets one for all or one per set, comma-separated")
    require(INIT_IMPRINT not in starts or config.rec or config.images, "init_centers",
            "imprint embeds the training images: it needs --rec or --images (not dummy data)")
    require(len(starts) in (1, 1 + len(config.extra_sets)), "init_centers",
            f"one starting point for every set, or one per set ({1 + len(config.extra_sets)}), comma-separated")
    inside_output = [name for name in ("pretrained", "init_centers", "teacher", "network")
                     if (name != "network" or symbols.is_symbol_file(config.network))     # not a registered name
                     and any(_is_within(split_prefix(path)[0], config.output)
                             for path in (starts if name == "init_centers" else [getattr(config, name)]))]
    require(not (config.start_over and inside_output), "start_over",
            f"moves {config.output}'s files to its earlier-runs/ before the run reads them, and "
            f"--{', --'.join(inside_output)} names a path inside it: copy what you start from out of "
            "the output folder first")
    require("teacher" not in inside_output, "teacher", f"is inside this run's own output folder {config.output}: a "
            "run cannot be its own teacher")
    require(config.distill_weight > 0 or not config.teacher, "distill_weight",
            "must be positive with --teacher (leave --teacher out to train without one)")
    require(config.distill_weight >= 0, "distill_weight", "must be non-negative")
    require(config.freeze_backbone_steps >= 0, "freeze_backbone_steps", "must be non-negative (0: no freeze)")
    require(not (config.rec and config.images), "images",
            f"--images and --rec ({quoted(config.rec)}) are both set 0: give further sets by repeating "
            "--rec/--images (extra_sets)")
    try:
        sets = training_sets(config.rec, config.images, config.extra_sets)
    except DataError as error:
        raise ConfigError(f"extra_sets: {error}") from None
    several = len(config.extra_sets) > 0
    require(not several or config.rec or config.images, "extra_sets",
            "sets after the first need a first one (--rec or --images)")
    require(len({os.path.realpath(spec.path) for spec in sets}) == len(sets), "extra_sets",
            "names a set twice: each set trains one head")
    require(not config.extra_classes or len(config.extra_classes) == len(config.extra_sets), "extra_classes",
            f"one class count per set after the first ({len(config.extra_sets)}), or '' to read them")
    require(all(n >= 1 for n in config.extra_classes), "extra_classes", "each must be at least 1")
    for name in ("set_weights", "set_shares"):
        values = getattr(config, name)
        require(not values or (several and len(values) == len(sets)), name,
                f"one number per set ({len(sets)} set(s)), given with several sets (repeat --rec/--images)")
        require(all(math.isfinite(v) and v > 0 for v in values), name, "each must be a positive number")
    require(not (several and config.synthetic_identities), "synthetic_identities",
            "generates one set: generate each set first (python -m mxnet_pfc.data.synthetic), then train on them")
    require(config.num_classes >= 1 or ((config.rec or config.images) and config.num_classes == 0), "num_classes",
            "must be at least 1 (0, read from the set, needs --rec or --images)")
    require(AUTO_VAL not in config.val_targets or (len(config.val_targets) == 1 and (config.rec or config.images)),
            "val_targets", f"{AUTO_VAL!r} (the .bin files beside your set) stands alone and needs --rec or --images")
    require(config.embedding_size >= 1 or (config.embedding_size == 0 and symbols.is_symbol_file(config.network)),
            "embedding_size", "must be at least 1 (0, read from the graph, needs a symbol file as --network)")
    require(config.batch_size >= 1, "batch_size", "must be at least 1")
    require(0.0 < config.sample_rate <= 1.0, "sample_rate", "must be in (0, 1]")
    require(0.0 <= config.interclass_filtering_threshold <= 1.0, "interclass_filtering_threshold",
            "must be in [0, 1] (0: off)")
    require(config.grad_accum >= 1, "grad_accum", "must be at least 1 (1: no accumulation)")
    require(config.lr > 0, "lr", "must be positive")
    require(config.lr_base_batch >= 1, "lr_base_batch", "must be at least 1")
    require(0.0 <= config.momentum < 1.0, "momentum", "must be in [0, 1)")
    require(config.weight_decay >= 0, "weight_decay", "must be non-negative")
    require(0.0 <= config.dropout < 1.0, "dropout", "must be in [0, 1)")
    require(config.lr_schedule in ("multistep", "poly"), "lr_schedule", "must be multistep or poly")
    require(config.num_epoch > 0 or config.max_update > 0, "num_epoch", "must be positive (or set max_update)")
    require(config.max_update >= 0, "max_update", "must be non-negative")
    require(config.warmup_epochs >= 0, "warmup_epochs", "must be non-negative")
    require(0 < config.lr_factor <= 1, "lr_factor", "must be in (0, 1]")
    require(list(config.decay_epochs) == sorted(config.decay_epochs), "decay_epochs", "must be increasing")
    require(config.context in ("auto", "cpu", "gpu"), "context", "must be auto, cpu or gpu")
    require(config.frequent >= 1, "frequent", "must be at least 1")
    require(config.verbose >= 1, "verbose", "must be at least 1")
    require(config.save_interval >= 0, "save_interval", "must be non-negative (0: save only at the end)")
    require(config.keep_checkpoints >= 1, "keep_checkpoints", "must be at least 1")
    require(config.stall_timeout >= 0, "stall_timeout", "must be non-negative (0: no watchdog)")
    require(not (config.start_over and config.resume), "start_over",
            "starts afresh; it cannot be combined with --resume, which continues")
    require(config.image_size == FACE_SIZE, "image_size", f"the backbones take {FACE_SIZE}x{FACE_SIZE} faces")
    require(config.decode_threads >= 1, "decode_threads", "must be at least 1")
    require(config.rec or config.images or config.num_images > 0, "num_images",
            "dummy data (rec = '') needs num_images > 0")
    require(not (config.interclass_filtering_threshold and margin.LOSSES[config.loss][0].HARD_NEGATIVES),
            "interclass_filtering_threshold",
            f"--loss {config.loss} reshapes the hard negatives itself: use one of them")
    try:
        margin_of(config)
    except margin.MarginParameterError as error:     # names the margin's parameter; say its field
        field = margin.config_field(margin.LOSSES[config.loss][0], error.param)
        if field in MARGIN_FIELDS:
            raise ConfigError(f"{field} = {quoted(getattr(config, field))}: {error}") from None
        raise ConfigError(f"--loss {config.loss}: {error}") from None
    require(config.synthetic_identities == 0 or config.rec, "synthetic_identities", "generation needs --rec")
    require(config.synthetic_identities in (0, config.num_classes) or config.num_classes == 0, "synthetic_identities",
            f"a generated set has one class per identity: must equal num_classes ({config.num_classes}) or be 0")


def init_centers_of(config: Config) -> "list[str]":
    """--init_centers as given: one starting point (random, imprint or a folder) for every set, or with several
    sets one per set, comma-separated (a folder named once for several sets must hold as many sets' heads)."""
    return config.init_centers.split(",") if config.extra_sets else [config.init_centers]


def _is_within(path: str, folder: str) -> bool:
    """Whether `path` is `folder` or inside it, symlinks resolved (a link to OUTPUT/model, or into OUTPUT, is
    inside it). A model prefix names no file itself: the files PREFIX-symbol.json and PREFIX-*.params count
    too, each of which may be a link of its own."""
    if not path or path in INIT_CENTERS:
        return False
    folder = os.path.realpath(folder)
    candidates = [path, *glob.glob(glob.escape(path) + "-symbol.json"), *glob.glob(glob.escape(path) + "-*.params")]
    return any(inside(folder, candidate) for candidate in candidates)


def margin_of(config: Config, seed: "int | None" = None) -> margin.Margin:
    """The head's margin for this configuration (margin.LOSSES), seeded by `seed` (default config.seed)."""
    kind = margin.LOSSES[config.loss][0]
    params = {param: getattr(config, margin.config_field(kind, param)) for param in margin.config_params(kind)}
    if "seed" in margin.preset_params(config.loss):
        params["seed"] = config.seed if seed is None else seed
    return margin.make_margin(config.loss, **params)


def parse_args(argv=None) -> Config:
    """The Config for a command line; argparse or ConfigError messages name the field."""
    values = vars(build_parser().parse_args(argv))
    given = values.pop("training_sets")
    if len(given) > 1:          # several sets: the first is set 0 (rec or images), the others extra_sets
        if values.get("extra_sets"):
            raise ConfigError("extra_sets: give the sets either by repeating --rec/--images or as --extra_sets")
        empty = [f"--{kind}" for kind, path in given if not path]
        if empty:
            raise ConfigError(f"{', '.join(empty)} '': with several sets every --rec/--images names a set")
        (kind, path), rest = given[0], given[1:]
        values["rec"], values["images"] = (path, None) if kind == "rec" else (None, path)
        values["extra_sets"] = tuple(str(TrainingSet(kind, path)) for kind, path in rest)
    return make_config(values)


def save(config: Config, path: str) -> None:
    write_json(path, config.to_dict())


def describe(config: Config) -> str:
    width = max(len(f.name) for f in fields(Config))
    return "\n".join(f"  {name:<{width}} = {value!r}" for name, value in config.to_dict().items())


# Not part of the recipe line: the data (said by the configuration above it) and where the run's files go.
_NOT_RECIPE = {"dataset", "recipe", "output", "resume", "start_over", *DATA_FIELDS, "ijb_targets"}


def recipe_line(config: Config, checkpoint_config: "dict | None" = None) -> str:
    """One log line: the recipe in force, its source, and where each value that differs from it came from
    (the dataset, network or loss preset, or an option); for a resumed run, how the checkpoint's run
    (`checkpoint_config`, its state.json's config) compares."""
    values = {f.name: f.default for f in fields(Config)}
    recipe = RECIPES.get(config.recipe, {})
    values.update(recipe)
    values.update(NETWORKS.get(values["network"], {}))
    values.update(LOSSES[values["loss"]])
    expected, source = dict(values), {}
    layers = [(f"the dataset preset {config.dataset}", DATASETS.get(config.dataset, {}))]
    if config.network != values["network"]:
        layers.append((f"the network preset {config.network}", NETWORKS.get(config.network, {})))
    if config.loss != values["loss"]:
        layers.append((f"the loss preset {config.loss}", LOSSES[config.loss]))
    for label, layer in layers:
        for name, value in layer.items():
            if name not in _NOT_RECIPE and name not in ("network", "loss"):    # those two: options
                expected[name], source[name] = value, label
    given = config.to_dict()
    by_source: "dict[str, list[str]]" = {"options": [], **{label: [] for label, _ in layers}}
    for name, value in given.items():
        if name in _NOT_RECIPE or value == values[name]:
            continue
        where = source[name] if value == expected[name] and name in source else "options"
        by_source.setdefault(where, []).append(f"{name}={_short_value(value)}")
    if config.recipe:
        line = f"recipe: {config.recipe} ({RECIPE_SOURCES[config.recipe]})"
    else:
        line = "recipe: none (the configuration's defaults, as the speed presets use)"
    line += "".join(f"; from {where}: {', '.join(items)}" for where, items in by_source.items() if items)
    if checkpoint_config is not None:
        line += "; " + _compared_with_checkpoint(given, checkpoint_config)
    return line


def _compared_with_checkpoint(given: dict, saved: dict) -> str:
    """How this resumed run's settings compare with its checkpoint's run (a checkpoint written before
    recipes were recorded has none)."""
    changed = [f"{name} {_short_value(saved[name])} -> {_short_value(value)}" for name, value in given.items()
               if name not in _NOT_RECIPE and name in saved
               and _parse_like(value, saved[name]) != value]
    then = saved.get("recipe")
    head = (f"resumed: the checkpoint's run had recipe {then or 'none'}" if "recipe" in saved
            else "resumed: the checkpoint's run recorded no recipe (written before recipes)")
    if "recipe" in saved and then != given["recipe"]:
        head += f" (now {given['recipe'] or 'none'})"
    return head + (f", and differs in: {', '.join(changed)}" if changed else ", the same settings")


def _parse_like(value, saved):
    """A value of a saved config.json as the Config holds it (JSON makes tuples lists)."""
    return tuple(saved) if isinstance(value, tuple) and isinstance(saved, list) else saved


def _short_value(value) -> str:
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value)) or "''"
    return str(value) if value != "" else "''"


# ---- the configuration completed from the data, on each rank before any collective (DESIGN 4.5) ----

def resolve_config(cfg: Config, world: int, index=None, extra_indexes: "dict | None" = None) -> Config:
    """The configuration completed from the data (num_classes, extra_classes, val_targets 'auto') and checked
    against the world size. `index` is the data.folders.FolderIndex of --images (set 0), `extra_indexes`
    those of the --images sets after it (set number -> index)."""
    cfg = resolve_extra_classes(resolve_classes(resolve_network(cfg), index), extra_indexes or {})
    if cfg.val_targets == (AUTO_VAL,):
        folder = cfg.images or os.path.dirname(cfg.rec) or "."
        found = tuple(sorted(glob.glob(os.path.join(glob.escape(folder), "*.bin"))))
        cfg = dataclasses.replace(cfg, val_targets=found)
        log.info(f"verification sets found beside the set in {folder}: {', '.join(map(os.path.basename, found))}"
                 if found else f"no verification sets (*.bin) beside the set in {folder}: none used")
    if cfg.num_classes < world:
        raise ConfigError(f"num_classes = {cfg.num_classes} is below the number of ranks ({world}): "
                                     f"every rank must own at least one class; use at most {cfg.num_classes} ranks")
    for number, count in enumerate(cfg.extra_classes, start=1):
        if count < world:
            raise ConfigError(f"set {number} ({cfg.extra_sets[number - 1]}) has {count} classes, below the number "
                              f"of ranks ({world}): every rank must own at least one class of each set")
    return cfg


def resolve_network(cfg: Config) -> Config:
    """A symbol file's embedding width: read from its graph (embedding_size 0), or a given one checked
    against it; the file's problems (missing, not a graph, not an embedding) named."""
    if not symbols.is_symbol_file(cfg.network):
        return cfg
    try:
        width = symbols.embedding_width(symbols.load_symbol_file(cfg.network, cfg.network_output), cfg.network)
    except ValueError as error:
        raise ConfigError(f"network = {cfg.network!r}: {error}") from None
    if cfg.embedding_size not in (0, width):
        raise ConfigError(f"embedding_size = {cfg.embedding_size}: the graph of --network {cfg.network} "
                                     f"gives {width}-d embeddings")
    return dataclasses.replace(cfg, embedding_size=width)


def resolve_classes(cfg: Config, index=None) -> Config:
    """num_classes from set 0 when not given, or the given one checked against it (classes_of_set)."""
    if index is not None:
        stated, source = index.num_classes, f"{cfg.images} ({index.num_classes} identity folders with images)"
    elif cfg.rec and cfg.synthetic_identities == 0:        # a generated set is made to match num_classes
        stated, source = stated_classes(cfg.rec)
    else:
        return cfg
    return dataclasses.replace(cfg, num_classes=classes_of_set(cfg.num_classes, stated, source, cfg.rec,
                                                               "num_classes"))


def resolve_extra_classes(cfg: Config, indexes: dict) -> Config:
    """extra_classes from the sets after the first (or the given ones checked against them, as num_classes)."""
    if not cfg.extra_sets:
        return cfg
    given = cfg.extra_classes or (0,) * len(cfg.extra_sets)
    counts = []
    for number, (spec, count) in enumerate(zip(training_sets("", "", cfg.extra_sets), given), start=1):
        if spec.kind == "images":
            index = indexes[number]
            stated, source = index.num_classes, f"{spec.path} ({index.num_classes} identity folders with images)"
        else:
            stated, source = stated_classes(spec.path)
        counts.append(classes_of_set(count, stated, source, spec.path, f"extra_classes (set {number})"))
    return dataclasses.replace(cfg, extra_classes=tuple(counts))


def classes_of_set(given: int, stated: "int | None", source: str, rec: str, name: str) -> int:
    """A set's class count: the one it states when none is given (0); a given one may not be below it.

    Below it, the set's labels would fall outside the head's classes: refused.
    Above it, the extra classes have no images (a larger head on a small set,
    as the tests and speed runs use): said in the log, kept as given.
    """
    if given == 0:
        if stated is None:
            count_classes(rec)        # raises: the set is missing, or states no count
        log.info(f"{name} = {stated}, read from the set {source}")
        return stated
    if stated is not None and stated > given:
        raise ConfigError(f"{name} = {given} was given, but the set states {stated} identities ({source}): "
                          f"leave it out to use the set's count")
    if stated is not None and stated < given:
        log.warning(f"{name} = {given} was given, but the set states {stated} identities ({source}): "
                    f"the {given - stated} classes above them have no images (leave it out to use the set's count)")
    return given
