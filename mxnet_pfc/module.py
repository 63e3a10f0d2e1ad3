"""The training module: a backbone (mx.mod.Module, data parallel) feeding the Partial FC head.

One step: the backbone embeds this rank's batch; the head computes the loss of
the global batch and the gradient for this rank's embeddings (and updates its
sampled centers); the backbone back-propagates that gradient; Horovod sums the
backbone gradients over ranks inside the optimizer's update.
"""
from __future__ import annotations

import logging
import time
import warnings

import mxnet as mx
import numpy as np

from . import comm
from .partial_fc import PartialFC

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
        self.seconds[name] = now - self.last
        self.last = now


class PartialFCModule:
    """Backbone + head on one rank; every rank constructs it and calls step() in lock step."""

    def __init__(self, symbol: mx.sym.Symbol, head: PartialFC, batch_size: int, ctx: mx.Context,
                 momentum: float = 0.9, weight_decay: float = 5e-4, fp16: bool = False,
                 image_size: int = 112):
        self.head, self.ctx = head, ctx
        self.data_shape = (batch_size, 3, image_size, image_size)
        self.module = mx.mod.Module(symbol, data_names=["data"], label_names=None, context=ctx)
        self.module.bind(data_shapes=[("data", self.data_shape)], for_training=True)
        self.module.init_params(mx.init.Xavier(rnd_type="gaussian", factor_type="out", magnitude=2))
        # rank 0's initial backbone on every rank (a distributed touch-point)
        arg_params, aux_params = self.module.get_params()
        comm.broadcast_parameters(arg_params)
        comm.broadcast_parameters(aux_params)
        self.module.set_params(arg_params, aux_params, force_init=True)
        param_names = [n for n in symbol.list_arguments() if n != "data"]
        # Horovod averages gradients over ranks; each rank's gradient is its share of
        # the global mean loss's gradient, so the sum is wanted: rescale by world size.
        sgd = mx.optimizer.SGD(learning_rate=head.lr, momentum=momentum, wd=weight_decay,
                               rescale_grad=float(comm.size()), multi_precision=fp16,
                               param_idx2name=dict(enumerate(param_names)))
        self.optimizer = comm.distributed_optimizer(sgd)
        with warnings.catch_warnings():     # Module expects rescale_grad = 1/batch; ours is deliberate
            warnings.simplefilter("ignore")
            self.module.init_optimizer(kvstore=None, optimizer=self.optimizer)

    def step(self, data: mx.nd.NDArray, labels: np.ndarray, lr: float,
             phase_seconds: "dict | None" = None) -> float:
        """One SGD step of backbone and head at learning rate lr; returns the global mean loss.

        With `phase_seconds`, the step waits for each phase to finish and records its
        seconds there (PHASES). The waits cost the step the overlap of its phases, so
        the trainer times one step per log window, not every step.
        """
        mark = _PhaseClock(phase_seconds)
        self.head.lr = lr
        self.optimizer.set_learning_rate(lr)
        self.module.forward(mx.io.DataBatch([data]), is_train=True)
        embeddings = self.module.get_outputs()[0]
        mark("forward")
        loss, grad = self.head.forward_backward(embeddings, labels)     # collectives; host sync for loss
        mark("head")
        self.module.backward(out_grads=[grad])
        mark("backward")
        self.module.update()                                            # allreduce of backbone grads
        mark("update")
        return loss

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

    def save_optimizer_states(self, path: str) -> None:
        """The backbone's SGD state (momentum), MXNet's pickle format."""
        self.module.save_optimizer_states(path)

    def load_optimizer_states(self, path: str) -> None:
        self.module.load_optimizer_states(path)
