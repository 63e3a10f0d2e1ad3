"""python -m mxnet_pfc.clean RUN --rec SET/train.rec --out CLEAN: drop label noise with a sub-center run.

    horovodrun -np 2 -H localhost:2 python -m mxnet_pfc.clean output/run --rec data/train.rec --out data-clean

Sub-center ArcFace's cleaning step (insightface recognition/subcenter_arcface,
drop.py), at the scale the trainer runs: RUN is a run (its latest checkpoint)
or a checkpoint of a sub-center ArcFace run on SET (a run of several sets:
--set names which of them SET is; its head is read). Each rank takes the classes
whose centers it owns (their K sub-centers read from the checkpoint's shards),
embeds their images once with the run's model, finds each class's dominant
sub-center, and keeps the images within --threshold degrees of it
(data/cleaning.py). Rank 0 then writes CLEAN/train.rec, .idx and property
(every kept image once; a class left without images is left out and the
labels renumbered), labels.tsv (old label, new label, kept, dropped),
report.json and angles.png (the histogram of the angles, to choose the
threshold by). Each rank's verdicts are kept in CLEAN/.work: a run stopped
and started again with the same arguments continues; other arguments are
refused unless --start-over. It never writes into SET's folder.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys

import numpy as np
from tqdm import tqdm

from mxnet_pfc.data.cleaning import DEFAULT_THRESHOLD, judge_class
from mxnet_pfc.data.faces import FACE_SIZE, inside
from mxnet_pfc.data.records import RecordWriter, decode_image_record, open_records, unpack_image_record
from mxnet_pfc.eval import plots
from mxnet_pfc.head.memory_bank import read_saved_centers
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.models.inference import Embedder, load_model
from mxnet_pfc.runtime import checkpoints, comm
from mxnet_pfc.runtime.device import add_context_option, choose_context
from mxnet_pfc.runtime.errors import PfcError, exit_status
from mxnet_pfc.runtime.files import RecordFileError, read_json, write_json
from mxnet_pfc.runtime.options import positive_int

log = logging.getLogger("mxnet_pfc.clean")
OWNER = ".cleaned-by-mxnet-pfc"       # written first into the output folder: only such a folder is rewritten
COMPLETE = "COMPLETE"


class CleanError(PfcError, ValueError):
    """An input of the clean command that cannot be used."""


def check_output(out: str, rec: str) -> None:
    """The output folder: not the set's folder or inside it, and empty or one this command made."""
    source = os.path.realpath(os.path.dirname(os.path.abspath(rec)))
    if inside(source, out):
        raise CleanError(f"--out {out} is the set's folder or inside it ({source}): the cleaned set is written "
                         "beside the source, never into it")
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, OWNER)):
        raise CleanError(f"--out {out} holds files this command did not write: choose an empty or new folder")


def fingerprint(ckpt: str, state: checkpoints.State, set_number: int, rec: str, threshold: float) -> dict:
    """What the verdicts depend on; a restart with another one is refused (or --start-over)."""
    stat = os.stat(rec)
    return {"checkpoint": os.path.realpath(ckpt), "saved_at": state.saved_at, "step": state.step, "set": set_number,
            "rec": os.path.realpath(rec), "rec_bytes": stat.st_size, "rec_mtime_ns": stat.st_mtime_ns,
            "threshold": threshold}


def read_fingerprint(path: str) -> "dict | None":
    try:
        return read_json(path)
    except (OSError, RecordFileError):
        return None


def read_labels(reader, keys: np.ndarray, rank: int, world: int) -> np.ndarray:
    """Every image's class id, each rank reading a contiguous 1/world of them (collective)."""
    import mxnet as mx
    part = np.array_split(np.arange(len(keys)), world)[rank]
    mine = np.array([reader.read_label(int(keys[i])) for i in tqdm(part, desc="labels", unit="img", file=sys.stderr,
                                                                      disable=rank != 0, mininterval=5)])
    return comm.allgather(mx.nd.array(mine.reshape(-1), dtype="float64"), name="clean.labels").asnumpy()


def judge_shard(args, checkpoint, reader, records, keys, labels, centers, class_start, num_local, num_classes, K,
                ctx, rank) -> dict:
    """This rank's verdicts on the images of its classes: keys, labels, kept, angles, each class's dominant."""
    symbol, arg_params, aux_params, _ = load_model(checkpoint)
    embedder = Embedder(symbol, ctx, args.batch_size)
    embedder.set_params(arg_params, aux_params)
    mine = np.flatnonzero((labels >= class_start) & (labels < class_start + num_local))
    mine = mine[np.argsort(labels[mine], kind="stable")]
    embeddings = []
    for start in tqdm(range(0, len(mine), args.batch_size), desc="embed", unit="batch", file=sys.stderr,
                      disable=rank != 0, mininterval=5):
        batch = []
        for i in mine[start:start + args.batch_size]:
            key = int(keys[i])
            image, _ = decode_image_record(reader.read(key), key, reader.offset(key), records.rec_path,
                                           num_classes, (FACE_SIZE, FACE_SIZE))
            batch.append(image.transpose(2, 0, 1))
        embeddings.append(embedder(np.stack(batch).astype(np.float32)))
    embeddings = np.concatenate(embeddings) if embeddings else np.zeros((0, centers.shape[1]), np.float32)
    kept, angles = np.zeros(len(mine), bool), np.zeros(len(mine), np.float32)
    dominant = np.full(num_local, -1, np.int16)
    bounds = np.searchsorted(labels[mine], np.arange(class_start, class_start + num_local + 1))
    for c in range(num_local):
        rows = slice(bounds[c], bounds[c + 1])
        if bounds[c + 1] > bounds[c]:
            verdict = judge_class(embeddings[rows], centers[c * K:(c + 1) * K], args.threshold)
            kept[rows], angles[rows], dominant[c] = verdict.kept, verdict.angles, verdict.dominant
    return {"keys": keys[mine].astype(np.int64), "labels": labels[mine].astype(np.int64), "kept": kept,
            "angles": angles, "dominant": dominant, "class_start": np.array(class_start)}


def write_clean_set(args, reader, records, verdicts: "list[dict]", num_classes: int) -> dict:
    """Rank 0: the cleaned set, labels.tsv, report.json and angles.png from every rank's verdicts."""
    keys = np.concatenate([v["keys"] for v in verdicts])
    labels = np.concatenate([v["labels"] for v in verdicts])
    kept = np.concatenate([v["kept"] for v in verdicts])
    angles = np.concatenate([v["angles"] for v in verdicts])
    kept_per_class = np.bincount(labels[kept], minlength=num_classes)
    images_per_class = np.bincount(labels, minlength=num_classes)
    new_label = np.where(kept_per_class > 0, np.cumsum(kept_per_class > 0) - 1, -1)
    order = np.lexsort((keys, labels))
    order = order[kept[order]]
    counts, edges = np.histogram(angles, bins=90, range=(0, 180))
    centers = (edges[:-1] + edges[1:]) / 2
    top = max(1, int(counts.max()) if len(counts) else 1)
    plots.draw(os.path.join(args.out, "angles.png"),
               {"images": (centers, counts), f"threshold {args.threshold:g}": ([args.threshold] * 2, [0, top])},
               (0, 180), (0, top * 1.05), list(range(0, 181, 30)),
               "angle to the class's dominant sub-center (degrees)", "images", f"{args.rec}: {len(keys):,} images")
    if not len(order):          # the histogram says where the angles lie: the threshold to choose instead
        raise CleanError(f"no image of {args.rec} is within {args.threshold:g} degrees of its class's dominant "
                         f"sub-center: nothing would be kept, and no set is written; {args.out}/angles.png shows "
                         "the angles (choose --threshold by it, with --start-over)")
    writer = RecordWriter(args.out, len(order), int((kept_per_class > 0).sum()))
    try:
        for i in tqdm(order, desc="write", unit="img", file=sys.stderr, mininterval=5):
            key = int(keys[i])
            payload = unpack_image_record(reader.read(key), key, reader.offset(key), records.rec_path)[0]
            writer.add(int(new_label[labels[i]]), payload)
        table = "old_label\tnew_label\tkept\tdropped\n" + "".join(
            f"{c}\t{new_label[c]}\t{kept_per_class[c]}\t{images_per_class[c] - kept_per_class[c]}\n"
            for c in range(num_classes))
        writer.close((FACE_SIZE, FACE_SIZE), {"labels.tsv": table.encode()})
    except BaseException:
        writer.abort()
        raise
    report = {"images": int(len(keys)), "kept": int(kept.sum()), "dropped": int((~kept).sum()),
              "classes": num_classes, "classes_left": int((kept_per_class > 0).sum()),
              "classes_left_empty": [int(c) for c in np.flatnonzero((kept_per_class == 0) & (images_per_class > 0))],
              "classes_without_images": int((images_per_class == 0).sum()), "threshold_degrees": args.threshold,
              "angle_histogram": {"edges": edges.tolist(), "counts": counts.tolist()}}
    write_json(os.path.join(args.out, "report.json"), report)
    return report


def run(args) -> None:
    comm.init()
    rank, world = comm.rank(), comm.size()
    with comm.fail_together("reading the run and the set"):
        checkpoint = checkpoints.of_run(args.run)
        state = checkpoints.State.read(checkpoint)
        heads = state.heads()
        if args.set >= len(heads):
            raise CleanError(f"--set {args.set}: the run {checkpoint} trained {len(heads)} set(s), "
                             f"0 .. {len(heads) - 1}")
        reader, records = open_records(args.rec)
        check_output(args.out, args.rec)
        (C, shards), K, D = heads[args.set], int(state.subcenters), state.embedding_size
        if records.num_identities is not None and records.num_identities != C:
            raise CleanError(f"{args.rec} has {records.num_identities} identities, the run {checkpoint}'s set "
                             f"{args.set} {C} classes: name the set the run trained on (--set: which of its sets)")
        class_start, num_local = shard_range(C, rank, world)
        centers = read_saved_centers(checkpoints.head_folder(checkpoint, args.set), shards, class_start, num_local,
                                     D, K)
        work = os.path.join(args.out, ".work")
        wanted = fingerprint(checkpoint, state, args.set, args.rec, args.threshold)
        if rank == 0:
            found = read_fingerprint(os.path.join(work, "fingerprint.json"))
            if found is not None and found != wanted and not args.start_over:
                raise CleanError(f"{args.out} holds the verdicts of another cleaning (another run, set or "
                                 "threshold): pass --start-over to discard them, or choose another --out")
            if args.start_over or found != wanted:
                shutil.rmtree(args.out, ignore_errors=True)
            os.makedirs(work, exist_ok=True)
            open(os.path.join(args.out, OWNER), "w").close()
            write_json(os.path.join(work, "fingerprint.json"), wanted)
    if K == 1 and rank == 0:
        log.warning(f"{checkpoint} has one center per class (not sub-center ArcFace): each image is judged by "
                    "its angle to its class's center")
    mine = os.path.join(work, f"verdicts-rank{rank:05d}-of-{world:05d}.npz")
    if os.path.exists(mine) and rank == 0:
        log.info(f"continuing: the verdicts of {world} rank(s) found so far in {work} are kept")
    labels = read_labels(reader, records.image_records, rank, world)
    with comm.fail_together("judging the images"):
        if not os.path.exists(mine):
            verdicts = judge_shard(args, checkpoint, reader, records, records.image_records, labels, centers,
                                   class_start, num_local, C, K, choose_context(args.context, comm.local_rank()), rank)
            np.savez(mine + ".tmp.npz", **verdicts)
            os.replace(mine + ".tmp.npz", mine)
    with comm.fail_together("writing the cleaned set"):
        if rank == 0:
            verdicts = [dict(np.load(os.path.join(work, f"verdicts-rank{r:05d}-of-{world:05d}.npz")))
                        for r in range(world)]
            report = write_clean_set(args, reader, records, verdicts, C)
            with open(os.path.join(args.out, COMPLETE), "w") as f:
                json.dump(wanted, f)
            print(f"{args.out}: kept {report['kept']:,} of {report['images']:,} images ({report['dropped']:,} "
                  f"dropped, beyond {args.threshold:g} degrees of their class's dominant sub-center); "
                  f"{report['classes_left']:,} of {C:,} classes left ({len(report['classes_left_empty'])} emptied); "
                  f"report.json, labels.tsv, angles.png")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mxnet_pfc.clean", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a sub-center ArcFace run's output folder (its latest checkpoint) or a "
                                    "checkpoint folder")
    parser.add_argument("--rec", required=True, help="the set the run trained on: its train.rec (.idx beside it)")
    parser.add_argument("--set", type=int, default=0,
                        help="a run of several sets: which of them --rec is, 0 for the first (default: %(default)s)")
    parser.add_argument("--out", required=True, help="folder for the cleaned set, beside the source (never in it)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="keep images within this angle of their class's dominant sub-center, in degrees "
                             "(default: %(default)s, the paper's)")
    parser.add_argument("--batch-size", "--batch_size", type=positive_int, default=64,
                        help="images embedded at once (default: %(default)s)")
    parser.add_argument("--start-over", action="store_true",
                        help="discard the verdicts of an earlier cleaning in --out (default: continue one that "
                             "was stopped; refuse one of other arguments)")
    add_context_option(parser)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 < args.threshold <= 180:
        raise SystemExit(f"--threshold {args.threshold}: an angle in degrees, in (0, 180]")
    if args.set < 0:
        raise SystemExit(f"--set {args.set}: a set's number, 0 for the first")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return exit_status("mxnet_pfc.clean", run, args)


if __name__ == "__main__":
    sys.exit(main())
