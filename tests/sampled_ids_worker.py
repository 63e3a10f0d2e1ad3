"""The trainer (mxnet_pfc.train.main) with each step's sampled local ids saved per rank.

  horovodrun ... python sampled_ids_worker.py [trainer options]   ->  OUTPUT/sampled-rankR-stepS.npy
"""
import os
import sys

import numpy as np

from mxnet_pfc import train
from mxnet_pfc.head.partial_fc import PartialFC
from mxnet_pfc.runtime import comm

original = PartialFC.forward_backward
steps = {"done": 0}


def recording(self, embeddings, labels, *args, **kwargs):
    result = original(self, embeddings, labels, *args, **kwargs)
    steps["done"] += 1
    output = sys.argv[sys.argv.index("--output") + 1]
    np.save(os.path.join(output, f"sampled-rank{comm.rank()}-step{steps['done']}.npy"),
            self.sampled_index.asnumpy())
    return result


PartialFC.forward_backward = recording
args = sys.argv[1:]
if args[:1] == ["--"]:          # horovodrun reads options it knows by prefix, even after the command
    args = args[1:]
sys.exit(train.main(args))
