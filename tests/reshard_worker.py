"""Run on W ranks: load a saved checkpoint's centers into a PartialFC of W ranks, write each rank's rows.

    reshard_worker.py CHECKPOINT_FOLDER OUT_FOLDER   ->  OUT/centers-R.npy, OUT/momentum-R.npy
"""
import os
import sys

import mxnet as mx
import numpy as np

from mxnet_pfc.head.margin import CombinedMarginLoss, SubCenterArcFace
from mxnet_pfc.head.partial_fc import PartialFC
from mxnet_pfc.runtime import checkpoints, comm


def main(folder: str, out: str) -> None:
    comm.init()
    state = checkpoints.State.read(folder)
    subcenters = state.subcenters
    margin = SubCenterArcFace(subcenters=subcenters) if subcenters > 1 else CombinedMarginLoss(32, 1, 0, 0.2)
    head = PartialFC(margin, state.embedding_size, state.num_classes, ctx=mx.cpu(), seed=1)
    head.bank.load(folder, state.shards)
    np.save(os.path.join(out, f"centers-{comm.rank()}.npy"), head.bank.weight.asnumpy())
    np.save(os.path.join(out, f"momentum-{comm.rank()}.npy"), head.bank.weight_mom.asnumpy())
    comm.barrier()
    comm.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:3])
