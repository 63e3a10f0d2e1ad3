"""Runs on every rank under horovodrun; driven by tests/margin_golden.py and tests/test_adaface.py.

  margin_worker.py golden INPUT.npz OUTDIR  every scenario of INPUT (a loss of margin.LOSSES with its
                                            parameters, its steps of micro-batches); writes OUTDIR/rank<R>.npz
  margin_worker.py differ WHAT              the last rank's margin differs (h: AdaFace with another h;
                                            kind: a CombinedMarginLoss); construction must fail
  margin_worker.py nan-center OUTDIR        a good AdaFace step, then a NaN center on the last rank; writes
                                            OUTDIR/rank<R>.json (error, running statistics unchanged)
"""
import json
import sys

import mxnet as mx
import numpy as np

from head_steps import run_scenario
from mxnet_pfc import AdaFaceMargin, CombinedMarginLoss, PartialFC
from mxnet_pfc.head.margin import make_margin
from mxnet_pfc.head.partial_fc import NonFiniteLossError
from mxnet_pfc.runtime import comm


def main(input_path, out_dir):
    data = np.load(input_path)
    rank, world = comm.rank(), comm.size()
    results = {}
    for name in data["scenarios"]:
        margin = make_margin(str(data[f"{name}/loss"]), **json.loads(str(data[f"{name}/params"])))
        pfc = PartialFC(margin, embedding_size=data[f"{name}/weight"].shape[1],
                        num_classes=int(data[f"{name}/classes"]), sample_rate=float(data[f"{name}/rate"]),
                        lr=float(data[f"{name}/lrs"][0]), seed=7)
        results.update(run_scenario(pfc, data, name, rank, world))
    np.savez(f"{out_dir}/rank{rank}.npz", **results)


def differ(what):
    rank, world = comm.rank(), comm.size()
    last = rank == world - 1
    margin = AdaFaceMargin(h=0.5 if last and what == "h" else 0.333)
    if last and what == "kind":
        margin = CombinedMarginLoss()
    PartialFC(margin, embedding_size=8, num_classes=50)
    print(f"rank {rank}: constructed", flush=True)


def nan_center(out_dir):
    rank, world = comm.rank(), comm.size()
    pfc = PartialFC(AdaFaceMargin(t_alpha=0.5), embedding_size=8, num_classes=50)
    rng = np.random.default_rng(rank)
    pfc.forward_backward(mx.nd.array(rng.normal(size=(4, 8))), rng.integers(0, 50, 4))
    before = pfc.margin.state()
    if rank == world - 1:
        pfc.bank.weight[0] = float("nan")
    report = {"error": None, "moved": before != {"batch_mean": 20.0, "batch_std": 100.0}}
    try:
        pfc.forward_backward(mx.nd.array(rng.normal(size=(4, 8))), rng.integers(0, 50, 4))
    except NonFiniteLossError as err:
        report["error"] = str(err)
    report["unchanged"] = pfc.margin.state() == before
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    mode = sys.argv[1]
    {"golden": lambda: main(sys.argv[2], sys.argv[3]),
     "differ": lambda: differ(sys.argv[2]),
     "nan-center": lambda: nan_center(sys.argv[2])}[mode]()
