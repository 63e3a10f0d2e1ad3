"""python -m mxnet_pfc.overlap RUN --out OUT: the identities the sets of a run share, found by their centers.

    horovodrun -np 2 -H localhost:2 python -m mxnet_pfc.overlap output/run --out overlap [--merge merged]

RUN is a run of several sets (--rec A --rec B ...: one head per set; its latest
checkpoint) or one of its checkpoints. The same person in two sets shows as two
classes whose centers point the same way: for every ordered pair of sets (A, B),
each rank reads its share of A's and of B's centers from the checkpoint's shards
(any number of ranks, whatever the run's), and head/center_search.py finds each
A class's --top-k most similar B classes, blockwise over the ranks: no rank
holds more than one block of another rank's centers (docs/DESIGN.md 2.14).

Sub-centers (sub-center ArcFace, K per class): two classes' cosine is the largest
over their K x K pairs of sub-centers. A sub-center is one mode of its class
(a pose, an age, or the noise it gathered); the same person in two sets shares
at least its clean mode, and the largest pair keeps the meaning of a cosine of
two centers, so one threshold serves K = 1 and K = 3 alike (the mean of the K
would shrink with every noise mode). The price: K^2 times the products, and a
noise mode that gathered one other person can match that person: clean a noisy
set first (mxnet_pfc.clean), then look for overlap.

Rank 0 writes OUT/overlap.tsv (set, class, set, class, cosine: each pair at or
above --threshold once), cosines.png (the histogram of every class's best cosine
to each other set, to choose the threshold by) and report.json. With --merge
SET_OUT it then writes one RecordIO set there (train.rec, .idx, property: every
image of every set once), each overlapping group (pairs above the threshold,
joined transitively) one label, with label_map.tsv (set, class, new label) and
merged.tsv (each merged group's members). Neither folder may be a set's folder
or inside one.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.faces import FACE_SIZE, inside
from mxnet_pfc.data.folders import scan
from mxnet_pfc.data.iterators import TrainingSet, training_sets
from mxnet_pfc.data.records import DataError, RecordWriter, open_records, unpack_image_record
from mxnet_pfc.eval import plots
from mxnet_pfc.head.center_search import most_similar
from mxnet_pfc.head.memory_bank import read_saved_centers
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.runtime import checkpoints, comm
from mxnet_pfc.runtime.device import add_context_option, choose_context
from mxnet_pfc.runtime.errors import PfcError, exit_status
from mxnet_pfc.runtime.files import write_json
from mxnet_pfc.runtime.options import positive_int

log = logging.getLogger("mxnet_pfc.overlap")
# Two centers of the same person, trained in two heads, both lie near that person's mean embedding: cosines of
# 0.7-0.9 after a full run. Unrelated people's centers are nearly orthogonal: at D = 512 a random pair's cosine
# has a spread of 1/sqrt(512) = 0.044, the best of 2M random ones about 0.25, and trained look-alikes reach 0.3-0.4.
# 0.5 lies in the valley between; cosines.png shows where the valley of a given run is.
DEFAULT_THRESHOLD = 0.5
DEFAULT_TOP_K = 5
BINS = 200                       # of the cosine histogram over [-1, 1]
OWNER = ".written-by-mxnet-pfc-overlap"     # written first into an output folder: only such a folder is rewritten


class OverlapError(PfcError, ValueError):
    """An input of the overlap command that cannot be used."""


@dataclass(frozen=True)
class SetHead:
    """Set `index` of the run: where its images are (data.iterators.training_sets's; None if the configuration
    does not say) and its head in the checkpoint."""
    index: int
    source: "TrainingSet | None"
    num_classes: int
    shards: list
    folder: str                  # of its bank's shard files

    @property
    def kind(self) -> str:
        return self.source.kind if self.source else ""

    @property
    def path(self) -> str:
        return self.source.path if self.source else ""

    def data_folder(self) -> str:
        """The folder holding the set's files (a .rec's folder, an image folder itself)."""
        path = os.path.abspath(self.path)
        return os.path.dirname(path) if self.kind == "rec" else path

    def describe(self) -> str:
        return f"set {self.index} ({self.source or 'source not recorded'}, {self.num_classes:,} classes)"


def run_sets(ckpt: str, state: checkpoints.State) -> "list[SetHead]":
    """The sets of the run whose checkpoint is `ckpt`; refuses a run of one set."""
    heads = state.heads()
    if len(heads) < 2:
        raise OverlapError(f"{ckpt}: a run of one set (no extra_heads in state.json): overlap compares the sets "
                           "of a run of several (--rec A/train.rec --rec B/train.rec ...)")
    config = state.config
    try:
        named = training_sets(config.get("rec", ""), config.get("images", ""), config.get("extra_sets") or ())
    except DataError:
        named = []
    if len(named) != len(heads):            # a configuration that does not name the sets: the search still runs
        named = [None] * len(heads)
    return [SetHead(s, named[s], count, shards, checkpoints.head_folder(ckpt, s))
            for s, (count, shards) in enumerate(heads)]


def check_output(out: str, sets: "list[SetHead]", what: str) -> None:
    """An output folder: not a set's folder or inside one, and empty or one this command wrote."""
    for head in sets:
        if not head.path:
            continue
        source = os.path.realpath(head.data_folder())
        if inside(source, out):
            raise OverlapError(f"{what} {out} is the folder of {head.describe()} or inside it ({source}): "
                               "write beside the sets, never into them")
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, OWNER)):
        raise OverlapError(f"{what} {out} holds files this command did not write: choose an empty or new folder")


def claim(out: str) -> None:
    """Rank 0: the output folder, marked as this command's."""
    os.makedirs(out, exist_ok=True)
    open(os.path.join(out, OWNER), "w").close()


def my_classes(head: SetHead, rank: int, world: int) -> "tuple[int, int]":
    if head.num_classes < world:
        raise OverlapError(f"{head.describe()}: fewer classes than the {world} ranks; run on at most "
                           f"{head.num_classes} rank(s)")
    return shard_range(head.num_classes, rank, world)


def class_top(cos: np.ndarray, ids: np.ndarray, K: int, k: int) -> "tuple[np.ndarray, np.ndarray]":
    """Per A class, its k best B classes by the largest sub-center pair's cosine, from each of its K rows'
    k*K best B rows (cos, row ids; -1 none). Exact: a class among the k best has its best row among its A
    row's k*K best, since only the rows of the k - 1 classes above it (K each) can rank above that row."""
    if K == 1:
        return cos, ids
    n = len(cos) // K
    cos, ids = cos.reshape(n, -1), np.where(ids >= 0, ids // K, -1).reshape(n, -1)
    order = np.lexsort((-cos, ids), axis=1)              # by class, its best row first
    cos, ids = np.take_along_axis(cos, order, 1), np.take_along_axis(ids, order, 1)
    repeat = np.zeros_like(ids, dtype=bool)
    repeat[:, 1:] = ids[:, 1:] == ids[:, :-1]
    cos = np.where(repeat | (ids < 0), -np.inf, cos)
    ids = np.where(repeat, -1, ids)
    order = np.lexsort((np.where(ids < 0, np.iinfo(np.int64).max, ids), -cos), axis=1)[:, :k]
    return np.take_along_axis(cos, order, 1), np.take_along_axis(ids, order, 1)


def gather_pairs(rows: np.ndarray, name: str) -> np.ndarray:
    """Every rank's (a, b, cosine) rows on every rank (float64: class ids exact to 2^53). Each rank adds a row
    of -1 so that none sends an empty array; they are dropped."""
    import mxnet as mx
    mine = np.concatenate([np.full((1, 3), -1.0), rows.reshape(-1, 3)])
    every = comm.allgather(mx.nd.array(mine, dtype="float64"), name=name).asnumpy()
    return every[every[:, 0] >= 0]


def search(args, sets: "list[SetHead]", state: checkpoints.State, ctx, rank: int, world: int) -> dict:
    """Every ordered pair of sets searched (collective): {(a, b): {"pairs": (n, 3) rows of A class, B class,
    cosine at or above the threshold, "histogram": counts of the A classes' best cosines}}."""
    K, width = int(state.subcenters), state.embedding_size
    with comm.fail_together("reading the centers"):
        mine = [my_classes(head, rank, world) for head in sets]
        centers = [read_saved_centers(head.folder, head.shards, start, count, width, K)
                   for head, (start, count) in zip(sets, mine)]
    found = {}
    for a in sets:
        for b in sets:
            if a.index == b.index:
                continue
            bar = tqdm(total=b.num_classes * K, desc=f"set {a.index} -> set {b.index}", unit="center",
                       file=sys.stderr, disable=rank != 0, mininterval=5)
            cos, ids = most_similar(centers[a.index], centers[b.index], mine[b.index][0] * K, args.top_k * K,
                                    args.block_rows, bar.update, ctx)
            bar.close()
            cos, ids = class_top(cos, ids, K, args.top_k)
            best = np.clip(cos[:, 0], -1, 1) if len(cos) else np.zeros(0, np.float32)
            counts = np.histogram(best, bins=BINS, range=(-1, 1))[0]
            counts = np.sum(comm.gather_rows(counts.tolist()), axis=0).astype(np.int64)
            row, place = np.nonzero((cos >= args.threshold) & (ids >= 0))
            local = np.stack([row + mine[a.index][0], ids[row, place], cos[row, place]], axis=1)
            found[a.index, b.index] = {"pairs": gather_pairs(local, f"overlap.{a.index}.{b.index}"),
                                       "histogram": counts}
    return found


def unordered_pairs(found: dict) -> "dict[tuple, float]":
    """{(set, class, set, class): cosine} with the lower set first, each pair once (found from either side)."""
    pairs = {}
    for (a, b), result in sorted(found.items()):
        for x, y, cos in result["pairs"]:
            key = (a, int(x), b, int(y)) if a < b else (b, int(y), a, int(x))
            pairs.setdefault(key, float(cos))
    return pairs


def write_findings(args, sets: "list[SetHead]", found: dict, pairs: dict, ckpt: str, K: int) -> dict:
    """Rank 0: overlap.tsv, cosines.png and report.json in --out; the report."""
    lines = "".join(f"{sa}\t{a}\t{sb}\t{b}\t{cos:.4f}\n" for (sa, a, sb, b), cos in sorted(pairs.items()))
    with open(os.path.join(args.out, "overlap.tsv.tmp"), "w") as f:
        f.write("set\tclass\tset\tclass\tcosine\n" + lines)
    os.replace(os.path.join(args.out, "overlap.tsv.tmp"), os.path.join(args.out, "overlap.tsv"))
    edges = np.linspace(-1, 1, BINS + 1)
    middles = (edges[:-1] + edges[1:]) / 2
    curves = {f"set {a} -> set {b}": (middles, np.log10(1 + result["histogram"]))
              for (a, b), result in sorted(found.items())}
    top = max(1.0, max(float(y.max()) for _, y in curves.values()))
    curves[f"threshold {args.threshold:g}"] = ([args.threshold] * 2, [0, top])
    plots.draw(os.path.join(args.out, "cosines.png"), curves, (-0.2, 1), (0, top * 1.05),
               [-0.2, 0, 0.2, 0.4, 0.6, 0.8, 1], "best cosine to another set's classes", "log10(1 + classes)",
               f"{len(pairs):,} pairs at cosine >= {args.threshold:g}")
    per_pair = []
    for a in sets:
        for b in sets[a.index + 1:]:
            here = [key for key in pairs if key[0] == a.index and key[2] == b.index]
            per_pair.append({"sets": [a.index, b.index], "pairs": len(here),
                             "classes_matched": [len({key[1] for key in here}), len({key[3] for key in here})]})
    report = {"checkpoint": os.path.realpath(ckpt), "threshold": args.threshold, "top_k": args.top_k,
              "subcenters": K, "pairs": len(pairs),
              "sets": [{"set": s.index, "source": str(s.source or ""), "classes": s.num_classes} for s in sets],
              "pairs_of_sets": per_pair,
              "best_cosine_histogram": {"edges": edges.tolist(), **{
                  f"{a}->{b}": r["histogram"].tolist() for (a, b), r in sorted(found.items())}}}
    write_json(os.path.join(args.out, "report.json"), report)
    return report


def groups(sets: "list[SetHead]", pairs: dict) -> "list[np.ndarray]":
    """Each set's classes' group (union-find over the pairs), the groups numbered by their first member in
    (set, class) order."""
    offsets = np.cumsum([0] + [s.num_classes for s in sets])
    parent = np.arange(offsets[-1])

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    for sa, a, sb, b in pairs:
        x, y = root(offsets[sa] + a), root(offsets[sb] + b)
        parent[max(x, y)] = min(x, y)             # the root is the group's first member
    roots = np.array([root(i) for i in range(offsets[-1])])
    number = np.cumsum(roots == np.arange(offsets[-1])) - 1
    group = number[roots]
    return [group[offsets[s]:offsets[s + 1]] for s in range(len(sets))]


class SetImages:
    """A set's images: their labels, and each one's encoded bytes (a RecordIO set's or an image folder's)."""

    def __init__(self, head: SetHead):
        self.head = head
        if head.kind == "rec":
            self.reader, records = open_records(head.path)
            self.rec_path, self.keys = records.rec_path, records.image_records
            self.labels = np.array([self.reader.read_label(int(key)) for key in tqdm(
                self.keys, desc=f"set {head.index} labels", unit="img", file=sys.stderr, mininterval=5)],
                dtype=np.int64)
            self.names = None
        elif head.kind == "images":
            self.index = scan(head.path)
            self.labels = self.index.labels.astype(np.int64)
            self.names = self.index.identities
        else:
            raise OverlapError(f"{head.describe()}: --merge reads sets given as rec:PATH or images:PATH (a .rec "
                               "set or an image folder); the run's configuration does not say where this one is")
        if len(self.labels) and not 0 <= self.labels.min() <= self.labels.max() < head.num_classes:
            raise OverlapError(f"{head.describe()}: its images carry labels up to {self.labels.max()}, its head "
                               f"has {head.num_classes} classes: not the set the run trained on")

    def payload(self, i: int) -> bytes:
        if self.names is not None:
            return self.index.read(i)[0]
        key = int(self.keys[i])
        return unpack_image_record(self.reader.read(key), key, self.reader.offset(key), self.rec_path)[0]

    def name(self, label: int) -> str:
        return f"{self.head.index}:{label}" + (f"({self.names[label]})" if self.names is not None else "")


def write_merged(folder: str, sets: "list[SetHead]", pairs: dict) -> dict:
    """Rank 0: the merged set in `folder`: every image of every set once, each group one label (the groups
    holding images numbered 0 .. G-1 in order of their first member), label_map.tsv and merged.tsv beside."""
    group = groups(sets, pairs)
    images = [SetImages(head) for head in sets]
    held = np.zeros(max(int(g.max()) for g in group) + 1, dtype=np.int64)
    for g, imgs in zip(group, images):
        np.add.at(held, g[imgs.labels], 1)
    label_of_group = np.where(held > 0, np.cumsum(held > 0) - 1, -1)
    new = [label_of_group[g] for g in group]            # each set's classes' new labels (-1: no images)
    # images in label order, then by set, then as each set holds them
    labels = np.concatenate([new[s][imgs.labels] for s, imgs in enumerate(images)])
    set_of = np.concatenate([np.full(len(imgs.labels), s) for s, imgs in enumerate(images)])
    place = np.concatenate([np.arange(len(imgs.labels)) for imgs in images])
    order = np.lexsort((place, set_of, labels))
    members: "dict[int, list[str]]" = {}
    for s, imgs in enumerate(images):
        for c in range(sets[s].num_classes):
            members.setdefault(int(new[s][c]), []).append(imgs.name(c))
    merged = {label: names for label, names in members.items() if label >= 0 and len(names) > 1}
    label_map = "set\tclass\tnew_label\n" + "".join(f"{s}\t{c}\t{new[s][c]}\n" for s in range(len(sets))
                                                     for c in range(sets[s].num_classes))
    merged_tsv = "new_label\tmembers\n" + "".join(f"{label}\t{' '.join(names)}\n"
                                                  for label, names in sorted(merged.items()))
    count = int((held > 0).sum())
    writer = RecordWriter(folder, len(order), count)
    try:
        for i in tqdm(order, desc="merge", unit="img", file=sys.stderr, mininterval=5):
            writer.add(int(labels[i]), images[set_of[i]].payload(int(place[i])))
        writer.close((FACE_SIZE, FACE_SIZE), {"label_map.tsv": label_map.encode(), "merged.tsv": merged_tsv.encode()})
    except BaseException:
        writer.abort()
        raise
    return {"folder": os.path.realpath(folder), "images": len(order), "labels": count,
            "merged_groups": len(merged), "classes_merged": sum(len(names) for names in merged.values()),
            "classes_without_images": int(sum((n < 0).sum() for n in new))}


def run(args) -> None:
    comm.init()
    rank, world = comm.rank(), comm.size()
    with comm.fail_together("reading the run"):
        ckpt = checkpoints.of_run(args.run)
        state = checkpoints.State.read(ckpt)
        sets = run_sets(ckpt, state)
        for folder, what in ((args.out, "--out"), (args.merge, "--merge")):
            if folder:
                check_output(folder, sets, what)
        if args.merge and not all(head.path for head in sets):
            raise OverlapError(f"--merge: the run's configuration does not name every set's images "
                               f"({'; '.join(head.describe() for head in sets)})")
        ctx = choose_context(args.context, comm.local_rank())
        if rank == 0:
            for folder in (args.out, args.merge):
                if folder:
                    claim(folder)
    if rank == 0:
        log.info(f"{ckpt}: {len(sets)} sets, {state.subcenters} center(s) per class, embedding size "
                 f"{state.embedding_size}; searching on {world} rank(s)")
        for head in sets:
            log.info(f"  {head.describe()}")
    found = search(args, sets, state, ctx if ctx.device_type == "gpu" else None, rank, world)
    with comm.fail_together("writing the findings"):
        if rank == 0:
            pairs = unordered_pairs(found)
            report = write_findings(args, sets, found, pairs, ckpt, int(state.subcenters))
            for entry in report["pairs_of_sets"]:
                a, b = entry["sets"]
                log.info(f"set {a} and set {b}: {entry['pairs']:,} pairs at cosine >= {args.threshold:g} "
                         f"({entry['classes_matched'][0]:,} and {entry['classes_matched'][1]:,} classes)")
            print(f"{args.out}: overlap.tsv ({len(pairs):,} pairs), cosines.png, report.json")
            if args.merge:
                report["merged"] = write_merged(args.merge, sets, pairs)
                write_json(os.path.join(args.out, "report.json"), report)
                done = report["merged"]
                print(f"{args.merge}: {done['images']:,} images under {done['labels']:,} labels "
                      f"({done['merged_groups']:,} groups merge {done['classes_merged']:,} classes); "
                      f"label_map.tsv, merged.tsv")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.overlap", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the output folder of a run of several sets (its latest checkpoint) or one "
                                    "of its checkpoint folders")
    parser.add_argument("--out", required=True,
                        help="folder for overlap.tsv, cosines.png and report.json (not inside a set's folder)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="pairs of classes whose centers' cosine is at least this are the same identity "
                             "(default: %(default)s; choose it by cosines.png)")
    parser.add_argument("--top-k", "--top_k", type=positive_int, default=DEFAULT_TOP_K,
                        help="most similar classes of each other set kept per class, so at most this many "
                             "pairs per class and set (default: %(default)s)")
    parser.add_argument("--block-rows", "--block_rows", type=positive_int, default=65536,
                        help="center rows broadcast at a time: each rank holds one such block of another "
                             "rank's centers, block rows x embedding size x 4 bytes (default: %(default)s)")
    parser.add_argument("--merge", default="", metavar="FOLDER",
                        help="also write one RecordIO set there, every overlapping group one label, with "
                             "label_map.tsv and merged.tsv (default: none)")
    add_context_option(parser, "compute the products of the centers")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not -1 <= args.threshold <= 1:
        raise SystemExit(f"--threshold {args.threshold}: a cosine, in [-1, 1]")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return exit_status("mxnet_pfc.overlap", run, args)


if __name__ == "__main__":
    sys.exit(main())
