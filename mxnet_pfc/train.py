"""The trainer: python -m mxnet_pfc.train [--dataset D --network N --loss L --FIELD VALUE ...]

One process per device; launch several with `horovodrun ... bash config.sh` or
`bash run.sh`. Without a launcher it trains alone (world size 1).
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import threading
import time

import mxnet as mx
import numpy as np
from tqdm import tqdm

import symbols

from . import checkpoint, comm, config as config_lib
from .checkpoint import CheckpointError
from .data import synthetic
from .data.iterators import DummyIter, RecordIter
from .data.records import DataError
from .eval.verification import BinFormatError, Verifier
from .export import export_model
from .files import write_json
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
    if comm.local_rank() == 0:
        log.info(f"generating the synthetic set in {folder} ({cfg.synthetic_identities} identities x "
                 f"{cfg.synthetic_images_per_identity} images, held-out val.bin); done once")
        started = time.time()
        os.makedirs(folder, exist_ok=True)
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
    """Rank 0's figures: JSON lines in OUTPUT/metrics.jsonl and TensorBoard events (mxboard)."""

    def __init__(self, output: str, tensorboard: bool):
        self.path = os.path.join(output, "metrics.jsonl")
        self._file = open(self.path, "a")
        self._board = None
        if tensorboard:
            try:
                from mxboard import SummaryWriter
                self._board = SummaryWriter(logdir=os.path.join(output, "tensorboard"))
            except Exception as error:     # mxboard is optional for training
                log.warning(f"TensorBoard logging off: {error}")

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


def reseed(seed: int, rank: int, step: int) -> None:
    """MXNet's generators (sampled negatives, dropout) from (seed, rank, step).

    MXNet cannot save a generator's state. Re-seeding after each checkpoint
    instead makes a run resumed there draw exactly what the uninterrupted run drew.
    """
    mx.random.seed(int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0] % 2 ** 31))


def format_duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


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
    max_update = cfg.max_update or max(1, math.ceil(cfg.num_epoch * steps_per_epoch))
    lr = cfg.lr * global_batch / cfg.lr_base_batch
    schedule = LRSchedule(lr, max_update, cfg.lr_schedule, [round(e * steps_per_epoch) for e in cfg.decay_epochs],
                          cfg.lr_factor, round(cfg.warmup_epochs * steps_per_epoch), cfg.poly_power)
    symbol = symbols.get_symbol(cfg.network, cfg.embedding_size, cfg.dropout, cfg.fp16)
    verifier = None
    if rank == 0 and cfg.val_targets:
        eval_symbol = symbol if cfg.fp16 else inference_symbol(cfg.network, cfg.embedding_size)
        verifier = Verifier(cfg.val_targets, eval_symbol, ctx, cfg.val_batch_size, cfg.image_size)
    plan = dict(num_images=num_images, global_batch=global_batch, steps_per_epoch=steps_per_epoch,
                max_update=max_update, lr=lr, context=str(ctx))
    resume = read_resume(cfg, rank, world, symbol, plan) if cfg.resume else None
    data.seek(resume["step"] if resume else 0)
    return ctx, data, schedule, symbol, verifier, plan, resume


def read_resume(cfg: config_lib.Config, rank: int, world: int, symbol: mx.sym.Symbol, plan: dict) -> dict:
    """The checkpoint to resume from, checked against this run, with this rank's backbone parameters."""
    path = checkpoint.locate(os.path.join(cfg.output, "checkpoints"), cfg.resume)
    state = checkpoint.read_state(path)
    checkpoint.check_compatible(state, path, cfg.num_classes, cfg.embedding_size, cfg.network)
    arg_params, aux_params = checkpoint.load_backbone(path, rank, same_world=state["world_size"] == world)
    arg_shapes, _, aux_shapes = symbol.infer_shape(data=(cfg.batch_size, 3, cfg.image_size, cfg.image_size))
    checkpoint.check_params(arg_params, {n: s for n, s in zip(symbol.list_arguments(), arg_shapes) if n != "data"},
                            path, cfg.network)
    checkpoint.check_params(aux_params, dict(zip(symbol.list_auxiliary_states(), aux_shapes)), path, cfg.network)
    step, epoch = checkpoint.resume_position(state, plan["steps_per_epoch"], plan["global_batch"])
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


def build_distributed(cfg: config_lib.Config, ctx: mx.Context, schedule: LRSchedule, symbol: mx.sym.Symbol):
    """The head and the module: their constructors run collectives (checks, broadcast)."""
    margin = CombinedMarginLoss(cfg.margin_s, cfg.margin_m1, cfg.margin_m2, cfg.margin_m3)
    head = PartialFC(margin, cfg.embedding_size, cfg.num_classes, cfg.sample_rate, ctx, lr=schedule(0),
                     momentum=cfg.momentum, wd=cfg.weight_decay, seed=cfg.seed)
    module = PartialFCModule(symbol, head, cfg.batch_size, ctx, cfg.momentum, cfg.weight_decay, cfg.fp16,
                             cfg.image_size, cfg.seed)
    return head, module


def train(cfg: config_lib.Config) -> dict:
    """Run the configured training on this rank; returns rank 0's final figures (others: {})."""
    comm.init()
    rank, world = comm.rank(), comm.size()
    os.makedirs(cfg.output, exist_ok=True)
    log_path = setup_logging(cfg.output, rank)
    if rank == 0:
        config_lib.save(cfg, os.path.join(cfg.output, "config.json"))
        log.info(f"mxnet-pfc: {world} rank(s); configuration (also in {cfg.output}/config.json):\n"
                 + config_lib.describe(cfg))
    error = None
    try:
        ctx, data, schedule, symbol, verifier, plan, resume = build_local(cfg, rank, world)
    except Exception as caught:         # every rank learns that setup failed somewhere
        log.error(f"setup failed: {caught}")
        error = caught
    comm.raise_if_any_failed(error, "setup")
    head, module = build_distributed(cfg, ctx, schedule, symbol)
    log.info(f"{head}; log file {log_path}")
    start_step, best = 0, {}
    if resume is not None:
        try:
            restore(resume, module, head)
        except Exception as caught:
            log.error(f"resuming failed: {caught}")
            error = caught
        comm.raise_if_any_failed(error, "resuming")
        start_step, best = resume["step"], resume["state"].get("best", {})
        saved = resume["state"]
        moved = "" if saved["world_size"] == world and saved["step"] == start_step else (
            f" (saved on {saved['world_size']} ranks at step {saved['step']}, global batch {saved['global_batch']}: "
            f"centers re-sharded, position kept in samples seen)")
        log.info(f"resuming from {resume['path']} at step {start_step}, epoch {resume['epoch']}{moved}")
        reseed(cfg.seed, rank, start_step)
    checkpoints = os.path.join(cfg.output, "checkpoints")

    def save_checkpoint(step: int) -> str:
        state = dict(network=cfg.network, epoch=step // plan["steps_per_epoch"],
                     steps_per_epoch=plan["steps_per_epoch"], global_batch=plan["global_batch"],
                     max_update=plan["max_update"], next_lr=schedule(step), seed=cfg.seed, best=best,
                     data=dict(epoch=step // plan["steps_per_epoch"], step_in_epoch=step % plan["steps_per_epoch"]),
                     config=cfg.to_dict())
        return checkpoint.save(checkpoints, step, module=module, head=head, symbol=symbol, state=state,
                               keep=cfg.keep_checkpoints)
    if rank == 0:
        log.info(f"{plan['num_images']} images, global batch {plan['global_batch']} = {cfg.batch_size} x {world} "
                 f"ranks, {plan['steps_per_epoch']} steps/epoch, {plan['max_update']} steps, "
                 f"peak lr {plan['lr']:.4g} ({cfg.lr_schedule}), context {plan['context']}")
    metrics = MetricsLog(cfg.output, cfg.tensorboard) if rank == 0 else None
    progress = tqdm(total=plan["max_update"], initial=start_step, desc="train", unit="step", disable=rank != 0,
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
        for step in range(start_step, plan["max_update"]):
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
            if done % cfg.frequent == 0 or done == plan["max_update"]:
                elapsed = time.time() - window_start
                per_rank = window_steps * cfg.batch_size / max(elapsed, 1e-9)
                eta = (plan["max_update"] - done) * elapsed / window_steps
                data_wait = window_wait / max(elapsed, 1e-9)
                if rank == 0:
                    log.info(f"step {done}/{plan['max_update']} epoch {batch.epoch} loss {loss:.4f} lr {lr:.5f} | "
                             f"{per_rank:.1f} samples/s per rank, {per_rank * world:.1f} total | "
                             f"data wait {data_wait:.0%} | eta {format_duration(eta)}")
                    metrics.write(done, epoch=batch.epoch, loss=loss, lr=lr, samples_per_sec_per_rank=per_rank,
                                  samples_per_sec=per_rank * world, data_wait_fraction=data_wait)
                window_start, window_steps, window_wait = time.time(), 0, 0.0
            paused = time.time()
            if done % cfg.verbose == 0 and done != plan["max_update"]:
                verify(done)
            if cfg.save_interval and done % cfg.save_interval == 0 and done != plan["max_update"]:
                save_checkpoint(done)
                reseed(cfg.seed, rank, done)    # what a run resumed from here will do
            window_start += time.time() - paused     # throughput excludes evaluation and saving
        progress.close()
        summary = {}
        last = (checkpoint.step_dir(checkpoints, plan["max_update"]) if start_step == plan["max_update"]
                else save_checkpoint(plan["max_update"]))
        if rank == 0:
            # The model for inference (embedding only, rank-averaged parameters) is what the
            # final verification measures, so its figures and thresholds describe that file.
            prefix = os.path.join(cfg.output, "model")
            exported = load_model(last)
            export_model(prefix, *exported[:3])
            results = verify(plan["max_update"], exported[1:3])
            write_json(prefix + "-verification.json", results)
            state = checkpoint.read_state(last)
            write_json(os.path.join(last, "state.json"), {**state, "best": best})
            summary = dict(steps=plan["max_update"], final_loss=loss, seconds=round(time.time() - started, 1),
                           verification=results, best=best)
            metrics.write(plan["max_update"], summary=summary)
            accuracies = ", ".join(f"{name} {r['accuracy']:.4f}" for name, r in results.items()) or "no sets"
            log.info(f"done: {plan['max_update']} steps in {format_duration(time.time() - started)}, "
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
    watch_for_termination()
    try:
        train(cfg)
        comm.shutdown()
    except (DataError, BinFormatError, PartialFCInputError, config_lib.ConfigError, FloatingPointError,
            CheckpointError, ModelError, RuntimeError, OSError) as error:
        if comm.lost_peer(error) and not isinstance(error, comm.LostRankError):   # outside the step loop
            error = comm.LostRankError(comm.lost_peer_message())
        lost = isinstance(error, comm.LostRankError)
        hint = "; resume with --resume latest" if lost else ""
        log.error(f"stopping: {error}{hint}")
        print(f"rank {comm.rank()}: {type(error).__name__}: {error}{hint}", file=sys.stderr)
        if lost:
            comm.abort(1)       # the exit handlers would wait on the failed collective
        return 1
    return 0


def watch_for_termination() -> None:
    """Say why this rank stops when the launcher ends it (SIGTERM), even from inside MXNet.

    horovodrun and mpirun send SIGTERM to every rank once one rank has failed.
    A Python signal handler would run only when the main thread is back in
    Python, and it may be waiting in MXNet for a collective that never ends.
    Python's C-level handler writes the signal's number to the wakeup fd at
    once, so a thread of our own reads it, logs and exits.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.signal(signal.SIGTERM, lambda signum, frame: None)   # keeps the C handler; the thread acts
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def wait() -> None:
        while True:
            signum = os.read(read_fd, 1)[0]
            if signum == signal.SIGTERM:        # other signals (Ctrl-C) keep their Python meaning
                stopped_by_launcher(signum)

    threading.Thread(target=wait, daemon=True, name="sigterm").start()


def stopped_by_launcher(signum: int) -> None:
    message = (f"stopping: terminated by the launcher (signal {signum}), which does so when another rank "
               f"has failed; resume with --resume latest")
    os.write(2, f"rank {comm.rank()}: {message}\n".encode())     # straight to stderr, no lock
    log.error(message)
    comm.abort(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
