"""Runs on every rank under horovodrun; driven by tests/test_set_heads.py.

  set_heads_worker.py golden INPUT.npz OUTDIR   every scenario of INPUT: two sets, one head each (SetHeads),
                                                two steps of its micro-batches; writes OUTDIR/rank<R>.npz
"""
import sys

import mxnet as mx
import numpy as np

from mxnet_pfc import CombinedMarginLoss, PartialFC
from mxnet_pfc.head.set_heads import SetHeads
from mxnet_pfc.runtime import comm


def golden(input_path, out_dir):
    data = np.load(input_path)
    rank = comm.rank()
    results = {}
    for name in data["scenarios"]:
        sets = int(data[f"{name}/sets"])
        heads = []
        for k in range(sets):
            w_all = data[f"{name}/{k}/weight"]
            head = PartialFC(CombinedMarginLoss(*data[f"{name}/margin"]), embedding_size=w_all.shape[1],
                             num_classes=w_all.shape[0], sample_rate=float(data[f"{name}/{k}/rate"]),
                             lr=float(data[f"{name}/lrs"][0]), seed=7 + k)
            part = slice(head.bank.class_start, head.bank.class_start + head.bank.num_local)
            head.bank.weight[:] = w_all[part]
            head.bank.weight_mom[:] = data[f"{name}/{k}/mom"][part]
            results[f"{name}/{k}/class_start"] = head.bank.class_start
            results[f"{name}/{k}/ops"] = head.ops.name
            heads.append(head)
        results[f"{name}/ops"] = heads[0].ops.name       # what launch.golden_ranks checks
        rows = [int(n) for n in data[f"{name}/rows"]]
        set_heads = SetHeads(heads, rows, list(data[f"{name}/set_weights"]))
        micro_batches = int(data[f"{name}/micro_batches"])
        for step, lr in enumerate(data[f"{name}/lrs"]):
            set_heads.lr = float(lr)
            for micro in range(micro_batches):
                key = f"{name}/{step}.{micro}"
                x = np.concatenate([data[f"{key}/{k}/x"][rank * rows[k]:(rank + 1) * rows[k]] for k in range(sets)])
                y = np.concatenate([data[f"{key}/{k}/y"][rank * rows[k]:(rank + 1) * rows[k]] for k in range(sets)])
                loss, grad = set_heads.forward_backward(mx.nd.array(x), y, micro_batches,
                                                        update=micro == micro_batches - 1)
                results[key + "/loss"] = loss
                results[key + "/grad"] = grad.asnumpy()
                for k, head in enumerate(heads):
                    results[f"{key}/{k}/index"] = head.sampled_index.asnumpy()
                    results[f"{key}/{k}/weight"] = head.bank.weight.asnumpy()
                    results[f"{key}/{k}/mom"] = head.bank.weight_mom.asnumpy()
    np.savez(f"{out_dir}/rank{rank}.npz", **results)


if __name__ == "__main__":
    golden(sys.argv[2], sys.argv[3])
