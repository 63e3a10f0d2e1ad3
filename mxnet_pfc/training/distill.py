"""Distillation from a frozen teacher (--teacher, --distill_weight).

The teacher, any MXNet model that embeds N x 3 x 112 x 112 raw RGB faces, embeds
each micro-batch the student sees, in inference mode and without gradient. The
student's loss adds

    distill_weight x mean over the global batch of (1 - cos(P s, t)),

s the student's embedding, t the teacher's, P a learned linear map (no bias) from
the student's width to the teacher's when they differ (else the identity). The
term is part of the student's graph (`training_symbol`): MXNet differentiates it,
P is a parameter of the backbone's module, so Horovod sums its gradient and the
optimizer, checkpoints and resume carry it like any other; the exported model
is the student's embedding alone (P is not in it).
"""
from __future__ import annotations

from dataclasses import dataclass

import mxnet as mx

import symbols
from mxnet_pfc.models.inference import ModelError, load_model
from mxnet_pfc.runtime.errors import ConfigError, quoted

TEACHER_INPUT = "teacher_embedding"       # the student graph's second input: the teacher's embeddings
PROJECTION = "distill_projection"          # the learned map's layer; its parameter is PROJECTION_WEIGHT
PROJECTION_WEIGHT = f"{PROJECTION}_weight"


def is_distillation_param(name: str) -> bool:
    """Whether a backbone parameter belongs to the distillation term (not the student's embedding)."""
    return name == PROJECTION_WEIGHT


@dataclass(frozen=True)
class Teacher:
    """A loaded teacher: its embedding graph and float32 parameters, and its width."""
    symbol: mx.sym.Symbol
    arg_params: dict
    aux_params: dict
    width: int
    source: str


def read_teacher(spec: str, image_size: int) -> Teacher:
    """The model --teacher names (an exported prefix[,epoch], a checkpoint or a run folder, as the
    commands read models); ConfigError naming it if it cannot be read or does not embed faces of the
    student's input size."""
    try:
        symbol, arg_params, aux_params, source = load_model(spec)
    except ModelError as error:
        raise ConfigError(f"teacher = {quoted(spec)}: {error}") from None
    where = f"teacher = {quoted(spec)}: {source}"
    try:
        width = symbols.embedding_width(symbol, where)
    except ValueError as error:
        raise ConfigError(f"{error} (the student's input is 3 x {image_size} x {image_size} faces)") from None
    arg_shapes, aux_shapes = symbols.parameter_shapes(symbol, (2, 3, image_size, image_size))
    given = {**arg_params, **aux_params}
    wrong = [f"{name} {tuple(given[name].shape)}, at this input {shape}"
             for name, shape in {**arg_shapes, **aux_shapes}.items()
             if name in given and tuple(given[name].shape) != shape]
    if wrong:
        raise ConfigError(f"teacher = {quoted(spec)}: the parameters of {source} are for another input than 3 x "
                          f"{image_size} x {image_size} faces: {'; '.join(wrong[:3])}")
    return Teacher(symbol, arg_params, aux_params, width, source)


def training_symbol(student: mx.sym.Symbol, student_width: int, teacher_width: int,
                    grad_scale: float) -> mx.sym.Symbol:
    """Group(student embedding, per-sample 1 - cos(P s, t)): the second output is a loss whose gradient is
    grad_scale per sample (distill_weight / the samples of the step's mean loss)."""
    teacher = mx.sym.Variable(TEACHER_INPUT)
    mapped = student if student_width == teacher_width else \
        mx.sym.FullyConnected(student, num_hidden=teacher_width, no_bias=True, name=PROJECTION)
    cosine = mx.sym.sum(mx.sym.L2Normalization(mapped, eps=1e-10) * mx.sym.L2Normalization(teacher, eps=1e-10),
                        axis=1)
    distance = mx.sym.MakeLoss(1.0 - cosine, grad_scale=grad_scale, normalization="null", name="distill")
    return mx.sym.Group([student, distance])


def describe(teacher: Teacher, student_width: int, weight: float) -> str:
    mapped = (f"through a learned {student_width} -> {teacher.width} projection" if teacher.width != student_width
              else "directly (same width)")
    return (f"distillation: teacher {teacher.source} ({teacher.width}-d, frozen); loss += {weight} x mean "
            f"(1 - cos(student, teacher)), the student's embedding compared {mapped}")
