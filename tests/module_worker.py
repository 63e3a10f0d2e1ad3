"""Runs on every rank under horovodrun; driven by tests/test_module.py.

  module_worker.py INPUT.npz OUTDIR

A linear "backbone" (FullyConnected, no BatchNorm, so per-rank batches change
nothing) under PartialFCModule: the input's initial backbone and centers are
loaded, two steps are taken on the input's global batches (this rank's slice),
and the losses, the updated backbone and this rank's centers are written to
OUTDIR/rank<R>.npz.
"""
import sys

import mxnet as mx
import numpy as np

from mxnet_pfc import CombinedMarginLoss, PartialFC, comm
from mxnet_pfc.module import PartialFCModule


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
    B = data["x0"].shape[0] // world
    module = PartialFCModule(symbol, head, B, mx.cpu(), momentum=float(data["momentum"]),
                             weight_decay=float(data["wd"]), image_size=size)
    # every rank starts from rank 0's parameters (broadcast in the constructor); set the test's own
    if rank == 0:
        module.module.set_params({"fc_weight": mx.nd.array(fc_weight), "fc_bias": mx.nd.array(fc_bias)}, {},
                                 force_init=True)
    arg, aux = module.get_params()
    comm.broadcast_parameters(arg)
    module.module.set_params(arg, aux, force_init=True)
    losses = []
    for step, lr in enumerate(data["lrs"]):
        x, y = data[f"x{step}"], data[f"y{step}"]
        losses.append(module.step(mx.nd.array(x[rank * B:(rank + 1) * B]), y[rank * B:(rank + 1) * B], float(lr)))
    arg, _ = module.get_params()
    np.savez(f"{out_dir}/rank{rank}.npz", losses=np.array(losses), fc_weight=arg["fc_weight"].asnumpy(),
             fc_bias=arg["fc_bias"].asnumpy(), centers=head.bank.weight.asnumpy(), class_start=head.bank.class_start)
    comm.barrier()
    comm.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
