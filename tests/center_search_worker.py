"""Runs on every rank under horovodrun; driven by tests/test_center_search.py.

  center_search_worker.py INPUT.npz OUTDIR K BLOCK [mxnet]   this rank's shards of A and B, its most similar B
                    classes for each of its A classes (the products by NumPy, or by MXNet on the CPU context as
                    on a GPU's); writes OUTDIR/rank<R>.npz
"""
import sys

import mxnet as mx
import numpy as np

from mxnet_pfc.head.center_search import most_similar
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.runtime import comm

if __name__ == "__main__":
    data, out, k, block = np.load(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    comm.init()
    rank, world = comm.rank(), comm.size()
    a_start, a_count = shard_range(len(data["a"]), rank, world)
    b_start, b_count = shard_range(len(data["b"]), rank, world)
    seen = []
    cos, ids = most_similar(data["a"][a_start:a_start + a_count], data["b"][b_start:b_start + b_count], b_start,
                            k, block, progress=seen.append, ctx=mx.cpu() if sys.argv[5:] == ["mxnet"] else None)
    np.savez(f"{out}/rank{rank}.npz", cos=cos, ids=ids, a_start=a_start, rows_seen=sum(seen))
