"""Runs on every rank under horovodrun; driven by tests/test_distributed.py.

  dist_worker.py golden INPUT.npz OUTDIR   every scenario of INPUT, two steps of its micro-batches each;
                                           writes OUTDIR/rank<R>.npz
  dist_worker.py bad OUTDIR                each bad-input case, errors caught and
                                           written to OUTDIR/rank<R>.json
  dist_worker.py bad-uncaught CASE         one bad-input case, error not caught
  dist_worker.py bad-config                the last rank asks for another num_classes
  dist_worker.py nan-center OUTDIR VALUE T the last rank's first center is VALUE (nan, inf), inter-class
                                           filtering above T (0: off); writes
                                           OUTDIR/rank<R>.json (error, centers unchanged)
  dist_worker.py broadcast OUTDIR          rank-specific parameters of three dtypes and shapes, then
                                           comm.broadcast_parameters from rank 1; writes OUTDIR/rank<R>.npz
"""
import json
import sys
import time

import mxnet as mx
import numpy as np

from head_steps import run_scenario
from mxnet_pfc import CombinedMarginLoss, PartialFC, PartialFCInputError
from mxnet_pfc.head.partial_fc import NonFiniteLossError
from mxnet_pfc.runtime import comm


def golden(input_path, out_dir):
    data = np.load(input_path)
    rank, world = comm.rank(), comm.size()
    results = {}
    for name in data["scenarios"]:
        s, m1, m2, m3 = data[f"{name}/margin"]
        w_all = data[f"{name}/weight"]
        pfc = PartialFC(CombinedMarginLoss(s, m1, m2, m3), embedding_size=w_all.shape[1],
                        num_classes=w_all.shape[0], sample_rate=float(data[f"{name}/rate"]),
                        lr=float(data[f"{name}/lrs"][0]), seed=7,
                        interclass_filtering_threshold=float(data[f"{name}/filter"]))
        results.update(run_scenario(pfc, data, name, rank, world))
    np.savez(f"{out_dir}/rank{rank}.npz", **results)


def bad_cases(rank, world):
    """(name, embeddings, labels) per case; only the last rank's input is bad, except
    for batch sizes, where every rank's own batch is fine but they differ."""
    D, C, B = 8, 50, 4
    rng = np.random.default_rng(rank)
    good_x = rng.normal(size=(B, D)).astype(np.float32)
    good_y = rng.integers(0, C, B)
    last = rank == world - 1
    cases = {
        "label_too_large": (good_x, np.where(last, np.array([1, C + 5, 2, 3]), good_y)),
        "label_negative": (good_x, np.where(last, np.array([-1, 0, 2, 3]), good_y)),
        "label_fraction": (good_x, np.where(last, np.array([1.5, 0, 2, 3]), good_y.astype(float))),
        "label_strings": (good_x, np.array(["a", "b", "c", "d"]) if last else good_y),
        "wrong_width": (rng.normal(size=(B, D + 3)).astype(np.float32) if last else good_x, good_y),
        # Sizes 4, 3, 2 on 3 ranks: their sum is 3 x rank 1's own size (a trap for parsers).
        "batch_differs": (good_x[: B - rank], good_y[: B - rank]),
        "nan_embedding": (np.where(last, np.float32(np.nan), good_x), good_y),
        "inf_embedding": (np.where(last & (np.arange(D) == 2), np.float32(np.inf), good_x), good_y),
    }
    return D, C, cases


def bad(out_dir):
    rank, world = comm.rank(), comm.size()
    D, C, cases = bad_cases(rank, world)
    pfc = PartialFC(CombinedMarginLoss(), embedding_size=D, num_classes=C)
    report = {}
    for name, (x, y) in cases.items():
        start = time.time()
        try:
            pfc.forward_backward(mx.nd.array(x), y)
            report[name] = {"error": None}
        except PartialFCInputError as err:
            report[name] = {"error": str(err), "seconds": time.time() - start}
    # After all that, a good step still works: nothing was left half-done.
    rng = np.random.default_rng(100 + rank)
    loss, _ = pfc.forward_backward(mx.nd.array(rng.normal(size=(4, D))), rng.integers(0, C, 4))
    report["after"] = {"loss": loss}
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(report, f)


def bad_uncaught(case):
    rank, world = comm.rank(), comm.size()
    D, C, cases = bad_cases(rank, world)
    pfc = PartialFC(CombinedMarginLoss(), embedding_size=D, num_classes=C)
    x, y = cases[case]
    pfc.forward_backward(mx.nd.array(x), y)
    print(f"rank {rank}: step finished", flush=True)


def bad_config():
    rank, world = comm.rank(), comm.size()
    PartialFC(CombinedMarginLoss(), embedding_size=8, num_classes=50 + (rank == world - 1))
    print(f"rank {rank}: constructed", flush=True)


def nan_center(out_dir, value, threshold):
    """A NaN or Inf center on the last rank: every rank must stop before any center or momentum moves."""
    rank, world = comm.rank(), comm.size()
    pfc = PartialFC(CombinedMarginLoss(), embedding_size=8, num_classes=50, sample_rate=1.0,
                    interclass_filtering_threshold=float(threshold))
    if rank == world - 1:
        pfc.bank.weight[0] = float(value)
    pfc.bank.weight_mom[:] = 0.01
    before = pfc.bank.weight.asnumpy(), pfc.bank.weight_mom.asnumpy()
    rng = np.random.default_rng(rank)
    report = {"error": None}
    try:
        pfc.forward_backward(mx.nd.array(rng.normal(size=(4, 8))), rng.integers(0, 50, 4))
    except NonFiniteLossError as err:
        report["error"] = str(err)
    report["unchanged"] = bool(np.array_equal(pfc.bank.weight.asnumpy(), before[0], equal_nan=True)
                               and np.array_equal(pfc.bank.weight_mom.asnumpy(), before[1]))
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(report, f)


def broadcast(out_dir):
    """Parameters that differ on every rank (values, a -0.0, a NaN) in float32, float64 and float16."""
    comm.init()
    rank = comm.rank()
    rng = np.random.default_rng(rank)
    params = {"b_weight": mx.nd.array(rng.normal(size=(3, 4)), dtype="float32"),
              "a_gamma": mx.nd.array([-0.0, np.nan, rank + 0.5], dtype="float32"),
              "c_var": mx.nd.array(rng.normal(size=(5,)), dtype="float64"),
              "d_half": mx.nd.array(rng.normal(size=(2, 2)), dtype="float16")}
    before = {name: value.asnumpy() for name, value in params.items()}
    comm.broadcast_parameters(params, root_rank=1)
    np.savez(f"{out_dir}/rank{rank}.npz", **{f"after/{n}": v.asnumpy() for n, v in params.items()},
             **{f"before/{n}": v for n, v in before.items()})


if __name__ == "__main__":
    mode = sys.argv[1]
    {"broadcast": lambda: broadcast(sys.argv[2]),
     "golden": lambda: golden(sys.argv[2], sys.argv[3]),
     "bad": lambda: bad(sys.argv[2]),
     "bad-uncaught": lambda: bad_uncaught(sys.argv[2]),
     "bad-config": bad_config,
     "nan-center": lambda: nan_center(sys.argv[2], sys.argv[3], sys.argv[4])}[mode]()
