"""Training that outlives its machines: relaunch on the hosts that remain, grow back when they return.

    python -m mxnet_pfc.elastic --host-discovery-script ./hosts.sh --min-np 1 --max-np 16 \\
        --max-restarts 10 -- --dataset emore --network r100 --output runs/big

The contract: the trainer runs under horovodrun on the hosts the discovery
script lists, and after a lost rank or host it runs again with
`--resume latest` on those that remain (more when slots return); it stops on
an error of the run's own, at the end of the run, after --max-restarts
relaunches, or on Ctrl-C, leaving no process of the job behind. What it
does in each case and why: docs/elastic.md (for users) and docs/DESIGN.md
section 6.5 (the decisions, the records it reads, adoption of a running job).
Every change of the world is a line of OUTPUT/elastic-timeline.tsv and of this
command's log.
"""
from __future__ import annotations

import argparse
import logging
import signal
import sys
from pathlib import Path

from mxnet_pfc.runtime import run_lock
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.runtime.supervisor import Supervisor, discover
from mxnet_pfc.training import config as config_lib

log = logging.getLogger("mxnet_pfc.elastic")


def parse_args(argv=None) -> "tuple[argparse.Namespace, list[str]]":
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="python -m mxnet_pfc.elastic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="%(prog)s --host-discovery-script SCRIPT [options] -- [trainer options]")
    p.add_argument("--host-discovery-script", required=True,
                   help="command that prints the usable hosts, one 'host:slots' line each (horovodrun's format)")
    p.add_argument("--slots-per-host", type=int, default=1,
                   help="slots of a host listed without ':slots' (default 1)")
    p.add_argument("--min-np", type=int, default=1, help="fewest ranks to train on (default 1)")
    p.add_argument("--max-np", type=int, default=None,
                   help="most ranks to train on (default: every slot listed at the first launch)")
    p.add_argument("--max-restarts", type=int, default=10,
                   help="relaunches after failures before giving up (growing does not count; default 10)")
    p.add_argument("--wait-timeout", type=float, default=600.0,
                   help="seconds to wait for --min-np slots before giving up (default 600)")
    p.add_argument("--discovery-interval", type=float, default=10.0,
                   help="seconds between runs of the discovery script while the job trains (default 10)")
    p.add_argument("--stop-grace", type=float, default=30.0,
                   help="seconds the job has to end after Ctrl-C or SIGTERM before it is killed (default 30)")
    p.add_argument("--horovodrun", default=str(Path(sys.executable).with_name("horovodrun")),
                   help="the horovodrun to launch with (default: the one beside this Python)")
    p.add_argument("--horovodrun-args", default="",
                   help="more horovodrun options, one string, e.g. '--network-interface eth0' (default none)")
    args = p.parse_args(argv[:split])
    for name in ("slots_per_host", "min_np", "max_restarts"):
        if getattr(args, name) < (0 if name == "max_restarts" else 1):
            p.error(f"--{name.replace('_', '-')} must be at least {0 if name == 'max_restarts' else 1}")
    if args.max_np is not None and args.max_np < args.min_np:
        p.error(f"--max-np ({args.max_np}) is below --min-np ({args.min_np})")
    return args, argv[split + 1:]


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s elastic: %(message)s", stream=sys.stderr)
    args, trainer_args = parse_args(argv)
    try:       # the trainer's own checks, before any host is used
        cfg = config_lib.parse_args(trainer_args)
    except config_lib.ConfigError as error:
        print(f"mxnet_pfc.elastic: configuration error: {error}", file=sys.stderr)
        return 2
    if not cfg.save_interval:
        log.warning("--save_interval is 0: no periodic checkpoints, so a failure restarts from the beginning "
                    "and the job cannot grow")
    if args.max_np is None:
        try:
            args.max_np = max(discover(args.host_discovery_script, args.slots_per_host).total, args.min_np)
        except RuntimeError as error:
            print(f"mxnet_pfc.elastic: {error}", file=sys.stderr)
            return 2
    try:       # one supervisor per output folder: two would relaunch over each other
        lock = run_lock.acquire(RunFolder(cfg.output).elastic)
    except run_lock.OutputBusyError as error:
        print(f"mxnet_pfc.elastic: another supervisor runs on this output: {error}", file=sys.stderr)
        return 2
    if lock.took_over:
        log.info(f"took over from a supervisor that is gone: {lock.took_over}")
    try:
        supervisor = Supervisor(args, trainer_args, cfg.output, cfg.start_over, [cfg.max_update, cfg.num_epoch])
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, supervisor.interrupt)
        return supervisor.run()
    finally:
        lock.release()



if __name__ == "__main__":
    sys.exit(main())
