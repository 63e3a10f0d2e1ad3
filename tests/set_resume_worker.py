"""Run on W ranks: start a run of several sets as the trainer does, from a checkpoint or its starting point,
and write each head's rows.

    set_resume_worker.py OUT TRAINER_ARGS...  ->  OUT/set{S}-{centers,momentum}-{R}.npy

The trainer's own setup (prepare), heads (build_distributed), and restore (resume.restore, with --resume)
or starting point (starting_point.apply_starting_point, --init_centers), with no step after them, so a
test can compare every head's rows with the ones it started from bit for bit.
"""
import os
import sys

import numpy as np

from mxnet_pfc.head.set_heads import heads_of
from mxnet_pfc.runtime import comm
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import resume as resume_lib
from mxnet_pfc.training import starting_point, trainer


def main(out: str, *trainer_args: str) -> None:
    comm.init()
    rank, world = comm.rank(), comm.size()
    cfg = config_lib.parse_args(list(trainer_args))
    setup = trainer.prepare(cfg, RunFolder(cfg.output), rank, world)
    rows = setup.data.rows if setup.cfg.extra_sets else None
    head, module = trainer.build_distributed(setup.cfg, setup.ctx, setup.schedule, setup.symbol, None, rows)
    if setup.resume is not None:
        resume_lib.restore(setup.resume, module, head)
    else:
        starting_point.apply_starting_point(setup.starting_point, module, heads_of(head), setup.data.sources,
                                            setup.cfg, rank, world)
    for number, each in enumerate(heads_of(head)):
        np.save(os.path.join(out, f"set{number}-centers-{rank}.npy"), each.bank.weight.asnumpy())
        np.save(os.path.join(out, f"set{number}-momentum-{rank}.npy"), each.bank.weight_mom.asnumpy())
    setup.data.close()
    comm.barrier()
    comm.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
