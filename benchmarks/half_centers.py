"""Would float16 centers and momentum (float32 math) lose accuracy? An exact emulation.

Run under a launcher like the trainer, with the trainer's options after --:

    horovodrun --gloo -np 2 -H localhost:2 .venv/bin/python benchmarks/half_centers.py --half -- --output OUT

With --half, after every step each rank rounds its centers and momentum to
float16 and back (round to nearest, as a float16 store would). The math stays
float32, so the run is numerically what float16 storage gives, without writing
the storage. Without --half it is the trainer unchanged. Compare the two
runs' OUT/model-verification.json. It also prints, per step, the share of the
sampled centers' element updates that float16 storage would have dropped
(|change| below half a float16 step of the stored value).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from mxnet_pfc.head.partial_fc import PartialFC
from mxnet_pfc.runtime import comm
from mxnet_pfc.training import trainer


def emulate_half_storage(report_every: int) -> None:
    """Wrap PartialFC.forward_backward: measure the dropped updates, then round the bank to float16."""
    original = PartialFC.forward_backward
    counts = {"steps": 0}

    def forward_backward(self, *args, **kwargs):
        before = self.bank.weight.asnumpy().astype(np.float16)
        result = original(self, *args, **kwargs)
        after = self.bank.weight.asnumpy()
        rows = np.unique(self.sampled_index.asnumpy())
        moved = after[rows] != before[rows].astype(np.float32)
        dropped = moved & (after[rows].astype(np.float16) == before[rows])
        counts["steps"] += 1
        if comm.rank() == 0 and counts["steps"] % report_every == 0:
            print(f"[half_centers] step {counts['steps']}: float16 storage drops "
                  f"{dropped.sum() / max(moved.sum(), 1):.1%} of the center element updates", flush=True)
        for table in (self.bank.weight, self.bank.weight_mom):
            table[:] = table.astype("float16").astype("float32")
        return result

    PartialFC.forward_backward = forward_backward


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--half", action="store_true", help="emulate float16 centers and momentum")
    parser.add_argument("--report-every", type=int, default=100,
                        help="steps between dropped-update figures (default 100)")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then the trainer's options")
    args = parser.parse_args(argv)
    if args.half:
        emulate_half_storage(args.report_every)
    return trainer.main([a for a in args.trainer_args if a != "--"])


if __name__ == "__main__":
    sys.exit(main())
