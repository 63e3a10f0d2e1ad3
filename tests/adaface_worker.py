"""Runs on every rank under horovodrun; driven by tests/test_adaface.py.

  adaface_worker.py INPUT.npz OUTDIR   every scenario of INPUT (AdaFaceMargin, its steps of
                                       micro-batches); writes OUTDIR/rank<R>.npz
"""
import sys

import mxnet as mx
import numpy as np

from mxnet_pfc import AdaFaceMargin, PartialFC
from mxnet_pfc.runtime import comm


def main(input_path, out_dir):
    data = np.load(input_path)
    rank, world = comm.rank(), comm.size()
    results = {}
    for name in data["scenarios"]:
        s, m, h, t_alpha = data[f"{name}/margin"]
        w_all, mom_all = data[f"{name}/weight"], data[f"{name}/mom"]
        lrs, steps = data[f"{name}/lrs"], len(data[f"{name}/lrs"])
        pfc = PartialFC(AdaFaceMargin(s, m, h, t_alpha), embedding_size=w_all.shape[1],
                        num_classes=w_all.shape[0], sample_rate=float(data[f"{name}/rate"]),
                        lr=float(lrs[0]), seed=7)
        part = slice(pfc.bank.class_start, pfc.bank.class_start + pfc.bank.num_local)
        pfc.bank.weight[:] = w_all[part]
        pfc.bank.weight_mom[:] = mom_all[part]
        results[f"{name}/class_start"] = pfc.bank.class_start
        results[f"{name}/ops"] = pfc.ops.name
        micro_batches = int(data[f"{name}/micro_batches"])
        for step in range(steps):
            pfc.lr = float(lrs[step])
            for micro in range(micro_batches):
                key = f"{name}/{step}.{micro}"
                x, y = data[f"{name}/x{step}.{micro}"], data[f"{name}/y{step}.{micro}"]
                B = x.shape[0] // world
                loss, grad = pfc.forward_backward(mx.nd.array(x[rank * B:(rank + 1) * B]), y[rank * B:(rank + 1) * B],
                                                  micro_batches, update=micro == micro_batches - 1)
                results[key + "/loss"] = loss
                results[key + "/grad"] = grad.asnumpy()
                results[key + "/index"] = pfc.sampled_index.asnumpy()
                results[key + "/weight"] = pfc.bank.weight.asnumpy()
                results[key + "/mom"] = pfc.bank.weight_mom.asnumpy()
                state = pfc.margin.state()
                results[key + "/state"] = np.array([state["batch_mean"], state["batch_std"]])
    np.savez(f"{out_dir}/rank{rank}.npz", **results)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
