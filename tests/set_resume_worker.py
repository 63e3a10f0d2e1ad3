"""Run on W ranks: restore a run of several sets from its checkpoint as the trainer does, write each head's rows.

    set_resume_worker.py OUT TRAINER_ARGS... (with --resume)  ->  OUT/set{S}-{centers,momentum}-{R}.npy

The trainer's own setup (prepare), heads (build_distributed) and restore (resume.restore), with no step
after them, so a test can compare every head's restored rows with the saved ones bit for bit.
"""
import os
import sys

import numpy as np

from mxnet_pfc.head.set_heads import heads_of
from mxnet_pfc.runtime import comm
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import resume as resume_lib
from mxnet_pfc.training import trainer


def main(out: str, *trainer_args: str) -> None:
    comm.init()
    rank, world = comm.rank(), comm.size()
    cfg = config_lib.parse_args(list(trainer_args))
    setup = trainer.prepare(cfg, RunFolder(cfg.output), rank, world)
    rows = setup.data.rows if setup.cfg.extra_sets else None
    head, module = trainer.build_distributed(setup.cfg, setup.ctx, setup.schedule, setup.symbol, None, rows)
    resume_lib.restore(setup.resume, module, head)
    for number, each in enumerate(heads_of(head)):
        np.save(os.path.join(out, f"set{number}-centers-{rank}.npy"), each.bank.weight.asnumpy())
        np.save(os.path.join(out, f"set{number}-momentum-{rank}.npy"), each.bank.weight_mom.asnumpy())
    setup.data.close()
    comm.barrier()
    comm.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
