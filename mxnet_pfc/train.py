"""The trainer: python -m mxnet_pfc.train [--dataset D --network N --loss L --FIELD VALUE ...]

One process per device; launch several with `horovodrun ... bash config.sh` or
`bash run.sh`. Without a launcher it trains alone (world size 1).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass

import mxnet as mx
from tqdm import tqdm

import symbols

from . import checkpoint, comm, config as config_lib, run_lock, seeding, stops
from .checkpoint import CheckpointError
from .data import synthetic
from .data.iterators import DummyIter, RecordIter, count_classes
from .data.records import DataError
from .eval.verification import BinFormatError, Verifier
from .export import export_model
from .files import atomic_path, write_json
from .inference import ModelError, inference_symbol, load_model
from .margin import CombinedMarginLoss
from .module import LRSchedule, PartialFCModule
from .partial_fc import NonFiniteLossError, PartialFC, PartialFCInputError

log = logging.getLogger("mxnet_pfc")


def setup_logging(output: str, rank: int) -> str:
    """A log file per rank (OUTPUT/logs/rankR.log); rank 0 also prints to stdout."""
    os.makedirs(os.path.join(output, "logs"), exist_ok=True)
    path = os.path.join(output, "logs", f"rank{rank}.log")
    formatter = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s", "%H:%M:%S")
    handlers = [logging.FileHandler(path)]
    if rank == 0:
        handlers.append(logging.StreamHandler(sys.stdout))
    for handler in handlers:
        handler.setFormatter(formatter)
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    return path


def choose_context(kind: str) -> mx.Context:
    """GPU local_rank when there are GPUs (or when asked), else the CPU."""
    gpus = mx.context.num_gpus()
    if kind == "gpu" and gpus == 0:
        raise RuntimeError("context = gpu, but MXNet sees no GPU")
    if kind == "cpu" or gpus == 0:
        return mx.cpu()
    return mx.gpu(comm.local_rank() % gpus)


def ensure_synthetic_set(cfg: config_lib.Config, wait_seconds: float = 1800) -> None:
    """Generate the synthetic set once per host (local rank 0); the other local ranks wait for it.

    The wait is on files, not a collective (no stall warnings). A failed
    generation leaves FAILED with its reason, so the waiting ranks stop at once.
    """
    folder = os.path.dirname(cfg.rec) or "."
    failed = os.path.join(folder, "FAILED")
    wanted = (folder, cfg.synthetic_identities, cfg.synthetic_images_per_identity, cfg.synthetic_val_pairs)
    if synthetic.is_complete(*wanted):
        return
    synthetic.check_claimable(folder)       # every rank: never generate over a set the tool did not write
    if comm.local_rank() == 0:
        log.info(f"generating the synthetic set in {folder} ({cfg.synthetic_identities} identities x "
                 f"{cfg.synthetic_images_per_identity} images, held-out val.bin); done once")
        started = time.time()
        synthetic.claim_folder(folder)
        if os.path.exists(failed):
            os.remove(failed)
        try:
            synthetic.generate(folder, cfg.synthetic_identities, cfg.synthetic_images_per_identity,
                               val_identities=max(2, cfg.synthetic_val_pairs // 4), val_pairs=cfg.synthetic_val_pairs)
        except Exception as error:
            with open(failed, "w") as f:
                f.write(f"{type(error).__name__}: {error}\n")
            raise
        log.info(f"synthetic set written in {time.time() - started:.0f} s")
        return
    deadline = time.time() + wait_seconds
    while not synthetic.is_complete(*wanted):
        if os.path.exists(failed):
            raise DataError(f"{folder}: generating the synthetic set failed on local rank 0: {open(failed).read().strip()}")
        if time.time() > deadline:
            raise DataError(f"{folder}: the synthetic set did not appear within {wait_seconds:.0f} s")
        time.sleep(1)


class MetricsLog:
    """Rank 0's figures: JSON lines in OUTPUT/metrics.jsonl and TensorBoard events (mxboard).

    One record per step: a run resumed at step S first drops the records of
    steps after S (the lost run's, which it recomputes) from metrics.jsonl, and
    writes TensorBoard's restart marker (a SessionLog START event at step S + 1),
    on which TensorBoard discards the earlier events of steps S + 1 and later.
    """

    def __init__(self, output: str, tensorboard: bool, start_step: int = 0, saved_step: "int | None" = None):
        """start_step: the first step this run trains is start_step + 1; saved_step: the checkpoint's
        step in its own run's numbering (they differ when resuming on another global batch)."""
        self.path = os.path.join(output, "metrics.jsonl")
        self._keep_until(start_step if saved_step is None else saved_step)
        self._file = open(self.path, "a")
        self._board = None
        if tensorboard:
            try:
                from mxboard import SummaryWriter
                from mxboard.proto.event_pb2 import Event, SessionLog
                self._board = SummaryWriter(logdir=os.path.join(output, "tensorboard"))
                self._board._file_writer.add_event(Event(wall_time=time.time(), step=start_step + 1,
                                                         session_log=SessionLog(status=SessionLog.START)))
            except Exception as error:     # mxboard is optional for training
                log.warning(f"TensorBoard logging off: {error}")

    def _keep_until(self, step: int) -> None:
        """Rewrite metrics.jsonl without the records of steps after `step` (and half-written lines)."""
        if not os.path.exists(self.path):
            return
        kept = []
        for line in open(self.path):
            try:
                if json.loads(line)["step"] <= step:
                    kept.append(line if line.endswith("\n") else line + "\n")
            except (ValueError, KeyError, TypeError):
                continue
        with atomic_path(self.path) as tmp:
            with open(tmp, "w") as f:
                f.writelines(kept)

    def write(self, step: int, **values) -> None:
        self._file.write(json.dumps({"step": step, "time": round(time.time(), 3), **values}) + "\n")
        self._file.flush()
        if self._board is not None:
            for name, value in values.items():
                if isinstance(value, (int, float)):
                    self._board.add_scalar(name, value, global_step=step)

    def close(self) -> None:
        self._file.close()
        if self._board is not None:
            self._board.close()


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


@dataclass(frozen=True)
class RunPlan:
    """What this run will do, fixed at start-up from the configuration, the data and the world size."""
    num_images: int
    global_batch: int
    steps_per_epoch: int
    max_update: int            # the step the run ends at
    lr: float                  # peak learning rate for the global batch
    context: str
    length_note: str = ""      # how max_update was carried over from a checkpoint, if it was


def resolve_config(cfg: config_lib.Config, world: int) -> config_lib.Config:
    """The configuration completed from the data (num_classes) and checked against the world size."""
    if cfg.rec and cfg.num_classes == 0:
        cfg = dataclasses.replace(cfg, num_classes=count_classes(cfg.rec))
        log.info(f"num_classes = {cfg.num_classes}, read from the set {cfg.rec}")
    if cfg.num_classes < world:
        raise config_lib.ConfigError(f"num_classes = {cfg.num_classes} is below the number of ranks ({world}): "
                                     f"every rank must own at least one class; use at most {cfg.num_classes} ranks")
    return cfg


def run_length(cfg: config_lib.Config, steps_per_epoch: int, global_batch: int, saved: "dict | None"):
    """(max_update, note): the step the run ends at.

    A run resumed on another global batch (another number of ranks) with the
    same --max_update keeps its length in samples, as its position is kept:
    the checkpoint's end step x its global batch / this global batch, rounded
    up. A --max_update that differs from the checkpoint's counts steps of this
    run's global batch. Without --max_update the length is num_epoch epochs.
    """
    if not cfg.max_update:
        return max(1, math.ceil(cfg.num_epoch * steps_per_epoch)), ""
    if saved is None or saved["global_batch"] == global_batch or saved["config"].get("max_update") != cfg.max_update:
        return cfg.max_update, ""
    samples = saved["max_update"] * saved["global_batch"]
    max_update = math.ceil(samples / global_batch)
    return max_update, (f"--max_update {cfg.max_update} kept in samples: the checkpoint's run ends after "
                        f"{saved['max_update']} steps of {saved['global_batch']} = {samples} samples, "
                        f"{max_update} steps of {global_batch} here")


def build_local(cfg: config_lib.Config, rank: int, world: int):
    """What this rank sets up without collectives: data, context, schedule, symbol, verifier.

    Kept apart so that a failure here is agreed on before any collective starts.
    """
    if cfg.rec and cfg.synthetic_identities > 0:
        ensure_synthetic_set(cfg)
    ctx = choose_context(cfg.context)
    if cfg.fp16 and ctx.device_type != "gpu":
        raise config_lib.ConfigError("fp16 = True needs a GPU context (MXNet has no fast float16 convolutions on CPU)")
    if cfg.rec:
        data = RecordIter(cfg.rec, cfg.batch_size, cfg.num_classes, rank, world, seed=cfg.seed,
                          image_size=(cfg.image_size, cfg.image_size), threads=cfg.decode_threads)
        num_images = data.num_images
    else:
        num_images = cfg.num_images
        data = DummyIter(cfg.batch_size, cfg.num_classes, rank, cfg.seed, (cfg.image_size, cfg.image_size),
                         steps_per_epoch=max(1, num_images // (cfg.batch_size * world)))
    global_batch = cfg.batch_size * world
    steps_per_epoch = data.steps_per_epoch
    symbol = symbols.get_symbol(cfg.network, cfg.embedding_size, cfg.dropout, cfg.fp16)
    resume = read_resume(cfg, rank, world, symbol, steps_per_epoch, global_batch) if cfg.resume else None
    max_update, note = run_length(cfg, steps_per_epoch, global_batch, resume["state"] if resume else None)
    if resume is not None and resume["step"] >= max_update:
        raise config_lib.ConfigError(
            f"nothing to train: checkpoint {resume['path']} is at step {resume['step']} (global batch "
            f"{global_batch}), and this run ends at step {max_update}"
            f"{' (' + note + ')' if note else ''}. To train longer, raise --max_update (or --num_epoch)")
    lr = cfg.lr * global_batch / cfg.lr_base_batch
    schedule = LRSchedule(lr, max_update, cfg.lr_schedule, [round(e * steps_per_epoch) for e in cfg.decay_epochs],
                          cfg.lr_factor, round(cfg.warmup_epochs * steps_per_epoch), cfg.poly_power)
    verifier = None
    if rank == 0 and cfg.val_targets:
        eval_symbol = symbol if cfg.fp16 else inference_symbol(cfg.network, cfg.embedding_size)
        verifier = Verifier(cfg.val_targets, eval_symbol, ctx, cfg.val_batch_size, cfg.image_size)
    plan = RunPlan(num_images, global_batch, steps_per_epoch, max_update, lr, str(ctx), note)
    data.seek(resume["step"] if resume else 0)
    return ctx, data, schedule, symbol, verifier, plan, resume


def read_resume(cfg: config_lib.Config, rank: int, world: int, symbol: mx.sym.Symbol, steps_per_epoch: int,
                global_batch: int) -> dict:
    """The checkpoint to resume from, checked against this run, with this rank's backbone parameters."""
    path = checkpoint.locate(os.path.join(cfg.output, "checkpoints"), cfg.resume)
    state = checkpoint.read_state(path)
    checkpoint.check_compatible(state, path, cfg.num_classes, cfg.embedding_size, cfg.network)
    arg_params, aux_params = checkpoint.load_backbone(path, rank, same_world=state["world_size"] == world)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(cfg.batch_size, 3, cfg.image_size, cfg.image_size))
    checkpoint.check_params(arg_params, {n: s for n, s in zip(symbol.list_arguments(), arg_shapes) if n != "data"},
                            path, cfg.network)
    checkpoint.check_params(aux_params, dict(zip(symbol.list_auxiliary_states(), aux_shapes)), path, cfg.network)
    step, epoch = checkpoint.resume_position(state, steps_per_epoch, global_batch)
    return dict(path=path, state=state, arg_params=arg_params, aux_params=aux_params, step=step, epoch=epoch)


def restore(resume: dict, module: PartialFCModule, head: PartialFC) -> None:
    """Backbone, its optimizer state and this rank's centers and momentum, from the checkpoint."""
    path = resume["path"]
    module.set_params(resume["arg_params"], resume["aux_params"])
    try:
        module.load_optimizer_states(os.path.join(path, "optimizer.states"))
    except Exception as error:       # a pickle of NDArrays: anything can go wrong in a damaged file
        raise CheckpointError(f"{path}/optimizer.states: {error}") from None
    checkpoint.load_centers(path, resume["state"], head)


def claim_output(output: str, rank: int):
    """Rank 0's hold on the output folder (None on other ranks), agreed on by every rank.

    Runs before any rank writes into the folder (its logs included): a second
    run into a folder in use is refused here, on every rank, having written nothing.
    """
    lock, error = None, None
    if rank == 0:
        try:
            lock = run_lock.acquire(output)
            os.makedirs(os.path.join(output, "logs"), exist_ok=True)
            stops.clear_records(os.path.join(output, "logs"))
        except Exception as caught:
            error = caught
    try:
        comm.raise_if_any_failed(error, "starting the run")
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock


def build_distributed(cfg: config_lib.Config, ctx: mx.Context, schedule: LRSchedule, symbol: mx.sym.Symbol):
    """The head and the module: their constructors run collectives (checks, broadcast)."""
    margin = CombinedMarginLoss(cfg.margin_s, cfg.margin_m1, cfg.margin_m2, cfg.margin_m3)
    head = PartialFC(margin, cfg.embedding_size, cfg.num_classes, cfg.sample_rate, ctx, lr=schedule(0),
                     momentum=cfg.momentum, wd=cfg.weight_decay)
    module = PartialFCModule(symbol, head, cfg.batch_size, ctx, cfg.momentum, cfg.weight_decay, cfg.fp16,
                             cfg.image_size)
    return head, module


def train(cfg: config_lib.Config) -> dict:
    """Run the configured training on this rank; returns rank 0's final figures (others: {})."""
    comm.init()
    rank, world = comm.rank(), comm.size()
    lock = claim_output(cfg.output, rank)
    try:
        return _train(cfg, rank, world, lock)
    finally:
        if lock is not None:
            lock.release()


def _train(cfg: config_lib.Config, rank: int, world: int, lock) -> dict:
    log_path = setup_logging(cfg.output, rank)
    stops.start(os.path.join(cfg.output, "logs"))
    if rank == 0 and lock.took_over:
        log.info(f"took over the output folder from a run that is gone ({lock.took_over})")
    error = None
    try:
        cfg = resolve_config(cfg, world)
        ctx, data, schedule, symbol, verifier, plan, resume = build_local(cfg, rank, world)
    except Exception as caught:         # every rank learns that setup failed somewhere
        log.error(f"setup failed: {caught}")
        error = caught
    comm.raise_if_any_failed(error, "setup")
    if rank == 0:
        config_lib.save(cfg, os.path.join(cfg.output, "config.json"))
        log.info(f"mxnet-pfc: {world} rank(s); configuration (also in {cfg.output}/config.json):\n"
                 + config_lib.describe(cfg))
    start_step = resume["step"] if resume is not None else 0
    seeding.seed_generators(cfg.seed, rank, start_step)      # the initial centers and backbone (rank 0's)
    head, module = build_distributed(cfg, ctx, schedule, symbol)
    log.info(f"{head}; log file {log_path}")
    best = {}
    if resume is not None:
        try:
            restore(resume, module, head)
        except Exception as caught:
            log.error(f"resuming failed: {caught}")
            error = caught
        comm.raise_if_any_failed(error, "resuming")
        best = resume["state"].get("best", {})
        saved = resume["state"]
        moved = "" if saved["world_size"] == world and saved["step"] == start_step else (
            f" (saved on {saved['world_size']} ranks at step {saved['step']}, global batch {saved['global_batch']}: "
            f"centers re-sharded, position kept in samples seen)")
        log.info(f"resuming from {resume['path']} at step {start_step}, epoch {resume['epoch']}{moved}")
        if plan.length_note:
            log.info(plan.length_note)
    seeding.seed_generators(cfg.seed, rank, start_step)      # what a run resumed here draws, from here on
    checkpoints = os.path.join(cfg.output, "checkpoints")

    def save_checkpoint(step: int) -> str:
        state = dict(network=cfg.network, epoch=step // plan.steps_per_epoch,
                     steps_per_epoch=plan.steps_per_epoch, global_batch=plan.global_batch,
                     max_update=plan.max_update, next_lr=schedule(step), seed=cfg.seed, best=best,
                     data=dict(epoch=step // plan.steps_per_epoch, step_in_epoch=step % plan.steps_per_epoch),
                     config=cfg.to_dict())
        return checkpoint.save(checkpoints, step, module=module, head=head, symbol=symbol, state=state,
                               keep=cfg.keep_checkpoints)
    if rank == 0:
        log.info(f"{plan.num_images} images, global batch {plan.global_batch} = {cfg.batch_size} x {world} "
                 f"ranks, {plan.steps_per_epoch} steps/epoch, {plan.max_update} steps, "
                 f"peak lr {plan.lr:.4g} ({cfg.lr_schedule}), context {plan.context}")
    metrics = (MetricsLog(cfg.output, cfg.tensorboard, start_step, resume["state"]["step"] if resume else None)
               if rank == 0 else None)
    progress = tqdm(total=plan.max_update, initial=start_step, desc="train", unit="step", disable=rank != 0,
                    mininterval=5, file=sys.stderr, dynamic_ncols=True)
    loss, started = float("nan"), time.time()
    window_start, window_steps, window_wait = time.time(), 0, 0.0

    def verify(step: int, params=None) -> dict:
        """Rank 0: the verification report of `params` (default: rank 0's current backbone)."""
        if verifier is None:
            return {}
        began = time.time()
        found = verifier.evaluate(*(params or module.get_params()))
        for name, result in found.items():
            if result.accuracy > best.get(name, {}).get("accuracy", -1.0):
                best[name] = dict(accuracy=result.accuracy, step=step)
            log.info(f"step {step}: verification {name}: accuracy {result}; best {best[name]['accuracy']:.4f} "
                     f"at step {best[name]['step']} ({time.time() - began:.1f} s)")
            metrics.write(step, **{f"val/{name}/{key}": value for key, value in result.as_dict().items()},
                          **{f"val/{name}/best_accuracy": best[name]["accuracy"]})
        return {name: result.as_dict() for name, result in found.items()}

    step = start_step
    try:
        if cfg.val_at_start and start_step == 0:
            verify(0)
        for step in range(start_step, plan.max_update):
            fetch_started = time.time()
            batch = next(data)            # waits only when decoding falls behind
            window_wait += time.time() - fetch_started
            lr = schedule(step)
            try:
                loss = module.step(batch.data, batch.labels, lr)
            except (PartialFCInputError, NonFiniteLossError) as error:   # raised on every rank alike
                raise type(error)(f"step {step + 1}: {error}") from None
            window_steps += 1
            progress.update(1)
            done = step + 1
            if done % cfg.frequent == 0 or done == plan.max_update:
                elapsed = time.time() - window_start
                per_rank = window_steps * cfg.batch_size / max(elapsed, 1e-9)
                eta = (plan.max_update - done) * elapsed / window_steps
                data_wait = window_wait / max(elapsed, 1e-9)
                if rank == 0:
                    log.info(f"step {done}/{plan.max_update} epoch {batch.epoch} loss {loss:.4f} lr {lr:.5f} | "
                             f"{per_rank:.1f} samples/s per rank, {per_rank * world:.1f} total | "
                             f"data wait {data_wait:.0%} | eta {format_duration(eta)}")
                    metrics.write(done, epoch=batch.epoch, loss=loss, lr=lr, samples_per_sec_per_rank=per_rank,
                                  samples_per_sec=per_rank * world, data_wait_fraction=data_wait)
                window_start, window_steps, window_wait = time.time(), 0, 0.0
            paused = time.time()
            if done % cfg.verbose == 0 and done != plan.max_update:
                verify(done)
            if cfg.save_interval and done % cfg.save_interval == 0 and done != plan.max_update:
                save_checkpoint(done)
                seeding.seed_generators(cfg.seed, rank, done)    # what a run resumed from here will do
            window_start += time.time() - paused     # throughput excludes evaluation and saving
        progress.close()
        summary = {}
        last = save_checkpoint(plan.max_update)       # build_local refused a run with nothing to train
        if rank == 0:
            # The model for inference (embedding only, rank-averaged parameters) is what the
            # final verification measures, so its figures and thresholds describe that file.
            prefix = os.path.join(cfg.output, "model")
            exported = load_model(last)
            export_model(prefix, *exported[:3])
            results = verify(plan.max_update, exported[1:3])
            write_json(prefix + "-verification.json", results)
            state = checkpoint.read_state(last)
            write_json(os.path.join(last, "state.json"), {**state, "best": best})
            summary = dict(steps=plan.max_update, final_loss=loss, seconds=round(time.time() - started, 1),
                           verification=results, best=best)
            metrics.write(plan.max_update, summary=summary)
            accuracies = ", ".join(f"{name} {r['accuracy']:.4f}" for name, r in results.items()) or "no sets"
            log.info(f"done: {plan.max_update} steps in {format_duration(time.time() - started)}, "
                     f"final loss {loss:.4f}, verification of the exported model: {accuracies}; checkpoint {last}; "
                     f"model for inference: {prefix}-symbol.json + {prefix}-0000.params")
        mx.nd.waitall()
        comm.barrier()      # nobody leaves (shutting Horovod down) while rank 0 evaluates and saves
        return summary
    except Exception as error:
        if comm.lost_peer(error):
            raise comm.LostRankError(f"step {step + 1}: {comm.lost_peer_message()}") from None
        raise
    finally:
        data.close()
        if metrics is not None:
            metrics.close()


def main(argv=None) -> int:
    try:
        cfg = config_lib.parse_args(argv)
    except config_lib.ConfigError as error:
        print(f"mxnet_pfc.train: configuration error: {error}", file=sys.stderr)
        return 2
    stops.watch_signals()
    try:
        train(cfg)
        comm.shutdown()
    except (DataError, BinFormatError, PartialFCInputError, config_lib.ConfigError, FloatingPointError,
            CheckpointError, ModelError, RuntimeError, OSError) as error:
        lost = isinstance(error, comm.LostRankError) or comm.lost_peer(error)
        if lost:
            contact = str(error) if isinstance(error, comm.LostRankError) else comm.lost_peer_message()
            cause = stops.other_rank_cause()
            error = comm.LostRankError(f"{cause} ({contact})" if cause else contact)
        elif not isinstance(error, comm.RankFailedError):
            stops.record_failure(f"{type(error).__name__}: {error}")     # for the ranks the launcher ends next
        hint = "; resume with --resume latest" if lost else ""
        log.error(f"stopping: {error}{hint}")
        # on a line of its own: rank 0's progress bar may hold the current one
        print(f"\nrank {comm.rank()}: {type(error).__name__}: {error}{hint}", file=sys.stderr)
        if lost or comm.is_distributed():
            # MXNet's and Horovod's exit handlers would wait on a failed collective, or raise
            # ("Horovod has been shut down") once another rank has stopped
            comm.abort(1)
        return 1
    except Exception as error:          # a defect of ours: the traceback, and every rank told which rank
        stops.record_failure(f"{type(error).__name__}: {error} (an unexpected error: see rank {comm.rank()}'s log)")
        log.exception(f"stopping on an unexpected error: {type(error).__name__}: {error}")
        if not log.handlers:
            traceback.print_exc()
        comm.abort(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
