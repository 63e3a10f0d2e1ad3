"""Runs on every rank under horovodrun; driven by tests/test_module.py.

  module_worker.py INPUT.npz OUTDIR

A linear "backbone" (FullyConnected, no BatchNorm, so per-rank batches change
nothing) under PartialFCModule: the input's initial backbone and centers are
loaded, two steps are taken on the input's global batches (this rank's slices
of its grad_accum micro-batches, laid out as the data iterators do), and the
losses, the updated backbone, this rank's centers and their momentum, and the
number of gradient reductions per step are written to OUTDIR/rank<R>.npz.
"""
import sys

import mxnet as mx
import numpy as np

from mxnet_pfc import CombinedMarginLoss, PartialFC
from mxnet_pfc.runtime import comm
from mxnet_pfc.training.module import PartialFCModule


def main(input_path, out_dir):
    data = np.load(input_path)
    comm.init()
    rank, world = comm.rank(), comm.size()
    fc_weight, fc_bias, centers = data["fc_weight"], data["fc_bias"], data["centers"]
    size = int(data["image_size"])
    symbol = mx.sym.FullyConnected(mx.sym.flatten(mx.sym.Variable("data")), num_hidden=fc_weight.shape[0], name="fc")
    s, m1, m2, m3 = data["margin"]
    head = PartialFC(CombinedMarginLoss(s, m1, m2, m3), fc_weight.shape[0], centers.shape[0],
                     sample_rate=float(data["rate"]), momentum=float(data["momentum"]), wd=float(data["wd"]), seed=3)
    part = slice(head.bank.class_start, head.bank.class_start + head.bank.num_local)
    head.bank.weight[:] = centers[part]
    K = int(data["grad_accum"])
    B = data["x0"].shape[0] // (world * K)
    module = PartialFCModule(symbol, head, B, mx.cpu(), momentum=float(data["momentum"]),
                             weight_decay=float(data["wd"]), image_size=size, grad_accum=K)
    reductions = []         # the gradients Horovod reduced (parameter indices)
    if hasattr(module.optimizer, "_do_allreduce"):
        reduce = module.optimizer._do_allreduce

        def counted(index, grad):
            reductions.extend(index if isinstance(index, (list, tuple)) else [index])
            return reduce(index, grad)
        module.optimizer._do_allreduce = counted
    # every rank starts from rank 0's parameters (broadcast in the constructor); set the test's own
    if rank == 0:
        module.module.set_params({"fc_weight": mx.nd.array(fc_weight), "fc_bias": mx.nd.array(fc_bias)}, {},
                                 force_init=True)
    arg, aux = module.get_params()
    comm.broadcast_parameters(arg)
    module.module.set_params(arg, aux, force_init=True)
    losses, reductions_per_step = [], []
    for step, lr in enumerate(data["lrs"]):
        # micro-batch k of this rank is slice k * world + rank of B (data.iterators.epoch_order)
        mine = np.concatenate([np.arange(B) + (k * world + rank) * B for k in range(K)])
        x, y = data[f"x{step}"][mine], data[f"y{step}"][mine]
        before = len(reductions)
        losses.append(module.step(mx.nd.array(x), y, float(lr)))
        reductions_per_step.append(len(reductions) - before)
    arg, _ = module.get_params()
    np.savez(f"{out_dir}/rank{rank}.npz", losses=np.array(losses), fc_weight=arg["fc_weight"].asnumpy(),
             fc_bias=arg["fc_bias"].asnumpy(), centers=head.bank.weight.asnumpy(),
             momentum=head.bank.weight_mom.asnumpy(), class_start=head.bank.class_start,
             reductions=np.array(reductions_per_step))
    comm.barrier()
    comm.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
