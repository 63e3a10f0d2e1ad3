"""Peak host memory of each rank over a whole training run, phase by phase, beside training's high-water mark.

Launches the trainer as users do (`horovodrun --gloo ... bash config.sh -- ...`) on dummy data
(`--dataset speed-1m`: no I/O) and watches every rank from outside: every --poll seconds it
reads the rank's /proc/PID/status (VmHWM, the kernel's exact peak of resident memory) and the
new lines of the run's logs. At each phase boundary the phase's peak is the VmHWM read, and
the mark is reset (writing 5 to /proc/PID/clear_refs), so each phase's figure is its own peak:

  start-up          launch to the rank's "PartialFC(...)" line (data, network, memory bank)
  training          the steps (both stretches: before and after the first checkpoint)
  first checkpoint  rank 0's "step S/" line (S = --save-at; the save starts right after it)
                    to the rank's "checkpoint ... written" line
  the end           rank 0's last "step N/N" line to the rank's exit: the backbone's
                    snapshot, the export (rank 0) and the final checkpoint
  resume start-up   then the run resumed from that checkpoint (--resume latest, --save-at
                    steps more): launch to the rank's "resuming from" line (the bank filled)

and prints each phase's peak per rank and its ratio to training's high-water mark (the goal:
no phase above 1.10). --repeat runs the whole run again and gives medians.

Needs: disk for two checkpoints at a time (about 16 x classes x embedding bytes:
4 GB each at 10^6 x 512, with --keep_checkpoints 1) in --output's parent; memory
for the run (about 6 GB per rank at 10^6 x 512 on 2 ranks with r50, batch 32); about 5 minutes
for a run and its resume here (2 cores), most of it r50's steps (~30 s each), then the checkpoints.

    .venv/bin/python benchmarks/bench_memory.py                        # 10^6 classes x 512, r50, 2 ranks
    .venv/bin/python benchmarks/bench_memory.py --network r18-lite --steps 20 --save-at 10 --repeat 3
    .venv/bin/python benchmarks/bench_memory.py --repo /work/old        # another checkout's trainer
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHASES = ("start-up", "training", "first checkpoint", "the end", "resume start-up")
KB = 1024
WRITTEN = re.compile(r"checkpoint \S+ written in ([\d.]+) s")      # checkpoint.save's line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-classes", type=int, default=1_000_000, help="identities in all (default 1000000)")
    p.add_argument("--embedding-size", type=int, default=512, help="embedding width D (default 512)")
    p.add_argument("--sample-rate", type=float, default=0.1, help="share of centers sampled per step (default 0.1)")
    p.add_argument("--network", default="r50", help="backbone (default r50, the trainer's)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="images per rank (default 32: r50 at the trainer's 128 needs about 12 GB per rank)")
    p.add_argument("--np", type=int, default=2, help="ranks on localhost (default 2)")
    p.add_argument("--steps", type=int, default=4, help="steps of the run (default 4)")
    p.add_argument("--save-at", type=int, default=2,
                   help="the step of the first checkpoint; the resume trains as many more (default 2)")
    p.add_argument("--no-resume", action="store_true",
                   help="measure the run only (default: then also its resume from the last checkpoint)")
    p.add_argument("--repeat", type=int, default=1, help="runs; the figures are their medians (default 1)")
    p.add_argument("--poll", type=float, default=0.01, help="seconds between looks at the ranks (default 0.01)")
    p.add_argument("--output", type=Path, default=Path("/tmp/bench_memory"),
                   help="the run's output folder, removed before each run and at the end (default /tmp/bench_memory)")
    p.add_argument("--repo", type=Path, default=REPO,
                   help="the checkout whose config.sh and package run (default this one; e.g. an older worktree)")
    p.add_argument("--json", type=Path, help="append the result as one JSON line to this file")
    p.add_argument("--timeout", type=float, default=1800,
                   help="seconds a run may take before it is ended (default 1800)")
    args = p.parse_args(argv)
    if not 0 < args.save_at < args.steps:
        p.error("--save-at must be a step of the run, before its last")
    return args


def status(pid: int) -> "dict[str, int]":
    """VmRSS and VmHWM of `pid` in bytes ({} once it has ended)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {key: int(value) * KB for key, value in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M)}


def reset_peak(pid: int) -> None:
    """Start the kernel's high-water mark of `pid` afresh from its present resident memory."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        pass


def find_ranks(root_pid: int) -> "dict[int, int]":
    """{rank: pid} of the trainer processes below `root_pid` (their HOROVOD_RANK)."""
    parents, ranks = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                parents[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    for pid in parents:
        ancestor = parents.get(pid)
        while ancestor and ancestor != root_pid:
            ancestor = parents.get(ancestor)
        if ancestor != root_pid:
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = dict(item.split(b"=", 1) for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                           if b"=" in item)
        except OSError:
            continue
        if b"mxnet_pfc.runtime.launch_rank" in cmdline and b"HOROVOD_RANK" in environ:
            ranks[int(environ[b"HOROVOD_RANK"])] = pid
    return ranks


class LogTail:
    """The lines added to a file since the last look."""

    def __init__(self, path: Path):
        self.path, self.partial = path, ""
        self.offset = path.stat().st_size if path.exists() else 0

    def new_lines(self) -> "list[str]":
        try:
            with open(self.path) as f:
                f.seek(self.offset)
                text = f.read()
                self.offset = f.tell()
        except OSError:
            return []
        lines = (self.partial + text).split("\n")
        self.partial = lines.pop()
        return lines


class RankWatch:
    """One rank's phase and each phase's peak resident memory."""

    def __init__(self, rank: int, pid: int, log: LogTail, phase: str):
        self.rank, self.pid, self.log = rank, pid, log
        self.phase, self.peaks = phase, {}

    def look(self) -> None:
        figures = status(self.pid)
        if figures:
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), figures["VmHWM"])

    def enter(self, phase: str) -> None:
        """The present phase ends (its peak read) and `phase` starts with the mark reset."""
        if phase != self.phase:
            self.look()
            reset_peak(self.pid)
            if self.rank == 0:      # progress: one line a phase
                print(f"[bench_memory]   {self.phase}: peak {self.peaks[self.phase] / 1e9:.2f} GB on rank 0; "
                      f"now {phase}", flush=True)
            self.phase = phase


def trainer_command(args, resumed: bool) -> "list[str]":
    """The launch of the measured run (resumed: its continuation from the last checkpoint)."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    trainer_args = ["--dataset", "speed-1m", "--num_classes", args.num_classes, "--embedding_size",
                    args.embedding_size, "--sample_rate", args.sample_rate, "--network", args.network,
                    "--batch_size", args.batch_size, "--save_interval", args.save_at, "--keep_checkpoints", 1,
                    "--frequent", 1, "--output", args.output]
    trainer_args += ["--max_update", args.steps + args.save_at, "--resume", "latest"] if resumed else \
        ["--max_update", args.steps]
    return [str(horovodrun), "--gloo", "-np", str(args.np), "-H", f"localhost:{args.np}", "bash",
            str(args.repo / "config.sh"), "--", *map(str, trainer_args)]


def run_once(args, resumed: bool, save_seconds: list) -> "dict[int, dict[str, int]]":
    """One run, or (resumed) its continuation for --save-at steps more; {rank: {phase: peak bytes}}.
    The seconds of each checkpoint, as rank 0 logs them, are added to save_seconds."""
    if not resumed:
        shutil.rmtree(args.output, ignore_errors=True)
    last = args.steps + args.save_at if resumed else args.steps
    env = dict(os.environ, PYTHON=sys.executable, PYTHONWARNINGS="ignore::DeprecationWarning")
    env.pop("PYTHONPATH", None)         # the package comes from --repo (the working folder)
    started = time.monotonic()
    console = Path(f"{args.output}.console.txt")      # the launcher's output, for a failed run's message
    logs = args.output / "logs"
    leader = LogTail(logs / "rank0.log")        # a resumed run appends to the logs: only its own lines count
    with open(console, "w") as out:
        launcher = subprocess.Popen(trainer_command(args, resumed), cwd=args.repo, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    watches: "dict[int, RankWatch]" = {}
    ready = "resuming from " if resumed else "PartialFC("      # the bank is built (and filled)
    try:
        while launcher.poll() is None:
            if time.monotonic() - started > args.timeout:
                raise SystemExit(f"[bench_memory] the run took over {args.timeout:.0f} s; ended")
            if len(watches) < args.np:
                for rank, pid in find_ranks(launcher.pid).items():
                    if rank not in watches:
                        watches[rank] = RankWatch(rank, pid, LogTail(logs / f"rank{rank}.log") if rank else leader,
                                                  "resume start-up" if resumed else "start-up")
            lead_lines = leader.new_lines()
            save_seconds += [float(m.group(1)) for m in map(WRITTEN.search, lead_lines) if m]
            for watch in watches.values():
                watch.look()
                lines = lead_lines + (watch.log.new_lines() if watch.rank else [])
                for line in lines:
                    own = f"rank{watch.rank} " in line
                    if ready in line and own:
                        watch.enter("training")
                    elif f" step {args.save_at}/{last} " in line and not resumed:
                        watch.enter("first checkpoint")
                    elif WRITTEN.search(line) and own and watch.phase == "first checkpoint":
                        watch.enter("training")
                    elif f" step {last}/{last} " in line:
                        watch.enter("the end")
            time.sleep(args.poll)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)        # the launcher and its ranks
    if launcher.returncode != 0:
        raise SystemExit(f"[bench_memory] the run failed (exit {launcher.returncode}); its output, in {console}, "
                         f"ends:\n{console.read_text()[-3000:]}")
    if len(watches) != args.np or any(w.phase != "the end" for w in watches.values()):
        raise SystemExit(f"[bench_memory] lost track of the ranks' phases: "
                         f"{ {r: w.phase for r, w in watches.items()} }")
    return {rank: watch.peaks for rank, watch in sorted(watches.items())}


def main(argv=None):
    args = parse_args(argv)
    args.output, args.repo = args.output.resolve(), args.repo.resolve()
    checkpoint_gb = 2 * 2 * args.num_classes * args.embedding_size * 4 / 1e9       # two of centers + momentum
    then = "no resume" if args.no_resume else f"its resume for {args.save_at} steps more"
    print(f"[bench_memory] {args.repeat} x (a run of {args.steps} steps, then {then}), "
          f"{args.np} ranks, {args.num_classes:,} classes x {args.embedding_size}, rate {args.sample_rate}, "
          f"{args.network}, batch {args.batch_size}, trainer of {args.repo}; needs about {checkpoint_gb:.1f} GB "
          f"of disk in {args.output.parent}", flush=True)
    runs, save_seconds = [], []
    for repeat in range(args.repeat):
        t0 = time.monotonic()
        peaks = run_once(args, resumed=False, save_seconds=save_seconds)
        if not args.no_resume:
            for rank, resumed in run_once(args, resumed=True, save_seconds=save_seconds).items():
                peaks[rank]["resume start-up"] = resumed["resume start-up"]
        runs.append(peaks)
        print(f"[bench_memory] {repeat + 1}/{args.repeat} done in {time.monotonic() - t0:.0f} s", flush=True)
    shutil.rmtree(args.output, ignore_errors=True)
    phases = [phase for phase in PHASES if phase in runs[0][0]]
    median = {rank: {phase: statistics.median(run[rank][phase] for run in runs) for phase in phases}
              for rank in runs[0]}
    print(f"\npeak resident memory per rank, GB (medians of {len(runs)} run(s)); ratio: the highest phase's peak "
          "over training's high-water mark")
    print("rank  " + "  ".join(f"{phase:>16}" for phase in phases) + "  ratio")
    for rank, peaks in median.items():
        print(f"{rank:4d}  " + "  ".join(f"{peaks[phase] / 1e9:16.2f}" for phase in phases)
              + f"  {max(peaks.values()) / peaks['training']:5.3f}")
    worst = max(max(p.values()) / p["training"] for p in median.values())
    print(f"[bench_memory] worst rank: its highest peak is {worst:.3f} x training's high-water mark "
          "(goal: at most 1.10)")
    print(f"[bench_memory] a checkpoint took {statistics.median(save_seconds):.1f} s (median of "
          f"{len(save_seconds)}, rank 0's log)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        with open(args.json, "a") as f:
            f.write(json.dumps({"repo": str(args.repo), "num_classes": args.num_classes,
                                "embedding_size": args.embedding_size, "sample_rate": args.sample_rate,
                                "network": args.network, "batch_size": args.batch_size, "ranks": args.np,
                                "runs": len(runs), "peak_bytes": {str(r): p for r, p in median.items()},
                                "worst_ratio": round(worst, 3),
                                "checkpoint_seconds": statistics.median(save_seconds)}) + "\n")


if __name__ == "__main__":
    main()
