"""The golden workers' common part (dist_worker.py, margin_worker.py): a scenario's centers into this
rank's bank, then its steps of micro-batches, each step's results recorded for the test to compare."""
import json

import mxnet as mx


def run_scenario(pfc, data, name: str, rank: int, world: int) -> dict:
    """Fill pfc's bank with this rank's rows of the scenario's centers and momentum (K rows per class,
    class-major), run every step of its micro-batches, and return what each step left: loss, this rank's
    gradient, the sampled classes, the bank's rows and momentum, the margin's state."""
    K = pfc.bank.subcenters
    part = slice(pfc.bank.class_start * K, (pfc.bank.class_start + pfc.bank.num_local) * K)
    pfc.bank.weight[:] = data[f"{name}/weight"][part]
    pfc.bank.weight_mom[:] = data[f"{name}/mom"][part]
    results = {f"{name}/class_start": pfc.bank.class_start, f"{name}/ops": pfc.ops.name,
               f"{name}/num_sample": pfc.num_sample}
    micro_batches = int(data[f"{name}/micro_batches"])
    for step, lr in enumerate(data[f"{name}/lrs"]):
        pfc.lr = float(lr)
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
            results[key + "/state"] = json.dumps(pfc.margin.state(), sort_keys=True)
    return results
