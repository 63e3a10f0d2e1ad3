"""Data at the size of a real set: start-up, shuffles, resumes, decoding, data.check and data.pack.

    make bench-data                                   (python benchmarks/bench_data.py)
    make bench-data ARGS="--versus ../old"            (and an older tree's figures, side by side)

Builds once, in --dir (reused by later runs; a set is rebuilt only when its
size changes): a RecordIO set of --records small synthetic faces (default
1,000,000; a few hundred distinct 112x112 JPEGs reused across records with
different labels: every record is read from the file, so the reads and the
index are those of a set this size), an image folder of --images files (hard
links of the same few hundred: listing and indexing see that many names), and
the synthetic default set (500 x 32 images) as the small one to compare with.
It says first how much disk and time the build takes, and scales the sets down
(saying so) when the disk cannot hold them with room to spare.

Then, per rank of a 2-rank run (two processes started together, each reading
its shard as the trainer's iterator does; the code under test is --code's
mxnet_pfc), medians of --repeat runs:
- start-up from launch to the first batch (the index and header read, the
  rank's shard, the first shuffle, the first batch decoded), and the resident
  memory the index adds;
- a new epoch's shuffle (epoch_order), and a resume in the middle of an epoch
  (seek, then the first batch) beside a start at step 0;
- decoding per thread: one thread reads and decodes --decode-images images
  (default all) in an epoch's order, so the reads spread over the whole file;
- `data.check` of the RecordIO set and `data.pack` of the image folder, as
  users run them, in images/s;
- an index of --index-records (default 42M) opened alone (its .rec sparse):
  the time, the resident memory and the peak, and an epoch's shuffle.
With --versus, each run of the other tree follows the same run of this one,
and the ratios are printed. The figures are appended to --json
(benchmarks/results/data.jsonl).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNTHETIC = (500, 32)          # the synthetic default set: identities x images (config's default)
IMAGES_PER_IDENTITY = 50       # of the big sets (MS1MV3 has 56 on average)
DISTINCT = 512                 # distinct encoded faces the big sets are made of
BATCH, THREADS = 128, 2        # per rank, as the trainer's defaults (batch_size, decode_threads)
WORLD = 2
SPARE = 2.0                    # the build takes at most 1/SPARE of the free disk


def rss_bytes() -> int:
    """This process's resident memory (VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


# -- the worker: one rank's measurements, in a process of its own (PYTHONPATH = the code under test)

def worker(args) -> None:
    started = time.time()
    from mxnet_pfc.data import iterators
    imported = time.time()
    before = rss_bytes()
    if args.rec:
        num_classes = iterators.count_classes(args.rec)

        def make():
            return iterators.RecordIter(args.rec, BATCH, num_classes, args.rank, WORLD, seed=0, threads=THREADS)
    else:
        from mxnet_pfc.data import folders
        index = folders.load_index(args.images, args.output, write=args.rank == 0)
        num_classes = index.num_classes

        def make():
            return iterators.FolderIter(index, BATCH, num_classes, args.rank, WORLD, seed=0, threads=THREADS)
    it = make()
    opened = time.time()
    index_bytes = rss_bytes() - before
    next(it)
    first = time.time()
    it.close()
    result = {"rank": args.rank, "images": it.num_images, "launch_to_import_s": imported - args.launched,
              "open_s": opened - imported, "first_batch_s": first - opened, "startup_s": first - args.launched,
              "index_rss_bytes": index_bytes, "python_start_s": started - args.launched}
    shuffles = []
    for epoch in range(1, 4):
        t = time.perf_counter()
        iterators.epoch_order(it.num_images, BATCH, args.rank, WORLD, 0, epoch)
        shuffles.append(time.perf_counter() - t)
    result["shuffle_s"] = statistics.median(shuffles)
    resumed = make()
    t = time.perf_counter()
    resumed.seek(resumed.steps_per_epoch + resumed.steps_per_epoch // 2)       # the middle of epoch 1
    next(resumed)
    result["resume_first_batch_s"] = time.perf_counter() - t
    resumed.close()
    again = make()
    t = time.perf_counter()
    next(again)
    result["start_first_batch_s"] = time.perf_counter() - t
    again.close()
    print(json.dumps(result), flush=True)


def index_worker(args) -> None:
    """Opening the index of a set of --index-records (its start-up part), its memory, and an epoch's shuffle."""
    from mxnet_pfc.data import iterators
    from mxnet_pfc.data.records import open_records
    before = rss_bytes()
    started = time.perf_counter()
    reader, records = open_records(args.rec)
    opened = time.perf_counter()
    held = rss_bytes() - before
    iterators.epoch_order(len(records.image_records), BATCH, args.rank, WORLD, 0, 1)
    shuffled = time.perf_counter()
    with open("/proc/self/status") as f:
        peak = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    print(json.dumps({"rank": args.rank, "images": len(records.image_records), "open_s": opened - started,
                      "index_rss_bytes": held, "shuffle_s": shuffled - opened, "peak_rss_bytes": peak}), flush=True)


def build_index_only(folder: str, records: int) -> str:
    """A set of `records` header-less records whose .rec is sparse: only the first and the last record are
    written (what opening reads); the .idx is whole, as a real set's."""
    import mxnet as mx
    from tqdm import tqdm

    from mxnet_pfc.data.records import RECORD_MAGIC
    stride = 4096
    record = mx.recordio.pack(mx.recordio.IRHeader(0, 0.0, 0, 0), b"x" * 100)
    framed = RECORD_MAGIC.to_bytes(4, "little") + len(record).to_bytes(4, "little") + record
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    with open(os.path.join(tmp, "train.rec"), "wb") as f:
        f.write(framed)
        f.seek(stride * (records - 1))
        f.write(framed)
    chunk = 1 << 20
    with open(os.path.join(tmp, "train.idx"), "w") as f:
        for start in tqdm(range(0, records, chunk), desc="train.idx", unit="M lines", mininterval=5):
            f.write("".join(f"{i}\t{i * stride}\n" for i in range(start, min(start + chunk, records))))
    with open(os.path.join(tmp, "property"), "w") as f:
        f.write("1,112,112\n")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return os.path.join(folder, "train.rec")


def decode_worker(args) -> None:
    """Images per second of one thread reading and decoding records in an epoch's order (whole file)."""
    from mxnet_pfc.data import iterators
    from mxnet_pfc.data.records import decode_item
    source = iterators.RecordSource(args.rec)
    num_classes = iterators.count_classes(args.rec)
    order = iterators.epoch_order(len(source), 1, 0, 1, 0, 0).ravel()
    count = min(args.decode_images or len(order), len(order))
    started = time.perf_counter()
    for position in order[:count]:
        decode_item(*source.read(int(position)), num_classes, (112, 112))
    seconds = time.perf_counter() - started
    print(json.dumps({"decoded": count, "decode_images_per_s": count / seconds}), flush=True)


# -- building the sets (with this tree's code), once

def faces_jpegs(count: int) -> "list[bytes]":
    import numpy as np

    from mxnet_pfc.data import synthetic_set
    rng = np.random.default_rng(0)
    ids = synthetic_set.draw_identities(rng, count)
    return [synthetic_set.encode(image) for image in synthetic_set.render(ids, rng)]


def build_records(folder: str, records: int, jpegs: "list[bytes]") -> None:
    from tqdm import tqdm

    from mxnet_pfc.data.records import RecordWriter
    identities = -(-records // IMAGES_PER_IDENTITY)
    writer = RecordWriter(folder, records, identities)
    try:
        for i in tqdm(range(records), desc="train.rec", unit="img", mininterval=5):
            writer.add(i // IMAGES_PER_IDENTITY, jpegs[(i * 7919) % len(jpegs)])
        writer.close()
    except BaseException:
        writer.abort()
        raise


def build_folder(root: str, images: int, sources: "list[str]") -> None:
    from tqdm import tqdm
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    for i in tqdm(range(images), desc="folder", unit="img", mininterval=5):
        identity = os.path.join(tmp, f"id{i // IMAGES_PER_IDENTITY:06d}")
        if i % IMAGES_PER_IDENTITY == 0:
            os.makedirs(identity)
        os.link(sources[(i * 7919) % len(sources)], os.path.join(identity, f"{i % IMAGES_PER_IDENTITY:03d}.jpg"))
    os.replace(tmp, root)


def built(folder: str, stamp: str) -> bool:
    try:
        with open(os.path.join(folder, "BUILT")) as f:
            return f.read() == stamp
    except OSError:
        return False


def mark_built(folder: str, stamp: str) -> None:
    with open(os.path.join(folder, "BUILT"), "w") as f:
        f.write(stamp)


def build(args) -> "tuple[str, str, str]":
    """(big .rec, image folder, synthetic default .rec), built when missing; the plan said first."""
    from mxnet_pfc.data import synthetic_set
    os.makedirs(args.dir, exist_ok=True)
    rec_dir, folder_dir = os.path.join(args.dir, "records"), os.path.join(args.dir, "folder")
    small_dir = os.path.join(args.dir, "synthetic-{}x{}".format(*args.small))
    rec_stamp, folder_stamp = f"records={args.records}\n", f"images={args.images}\n"
    todo_rec, todo_folder = not built(rec_dir, rec_stamp), not built(folder_dir, folder_stamp)
    todo_small = not synthetic_set.is_complete(small_dir, *args.small, val_pairs=20)
    jpegs = faces_jpegs(DISTINCT) if todo_rec or todo_folder else []
    if todo_rec or todo_folder:
        per_record = sum(map(len, jpegs)) / len(jpegs) + 8 + 24 + 4 + 20    # + RecordIO head, label, padding, .idx
        need = (args.records * per_record if todo_rec else 0) + (args.images * 100 if todo_folder else 0)
        free = shutil.disk_usage(args.dir).free
        print(f"build: {args.records:,} records ({per_record / 1e3:.1f} kB each) and a folder of {args.images:,} "
              f"hard links need about {need / 1e9:.1f} GB in {args.dir} ({free / 1e9:.0f} GB free) and about "
              f"{args.records / 15000 / 60 + args.images / 20000 / 60:.0f} minutes on 2 cores; done once",
              flush=True)
        if need * SPARE > free:
            scale = free / (need * SPARE)
            args.records, args.images = int(args.records * scale), int(args.images * scale)
            rec_stamp, folder_stamp = f"records={args.records}\n", f"images={args.images}\n"
            print(f"build: the disk holds less than {SPARE:.0f}x that: scaled down to {args.records:,} records "
                  f"and {args.images:,} images", flush=True)
    if todo_rec and not built(rec_dir, rec_stamp):
        shutil.rmtree(rec_dir, ignore_errors=True)
        build_records(rec_dir, args.records, jpegs)
        mark_built(rec_dir, rec_stamp)
    if todo_folder and not built(folder_dir, folder_stamp):
        shutil.rmtree(folder_dir, ignore_errors=True)
        sources = os.path.join(args.dir, "faces")
        os.makedirs(sources, exist_ok=True)
        paths = []
        for k, jpeg in enumerate(jpegs):
            paths.append(os.path.join(sources, f"face{k:03d}.jpg"))
            with open(paths[-1], "wb") as f:
                f.write(jpeg)
        os.makedirs(folder_dir)
        build_folder(os.path.join(folder_dir, "faces"), args.images, paths)
        mark_built(folder_dir, folder_stamp)
    if todo_small:
        synthetic_set.generate(small_dir, *args.small, val_identities=10, val_pairs=20)
    return (os.path.join(rec_dir, "train.rec"), os.path.join(folder_dir, "faces"),
            os.path.join(small_dir, "train.rec"))


# -- the measurements, each in fresh processes running --code's tree

def environment(code: str) -> dict:
    return {**os.environ, "PYTHONPATH": code, "OMP_NUM_THREADS": "1", "MXNET_OMP_MAX_THREADS": "1",
            "PYTHONWARNINGS": "ignore::DeprecationWarning"}


def ranks(code: str, source: "list[str]", mode: str = "worker") -> "list[dict]":
    """One start-up of WORLD ranks running `code`'s tree, started together; each rank's figures."""
    launched = time.time()
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), mode, *source, "--rank", str(rank),
                               "--launched", repr(launched)], env=environment(code), cwd=code, stdout=subprocess.PIPE,
                              text=True) for rank in range(WORLD)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=3600)
        if proc.returncode:
            raise SystemExit(f"bench-data: a rank failed (exit {proc.returncode}) on {' '.join(source)}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def medians(runs: "list[list[dict]]") -> dict:
    """The median over runs and ranks of each figure."""
    rows = [rank for run in runs for rank in run]
    return {key: statistics.median(row[key] for row in rows) for key in rows[0] if key != "rank"}


def timed_command(code: str, command: "list[str]") -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *command], env=environment(code), cwd=code, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=7200)
    if proc.returncode:
        raise SystemExit(f"bench-data: {' '.join(command)} failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}")
    return time.perf_counter() - started


def measure(args, trees: "dict[str, str]", rec: str, folder: str, small: str) -> "dict[str, dict]":
    """Every figure of each tree ({label: code}), the trees taking turns run by run, so that each
    pair is measured side by side, under the same load."""
    figures = {label: {"label": label, "code": code, "records": args.records, "images": args.images,
                       "small_images": args.small[0] * args.small[1], "repeat": args.repeat}
               for label, code in trees.items()}

    def turns(name: str, source: "list[str]", before=None, mode: str = "worker", repeat: int = args.repeat) -> None:
        runs = {label: [] for label in trees}
        for _ in range(repeat):
            for label, code in trees.items():
                if before:
                    before(label)
                runs[label].append(ranks(code, source(label), mode))
        for label in trees:
            figures[label][name] = medians(runs[label])
            print(f"{label} {name}: {json.dumps(figures[label][name])}", flush=True)

    for name, rec_path in (("small_set", small), ("record_set", rec)):
        if args.repeat > 1:
            for code in trees.values():
                ranks(code, ["--rec", rec_path])          # warm the page cache and the imports
        turns(name, lambda label, rec_path=rec_path: ["--rec", rec_path])

    def output(label: str) -> str:
        return os.path.join(args.dir, f"run-{label}")

    def forget_index(label: str) -> None:
        index = os.path.join(output(label), "images-index.json")
        if os.path.exists(index):
            os.remove(index)

    folder_source = lambda label: ["--images-root", folder, "--output", output(label)]      # noqa: E731
    turns("folder_listing", folder_source, before=forget_index)
    turns("folder_indexed", folder_source)
    for label, code in trees.items():
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "decode", "--rec", rec, "--decode-images",
                               str(args.decode_images)], env=environment(code), cwd=code, stdout=subprocess.PIPE,
                              text=True, check=True, timeout=7200)
        figures[label].update(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"{label} decoding: {figures[label]['decode_images_per_s']:,.0f} images/s", flush=True)
    if not args.skip_commands:
        for label, code in trees.items():
            seconds = timed_command(code, ["mxnet_pfc.data.check", os.path.dirname(rec), "--threads", str(THREADS)])
            figures[label]["check_images_per_s"] = args.records / seconds
            packed = os.path.join(args.dir, f"packed-{label}")
            shutil.rmtree(packed, ignore_errors=True)
            seconds = timed_command(code, ["mxnet_pfc.data.pack", folder, packed, "--threads", str(THREADS)])
            shutil.rmtree(packed, ignore_errors=True)
            figures[label]["pack_images_per_s"] = args.images / seconds
            print(f"{label} data.check: {figures[label]['check_images_per_s']:,.0f} images/s, data.pack: "
                  f"{figures[label]['pack_images_per_s']:,.0f} images/s", flush=True)
    return figures


def report(figures: dict) -> None:
    small, big = figures["small_set"], figures["record_set"]
    listed, indexed = figures["folder_listing"], figures["folder_indexed"]
    lines = [
        f"code {figures['code']} ({figures['label']}), medians of {figures['repeat']} runs x {WORLD} ranks:",
        f"start-up to the first batch: {big['startup_s']:.2f} s for {int(big['images']):,} records "
        f"(index and header {big['open_s']:.2f} s, first batch {big['first_batch_s']:.2f} s) against "
        f"{small['startup_s']:.2f} s for the small set's {int(small['images']):,}: "
        f"{big['startup_s'] / small['startup_s']:.2f}x",
        f"the index's resident memory: {big['index_rss_bytes'] / 1e6:.1f} MB, "
        f"{big['index_rss_bytes'] / big['images']:.1f} bytes a record",
        f"a new epoch's shuffle: {big['shuffle_s'] * 1e3:.0f} ms; a resume mid-epoch to its first batch "
        f"{big['resume_first_batch_s'] * 1e3:.0f} ms (a start at step 0: {big['start_first_batch_s'] * 1e3:.0f} ms)",
        f"image folder of {int(indexed['images']):,}: start-up {listed['startup_s']:.2f} s listing it, "
        f"{indexed['startup_s']:.2f} s from images-index.json; its index "
        f"{indexed['index_rss_bytes'] / indexed['images']:.0f} bytes an image",
        f"decoding, one thread over the whole set: {figures['decode_images_per_s']:,.0f} images/s "
        f"({int(figures['decoded']):,} images)",
    ]
    if "index_only" in figures:
        alone = figures["index_only"]
        lines.append(f"an index of {int(alone['images']):,} records alone: opened in {alone['open_s']:.1f} s, "
                     f"{alone['index_rss_bytes'] / 1e9:.2f} GB resident "
                     f"({alone['index_rss_bytes'] / alone['images']:.1f} bytes a record; "
                     f"peak {alone['peak_rss_bytes'] / 1e9:.2f} GB), an epoch's shuffle {alone['shuffle_s']:.2f} s")
    if "check_images_per_s" in figures:
        lines.append(f"data.check ({THREADS} threads): {figures['check_images_per_s']:,.0f} images/s; "
                     f"data.pack ({THREADS} threads): {figures['pack_images_per_s']:,.0f} images/s")
    print("\n".join(lines), flush=True)


def compare(after: dict, before: dict) -> None:
    """The ratios before / after of the main figures."""
    pairs = [("start-up, RecordIO set", before["record_set"]["startup_s"], after["record_set"]["startup_s"]),
             ("index and header", before["record_set"]["open_s"], after["record_set"]["open_s"]),
             ("index memory", before["record_set"]["index_rss_bytes"], after["record_set"]["index_rss_bytes"]),
             ("shuffle", before["record_set"]["shuffle_s"], after["record_set"]["shuffle_s"]),
             ("resume's first batch", before["record_set"]["resume_first_batch_s"],
              after["record_set"]["resume_first_batch_s"]),
             ("folder start-up from its index", before["folder_indexed"]["startup_s"],
              after["folder_indexed"]["startup_s"]),
             ("folder index memory", before["folder_indexed"]["index_rss_bytes"],
              after["folder_indexed"]["index_rss_bytes"]),
             ("decoding time per image", 1 / before["decode_images_per_s"], 1 / after["decode_images_per_s"])]
    if "check_images_per_s" in after:
        pairs += [("data.check time", 1 / before["check_images_per_s"], 1 / after["check_images_per_s"]),
                  ("data.pack time", 1 / before["pack_images_per_s"], 1 / after["pack_images_per_s"])]
    print(f"{before['label']} / {after['label']}: " + "; ".join(f"{name} {old / max(new, 1e-12):.2f}x"
                                                               for name, old, new in pairs), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/bench_data.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", nargs="?", default="bench", choices=("bench", "worker", "decode", "index"),
                        help="bench (default) builds and measures; worker and decode are its processes")
    parser.add_argument("--dir", default=os.path.join(REPO, "output", "bench-data"),
                        help="where the sets are built once and kept (default: %(default)s)")
    parser.add_argument("--records", type=int, default=1_000_000, help="images of the RecordIO set (default 1M)")
    parser.add_argument("--images", type=int, default=200_000, help="images of the image folder (default 200k)")
    parser.add_argument("--small", type=int, nargs=2, default=SYNTHETIC, metavar=("IDENTITIES", "IMAGES"),
                        help="the small set compared with: identities, images of each (default: the synthetic "
                             "default's %(default)s)")
    parser.add_argument("--code", default=REPO, help="the tree whose mxnet_pfc is measured (default: this one)")
    parser.add_argument("--label", default="after", help="the name of these figures in the results (default after)")
    parser.add_argument("--versus", metavar="CODE",
                        help="another tree (e.g. a worktree of an earlier commit) measured side by side: each run "
                             "of it right after the same run of --code")
    parser.add_argument("--versus-label", default="before", help="the name of --versus's figures (default before)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each start-up; medians (default 3)")
    parser.add_argument("--decode-images", type=int, default=0,
                        help="images decoded by the one-thread measure, spread over the whole set (default 0: all)")
    parser.add_argument("--index-records", type=int, default=42_000_000,
                        help="records of an index opened alone, its .rec sparse (default 42M, WebFace42M's size; "
                             "0: none)")
    parser.add_argument("--build-only", action="store_true", help="build the sets, measure nothing")
    parser.add_argument("--skip-commands", action="store_true", help="leave out data.check and data.pack")
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "results", "data.jsonl"),
                        help="results appended here, one JSON line a run (default: %(default)s)")
    parser.add_argument("--rec", help=argparse.SUPPRESS)
    parser.add_argument("--images-root", dest="images_root", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--launched", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.mode == "worker":
        args.images = args.images_root
        worker(args)
        return 0
    if args.mode == "decode":
        decode_worker(args)
        return 0
    if args.mode == "index":
        index_worker(args)
        return 0
    args.dir = os.path.abspath(args.dir)          # each tree's processes run in that tree (cwd: `python -m`)
    trees = {args.label: os.path.abspath(args.code)}
    if args.versus:
        trees[args.versus_label] = os.path.abspath(args.versus)
    for code in trees.values():
        found = subprocess.run([sys.executable, "-c", "import mxnet_pfc; print(mxnet_pfc.__file__)"],
                               env=environment(code), cwd=code, stdout=subprocess.PIPE, text=True,
                               check=True).stdout.strip()
        print(f"bench-data: measuring {found}", flush=True)
        if not found.startswith(code + os.sep):
            raise SystemExit(f"bench-data: {code}: Python imports mxnet_pfc from {found} instead")
    rec, folder, small = build(args)
    index_rec = ""
    if args.index_records:
        folder_of_index = os.path.join(args.dir, "index-only")
        stamp = f"records={args.index_records}\n"
        if not built(folder_of_index, stamp):
            print(f"build: an index of {args.index_records:,} records needs about "
                  f"{args.index_records * 21 / 1e9:.1f} GB and {args.index_records / 2e6:.0f} s; done once", flush=True)
            build_index_only(folder_of_index, args.index_records)
            mark_built(folder_of_index, stamp)
        index_rec = os.path.join(folder_of_index, "train.rec")
    if args.build_only:
        return 0
    figures = measure(args, trees, rec, folder, small)
    if index_rec:           # --code's tree only: MXNet's reader would hold over 6 GB a rank here
        alone = figures[args.label]["index_only"] = medians([ranks(trees[args.label], ["--rec", index_rec], "index")])
        print(f"{args.label} index_only: {json.dumps(alone)}", flush=True)
    for one in figures.values():
        report(one)
    if args.versus:
        compare(figures[args.label], figures[args.versus_label])
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "a") as f:
        for one in figures.values():
            f.write(json.dumps(one) + "\n")
    print(f"figures appended to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
