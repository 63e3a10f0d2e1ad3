"""The training module: a backbone (mx.mod.Module, data parallel) feeding the Partial FC head.

One step: the backbone embeds this rank's batch; the head computes the loss of
the global batch and the gradient for this rank's embeddings (and updates its
sampled centers); the backbone back-propagates that gradient; Horovod sums the
backbone gradients over ranks inside the optimizer's update.

With gradient accumulation (grad_accum = K) a step is K micro-batches: the
backbone's gradients add up in place (grad_req "add") and are reduced across
ranks and applied once; the head holds its centers' gradients likewise
(PartialFC.forward_backward). The step trains the mean loss over all K x N
samples (docs/DESIGN.md section 2.11).
"""
from __future__ import annotations

import logging
import time
import warnings

import mxnet as mx
import numpy as np

from mxnet_pfc.data.faces import FACE_SIZE, full_batch
from mxnet_pfc.head.partial_fc import NonFiniteLossError, PartialFC
from mxnet_pfc.runtime import comm
from mxnet_pfc.runtime.errors import quoted
from mxnet_pfc.training import distill

log = logging.getLogger(__name__)


# The parts of a step, as a timed step reports them: the backbone's forward; the head with
# its three collectives and the centers' SGD; the backbone's backward; the reduction of the
# backbone's gradients across ranks and its SGD.
PHASES = ("forward", "head", "backward", "update")


class _PhaseClock:
    """Records the seconds since the previous mark into `seconds[name]`, after waiting for the
    engine to finish (host sync point); does nothing when `seconds` is None."""

    def __init__(self, seconds: "dict | None"):
        self.seconds, self.last = seconds, time.perf_counter()

    def __call__(self, name: str) -> None:
        if self.seconds is None:
            return
        mx.nd.waitall()         # host sync point: only in a timed step
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self.last     # summed over micro-batches
        self.last = now


def named_states(states: dict, names: "list[str]") -> "dict[str, mx.nd.NDArray]":
    """An updater's states ({parameter index: array, None or a tuple of them}) as named arrays on the CPU:
    `NAME` for a single array, `NAME#j` for part j of a tuple (the updater's index i is parameter i: one
    device per rank)."""
    arrays = {}
    for index, state in states.items():
        parts = state if isinstance(state, (tuple, list)) else (state,)
        for j, part in enumerate(parts):
            if part is not None:
                key = names[index] if not isinstance(state, (tuple, list)) else f"{names[index]}#{j}"
                arrays[key] = part.as_in_context(mx.cpu())
    return arrays


class PartialFCModule:
    """Backbone + head on one rank; every rank constructs it and calls step() in lock step."""

    def __init__(self, symbol: mx.sym.Symbol, head: PartialFC, batch_size: int, ctx: mx.Context,
                 momentum: float = 0.9, weight_decay: float = 5e-4, fp16: bool = False,
                 image_size: int = FACE_SIZE, grad_accum: int = 1, teacher: "distill.Teacher | None" = None,
                 distill_weight: float = 0.0):
        if int(grad_accum) != grad_accum or grad_accum < 1:
            raise ValueError(f"grad_accum must be a positive integer, got {grad_accum}")
        self.head, self.ctx, self.batch_size, self.grad_accum = head, ctx, batch_size, int(grad_accum)
        self.data_shape = (batch_size, 3, image_size, image_size)
        data_shapes = [("data", self.data_shape)]
        self.teacher, self.distill_weight, self.distill_cosine = None, float(distill_weight), float("nan")
        if teacher is not None:         # the student's graph gains the distillation term; the teacher embeds
            width = head.embedding_size
            samples = batch_size * comm.size() * self.grad_accum      # of the step's mean loss
            symbol = distill.training_symbol(symbol, width, teacher.width, self.distill_weight / samples)
            self._teacher_shape = (batch_size, teacher.width)
            data_shapes.append((distill.TEACHER_INPUT, self._teacher_shape))
            self.teacher = mx.mod.Module(teacher.symbol, data_names=["data"], label_names=None, context=ctx)
            self.teacher.bind(data_shapes=[("data", self.data_shape)], for_training=False)
            arg_params, aux_params = dict(teacher.arg_params), dict(teacher.aux_params)
            comm.broadcast_parameters(arg_params)     # rank 0's reading on every rank (hosts' copies may differ)
            comm.broadcast_parameters(aux_params)
            self.teacher.set_params(arg_params, aux_params, force_init=True)
        self.module = mx.mod.Module(symbol, data_names=[name for name, _ in data_shapes], label_names=None,
                                    context=ctx)
        self.module.bind(data_shapes=data_shapes, for_training=True,
                         grad_req="add" if self.grad_accum > 1 else "write")
        self.module.init_params(mx.init.Xavier(rnd_type="gaussian", factor_type="out", magnitude=2))
        # rank 0's initial backbone on every rank (a distributed touch-point)
        arg_params, aux_params = self.module.get_params()
        comm.broadcast_parameters(arg_params)
        comm.broadcast_parameters(aux_params)
        self.module.set_params(arg_params, aux_params, force_init=True)
        param_names = [n for n in symbol.list_arguments() if n not in ("data", distill.TEACHER_INPUT)]
        # Horovod averages gradients over ranks; each rank's gradient is its share of
        # the global mean loss's gradient, so the sum is wanted: rescale by world size.
        sgd = mx.optimizer.SGD(learning_rate=head.lr, momentum=momentum, wd=weight_decay,
                               rescale_grad=float(comm.size()), multi_precision=fp16,
                               param_idx2name=dict(enumerate(param_names)))
        self.optimizer = comm.distributed_optimizer(sgd)
        with warnings.catch_warnings():     # Module expects rescale_grad = 1/batch; ours is deliberate
            warnings.simplefilter("ignore")
            self.module.init_optimizer(kvstore=None, optimizer=self.optimizer)
        self._gradients = [g for grads in self.module._exec_group.grad_arrays for g in grads if g is not None]
        self._clear_gradients()

    def _clear_gradients(self) -> None:
        """Zero the accumulated backbone gradients (grad_req "add" only; "write" overwrites them)."""
        if self.grad_accum > 1:
            for grad in self._gradients:
                grad[:] = 0

    def step(self, data: mx.nd.NDArray, labels: np.ndarray, lr: float,
             phase_seconds: "dict | None" = None, train_backbone: bool = True) -> float:
        """One SGD step of backbone and head at learning rate lr; returns the global mean loss.

        data (K x B, 3, H, W) and labels (K x B,) hold the step's grad_accum = K
        micro-batches of B images, in order. With `phase_seconds`, the step waits
        for each phase to finish and records its seconds there (PHASES, summed
        over micro-batches). The waits cost the step the overlap of its phases, so
        the trainer times one step per log window, not every step. With
        train_backbone False only the centers learn: the backbone embeds in
        inference mode (its BatchNorm statistics stay too) and is neither
        back-propagated nor updated (--freeze_backbone_steps).
        """
        mark = _PhaseClock(phase_seconds)
        self.head.lr = lr
        self.optimizer.set_learning_rate(lr)
        K, B = self.grad_accum, self.batch_size
        if data.shape[0] != K * B or len(labels) != K * B:
            raise ValueError(f"a step takes {K} x {B} images and labels, got {data.shape[0]} and {len(labels)}")
        losses, cosines = [], []
        for k in range(K):
            part = data if K == 1 else data[k * B:(k + 1) * B]
            inputs = [part]
            if self.teacher is not None:
                self.teacher.forward(mx.io.DataBatch([part]), is_train=False)
                inputs.append(self.teacher.get_outputs()[0])
                mark("teacher")
            self.module.forward(mx.io.DataBatch(inputs), is_train=train_backbone)
            outputs = self.module.get_outputs()
            embeddings = outputs[0]
            mark("forward")
            loss, grad = self.head.forward_backward(embeddings, labels[k * B:(k + 1) * B], K,
                                                    update=k == K - 1)     # collectives; host sync for loss
            if self.teacher is not None:       # the distillation term of the global mean (one more allreduce)
                total = comm.allreduce(mx.nd.sum(outputs[1]).reshape((1,)), name="distill.loss").asscalar()
                distance = total / (B * comm.size())
                if not np.isfinite(distance):       # the same on every rank: all stop here, before the backbone moves
                    raise NonFiniteLossError(f"the distillation term is {distance} (the teacher's or the student's "
                                             "embeddings are not finite)")
                loss += self.distill_weight * distance
                cosines.append(1.0 - distance)
            losses.append(loss)
            mark("head")
            if train_backbone:
                self.module.backward(out_grads=[grad] + ([mx.nd.ones_like(outputs[1])] if self.teacher else []))
            mark("backward")
        if train_backbone:
            self.module.update()                             # allreduce of backbone grads, once per step
            self._clear_gradients()
        mark("update")
        if cosines:
            self.distill_cosine = float(np.mean(cosines))      # the student's mean cosine to the teacher
        return float(np.mean(losses))                   # micro-batches of equal size: the mean over K x N

    def embed(self, images: np.ndarray) -> np.ndarray:
        """Embeddings (n, D) of n <= batch_size RGB images (n, 3, H, W) under the current backbone, in
        inference mode (BatchNorm's moving statistics, no dropout); no gradient, nothing changes."""
        inputs = [mx.nd.array(full_batch(images, self.batch_size))]
        if self.teacher is not None:       # the distillation term's input, unused for the embedding
            inputs.append(mx.nd.zeros(self._teacher_shape))
        self.module.forward(mx.io.DataBatch(inputs), is_train=False)
        return self.module.get_outputs()[0].asnumpy()[:len(images)]

    def get_params(self):
        """(arg_params, aux_params) of the backbone, copied to the CPU.

        Waits for all pending work first: MXNet's BatchNorm updates its moving
        statistics during backward without the engine tracking that write, so a
        copy taken right after a step can read them half-updated (seen on CPU).
        """
        mx.nd.waitall()         # host sync point
        return self.module.get_params()

    def set_params(self, arg_params: dict, aux_params: dict) -> None:
        """Backbone parameters from a checkpoint (names and shapes checked by the caller)."""
        self.module.set_params(arg_params, aux_params, force_init=True)

    def optimizer_state(self) -> "dict[str, mx.nd.NDArray]":
        """The backbone's SGD state (momentum; with fp16 also the float32 master weights) as named arrays:
        `NAME` for a parameter's single state array, `NAME#j` for part j of a tuple state.

        Arrays only, so a checkpoint can hold them in MXNet's .params format: MXNet's
        own save_optimizer_states pickles, and loading a pickle can run code.
        """
        return named_states(self.module._updater.states, self.module._exec_group.param_names)

    def load_optimizer_state(self, arrays: "dict[str, mx.nd.NDArray]", source: str) -> None:
        """Restore what optimizer_state() returned; every name and shape is checked against the backbone
        (raises ValueError naming the first that does not fit)."""
        names = self.module._exec_group.param_names
        shapes = {name: devices[0].shape for name, devices in zip(names, self.module._exec_group.param_arrays)}
        grouped: "dict[int, dict[int, mx.nd.NDArray]]" = {}      # parameter index: {part (-1: whole): array}
        for key, array in arrays.items():
            name, _, part = key.partition("#")
            if name not in shapes and distill.is_distillation_param(name):
                continue        # a checkpoint of a distilled run, resumed without its teacher
            if name not in shapes or (part and not part.isdigit()):
                raise ValueError(f"{source}: optimizer state {quoted(key)} is not for a parameter of this network")
            if array.shape != shapes[name]:
                raise ValueError(f"{source}: optimizer state {quoted(key)} has shape {array.shape}, the parameter "
                                 f"{shapes[name]}")
            if array.dtype not in (np.float32, np.float16):
                raise ValueError(f"{source}: optimizer state {quoted(key)} is {np.dtype(array.dtype).name}, not float")
            grouped.setdefault(names.index(name), {})[int(part) if part else -1] = array
        missing = [name for index, name in enumerate(names)      # a new projection's state starts afresh
                   if index not in grouped and not distill.is_distillation_param(name)]
        if grouped and missing:         # SGD keeps a state for every parameter (or none, without momentum)
            raise ValueError(f"{source}: no optimizer state for {len(missing)} of the {len(names)} parameters "
                             f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''})")
        states = {}
        for index, parts in grouped.items():
            if -1 in parts:
                if len(parts) > 1:
                    raise ValueError(f"{source}: optimizer state of {names[index]!r} is both whole and in parts")
                states[index] = parts[-1]
            else:
                states[index] = tuple(parts.get(j) for j in range(max(parts) + 1))
        updater = self.module._updater
        updater.states = states
        updater.states_synced = dict.fromkeys(states, False)     # moved to the parameters' device on first use
