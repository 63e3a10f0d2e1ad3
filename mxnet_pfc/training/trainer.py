"""The trainer: python -m mxnet_pfc.train [--dataset D --network N --loss L --FIELD VALUE ...]

One process per device; launch several with `horovodrun ... bash config.sh` or
`bash run.sh`. Without a launcher it trains alone (world size 1).

A run, top to bottom (`train`): take the output folder (run_lock.py); set up
on every rank without collectives and agree that it worked (`prepare`); build
the head and the module (their constructors run collectives); restore a
checkpoint (resume.py); then `Trainer.run`: the steps, with progress logs
(metrics.py), verification and checkpoints (checkpoint.py), and at the end
the model for inference (models/formats.py) and the final checkpoint. The run's
length and learning rate are planned in run_length.py and lr_schedule.py; how a
failure on one rank reaches the others is in comm.py and stops.py.
"""
from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass

import mxnet as mx
from tqdm import tqdm

import symbols
from mxnet_pfc.data import folders, iterators, synthetic_set
from mxnet_pfc.eval.during_training import TrainingEvaluation
from mxnet_pfc.head.partial_fc import NonFiniteLossError, PartialFC, PartialFCInputError
from mxnet_pfc.head.set_heads import SetHeads, heads_of
from mxnet_pfc.models.formats import export_model
from mxnet_pfc.models.inference import float32_params, inference_symbol
from mxnet_pfc.runtime import (
    checkpoints,
    comm,
    device,
    failure_records,
    logs,
    run_lock,
    seeding,
    stops,
    supervisor_messages,
    watchdog,
)
from mxnet_pfc.runtime.files import write_json
from mxnet_pfc.runtime.run_folder import RunFolder
from mxnet_pfc.training import checkpoint, distill, earlier_run, run_length
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import resume as resume_lib
from mxnet_pfc.training import starting_point as starting_point_lib
from mxnet_pfc.training.lr_schedule import LRSchedule
from mxnet_pfc.training.metrics import MetricsLog, Throughput, format_duration, progress_line
from mxnet_pfc.training.module import PartialFCModule
from mxnet_pfc.training.run_length import RunPlan, global_batch, make_plan

log = logging.getLogger(logs.ROOT_LOGGER)


@dataclass(frozen=True)
class Setup:
    """What a rank prepares on its own before any collective: data, device, network, plan."""
    cfg: config_lib.Config          # completed from the data (num_classes)
    ctx: mx.Context
    data: "iterators.TrainingData"      # iterators.open's
    symbol: mx.sym.Symbol
    inference: mx.sym.Symbol                    # the model for inference (export_model)
    evaluation: "TrainingEvaluation | None"     # rank 0's verification and IJB sets
    plan: RunPlan
    schedule: LRSchedule
    resume: "resume_lib.Resume | None"
    starting_point: "starting_point_lib.StartingPoint | None"     # a fresh run's pretrained backbone and centers
    teacher: "distill.Teacher | None"


def prepare(cfg: config_lib.Config, run: RunFolder, rank: int, world: int) -> Setup:
    """This rank's setup, without collectives, so that every rank can agree on its success first."""
    index = folders.load_index(cfg.images, cfg.output, write=rank == 0) if cfg.images else None
    extra_indexes = {number: folders.load_index(spec.path, cfg.output, write=rank == 0, set_number=number)
                     for number, spec in enumerate(iterators.training_sets(cfg.rec, cfg.images, cfg.extra_sets))
                     if number and spec.kind == "images"}
    cfg = config_lib.resolve_config(cfg, world, index, extra_indexes)
    if cfg.rec and cfg.synthetic_identities > 0:
        synthetic_set.ensure(os.path.dirname(cfg.rec) or ".", cfg.synthetic_identities,
                         cfg.synthetic_images_per_identity, cfg.synthetic_val_pairs, comm.local_rank())
    ctx = device.choose_context(cfg.context, comm.local_rank())
    device.check_horovod_gpu(ctx, comm.is_distributed())
    if cfg.fp16 and ctx.device_type != "gpu":
        raise config_lib.ConfigError("fp16 = True needs a GPU context (MXNet has no fast float16 convolutions on CPU)")
    data = iterators.open(cfg, rank, world, index, extra_indexes)
    symbol = symbols.get_symbol(cfg.network, cfg.embedding_size, cfg.dropout, cfg.fp16, cfg.network_output)
    teacher = distill.read_teacher(cfg.teacher, cfg.image_size) if cfg.teacher else None
    projection = (teacher.width, cfg.embedding_size) if teacher and teacher.width != cfg.embedding_size else None
    resume = (resume_lib.read(cfg, run, rank, world, symbol, data.steps_per_epoch, global_batch(cfg, world),
                              data.num_images, projection) if cfg.resume else None)
    starting_point = (starting_point_lib.read_starting_point(cfg, rank, world, symbol,
                                                             config_lib.margin_of(cfg).subcenters)
                      if resume is None else None)
    plan = make_plan(cfg, world, data.num_images, data.steps_per_epoch, str(ctx), resume)
    schedule = LRSchedule.from_config(cfg, plan.lr, plan.max_update, plan.steps_per_epoch)
    # the float32 embedding without dropout, exported at the end; a symbol file's graph is trained as it is
    inference = symbol if symbols.is_symbol_file(cfg.network) else inference_symbol(cfg.network, cfg.embedding_size)
    evaluation = None
    if rank == 0:
        evaluation = TrainingEvaluation(cfg.val_targets, cfg.ijb_targets, symbol if cfg.fp16 else inference, ctx,
                                        cfg.val_batch_size, cfg.image_size)
    data.seek(resume.step if resume else 0)
    return Setup(cfg, ctx, data, symbol, inference, evaluation, plan, schedule, resume, starting_point, teacher)


def build_distributed(cfg: config_lib.Config, ctx: mx.Context, schedule: LRSchedule, symbol: mx.sym.Symbol,
                      teacher: "distill.Teacher | None" = None, rows: "list[int] | None" = None):
    """The head and the module: their constructors run collectives (checks, broadcast).

    Several sets (cfg.extra_sets): one head per set, each with its own margin (its own running
    statistics), over `rows` of each rank's batch (SetsIter.rows), weighted by cfg.set_weights."""
    heads = [PartialFC(config_lib.margin_of(cfg), cfg.embedding_size, classes, cfg.sample_rate, ctx,
                       lr=schedule(0), momentum=cfg.momentum, wd=cfg.weight_decay,
                       interclass_filtering_threshold=cfg.interclass_filtering_threshold)
             for classes in (cfg.num_classes, *cfg.extra_classes)]
    head = heads[0] if len(heads) == 1 else SetHeads(heads, rows, list(cfg.set_weights) or None)
    module = PartialFCModule(symbol, head, cfg.batch_size, ctx, cfg.momentum, cfg.weight_decay, cfg.fp16,
                             cfg.image_size, cfg.grad_accum, teacher, cfg.distill_weight)
    return head, module


def claim_output(cfg: config_lib.Config, run: RunFolder, rank: int):
    """(rank 0's hold on the output folder (None on other ranks), what was done with an earlier run there),
    agreed on by every rank.

    Runs before any rank writes into the folder (its logs included): a second
    run into a folder in use, or a fresh run into a folder holding another run's
    checkpoints, is refused here, on every rank, having written nothing.
    """
    lock, note = None, ""
    try:
        with comm.fail_together("starting the run"):
            if rank == 0:
                try:
                    lock = run_lock.acquire(run.root)
                except run_lock.OutputBusyError as error:
                    supervisor_messages.record_busy(run, str(error))     # a refusal, not a lost rank, to a supervisor
                    raise
                note = earlier_run.prepare(run, cfg.resume, cfg.start_over)
                os.makedirs(run.logs, exist_ok=True)
                failure_records.clear(run)
                supervisor_messages.clear(run.finished_record)        # an earlier run's word
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return lock, note


def train(cfg: config_lib.Config) -> dict:
    """Run the configured training on this rank; returns rank 0's final figures (others: {})."""
    comm.init()
    rank, world = comm.rank(), comm.size()
    run = RunFolder(cfg.output)
    lock, earlier_note = claim_output(cfg, run, rank)
    try:
        log_path = logs.setup(run, rank)
        stops.start(run)
        watchdog.start(run, cfg.stall_timeout)
        if rank == 0 and lock.took_over:
            log.info(f"took over the output folder from a run that is gone ({lock.took_over})")
        if earlier_note:
            log.info(earlier_note)
        with comm.fail_together("setup"), watchdog.working("setup"):
            setup = prepare(cfg, run, rank, world)
        cfg, plan, resume = setup.cfg, setup.plan, setup.resume
        with comm.fail_together("writing config.json"):
            if rank == 0:
                config_lib.save(cfg, run.config)
                log.info(f"mxnet-pfc: {world} rank(s); configuration (also in {run.config}):\n"
                         + config_lib.describe(cfg))
                log.info(config_lib.recipe_line(cfg, resume.state.config if resume is not None else None))
        start_step = resume.step if resume is not None else 0
        seeding.seed_generators(cfg.seed, rank, start_step)      # the initial centers and backbone (rank 0's)
        head, module = build_distributed(cfg, setup.ctx, setup.schedule, setup.symbol, setup.teacher,
                                         setup.data.rows if cfg.extra_sets else None)
        log.info(f"{head}; log file {log_path}")
        if setup.teacher is not None:
            log.info(distill.describe(setup.teacher, cfg.embedding_size, cfg.distill_weight))
        if resume is not None:
            with comm.fail_together("resuming"), watchdog.working("resuming"):
                resume_lib.restore(resume, module, head)
            log.info(resume_lib.describe(resume))
            if plan.length_note:
                log.info(plan.length_note)
            if cfg.pretrained or cfg.init_centers != config_lib.INIT_RANDOM:
                log.info("--pretrained and --init_centers are not used: a resumed run continues its checkpoint")
        else:
            with watchdog.working("the starting point"):
                starting_point_lib.apply_starting_point(setup.starting_point, module, heads_of(head),
                                                        setup.data.sources, cfg, rank, world)
        seeding.seed_generators(cfg.seed, rank, start_step)      # what a run resumed here draws, from here on
        if rank == 0:
            log.info(plan.describe(cfg.batch_size, world, cfg.grad_accum, cfg.lr_schedule))
        return Trainer(setup, run, head, module, rank, world, start_step).run()
    finally:
        if lock is not None:
            lock.release()


class Trainer:
    """One rank's run once everything is built: the loop, verification, checkpoints, the end."""

    def __init__(self, setup: Setup, run_folder: RunFolder, head: "PartialFC | SetHeads", module: PartialFCModule,
                 rank: int, world: int, start_step: int):
        self.setup, self.cfg, self.plan = setup, setup.cfg, setup.plan
        self.head, self.module, self.rank, self.world = head, module, rank, world
        self.heads = heads_of(head)         # set 0's first
        self.run_folder = run_folder
        self.best = dict(setup.resume.state.best) if setup.resume else {}
        self.metrics = None
        self.start_step = start_step        # the first step this run trains is start_step + 1
        self.samples_at_start = 0 if setup.resume is None else setup.resume.state.samples_seen
        # --freeze_backbone_steps in samples, so that a resume on another global batch freezes as long
        frozen_steps, batch = self.cfg.freeze_backbone_steps, setup.plan.global_batch
        if setup.resume is not None:
            saved = setup.resume.state
            self.freeze_until_samples = (saved.freeze_until_samples if saved.freeze_until_samples is not None
                                         else frozen_steps * saved.global_batch)
        else:
            self.freeze_until_samples = frozen_steps * batch

    def first_backbone_step(self) -> int:
        """The first step (counted from 0, this run's numbering) that trains the backbone: the one that starts
        with freeze_until_samples seen (start_step at once without a freeze)."""
        left = self.freeze_until_samples - self.samples_seen(self.start_step)
        return self.start_step + max(0, -(-left // self.plan.global_batch))

    def samples_seen(self, step: int) -> int:
        """Samples trained when `step` (this run's numbering) is done, over every run resumed into this
        one: the axis that stays monotonic when the world size, and with it the step size, changes."""
        return self.samples_at_start + (step - self.start_step) * self.plan.global_batch

    def run(self) -> dict:
        """Train from start_step to the plan's end; returns rank 0's final figures (others: {})."""
        cfg, plan, data, schedule = self.cfg, self.plan, self.setup.data, self.setup.schedule
        resume, start_step = self.setup.resume, self.start_step
        with comm.fail_together("opening the metrics"):
            if self.rank == 0:
                self.metrics = MetricsLog(self.run_folder, cfg.tensorboard, start_step,
                                          resume.state.step if resume else None, samples_of=self.samples_seen,
                                          saved_samples=self.samples_at_start if resume else None)
        progress = tqdm(total=plan.max_update, initial=start_step, desc="train", unit="step", disable=self.rank != 0,
                        mininterval=5, file=sys.stderr, dynamic_ncols=True)
        window = Throughput(plan.global_batch // self.world, self.world)
        loss, started, step, timed_from = float("nan"), time.time(), start_step, None
        try:
            if cfg.val_at_start and start_step == 0:
                with comm.fail_together("verification"):
                    self.verify(0)
            frozen_until = self.first_backbone_step()
            if frozen_until > start_step and self.rank == 0:
                log.info(f"steps {start_step + 1}..{min(frozen_until, plan.max_update)} train only the class centers "
                         f"(--freeze_backbone_steps: until {self.freeze_until_samples:,} samples); the backbone "
                         "trains after them")
            for step in range(start_step, plan.max_update):
                fetch_started = time.time()
                batch = next(data)            # waits only when decoding falls behind
                window.waited_for_data(time.time() - fetch_started)
                lr = schedule(step)
                try:
                    loss = self.module.step(batch.data, batch.labels, lr, window.timing_next_step(),
                                            train_backbone=step >= frozen_until)
                except (PartialFCInputError, NonFiniteLossError) as error:   # raised on every rank alike
                    raise type(error)(f"step {step + 1}: {error}") from None
                window.step_done()
                watchdog.progress()
                progress.update(1)
                done = step + 1
                if timed_from and done == timed_from[0] + run_length.COST_STEPS:   # a real recipe on CPU: its cost
                    per_step = (time.time() - timed_from[1]) / run_length.COST_STEPS
                    log.info(run_length.cost_line(per_step, plan.steps_per_epoch, plan.max_update, done))
                if done == start_step + 1 and self.rank == 0 and run_length.wants_cost_estimate(cfg, plan.context):
                    timed_from = (done, time.time())
                if done % cfg.frequent == 0 or done == plan.max_update:
                    self.log_progress(done, batch.epoch, loss, lr, window.close_window(plan.max_update - done))
                paused = time.time()
                if done % cfg.verbose == 0 and done != plan.max_update:
                    self.verify_keeping_steps(done)
                if cfg.save_interval and done % cfg.save_interval == 0 and done != plan.max_update:
                    saved = self.save_checkpoint(done)
                    seeding.seed_generators(cfg.seed, self.rank, done)    # what a run resumed from here will do
                    if self.stop_requested():
                        progress.close()
                        return self.stop_at_checkpoint(done, saved)
                window.exclude(time.time() - paused)     # throughput leaves out evaluation and saving
            progress.close()
            return self.finish(loss, started)
        except Exception as error:
            if comm.lost_peer(error):
                raise comm.LostRankError(f"step {step + 1}: {comm.lost_peer_message()}") from None
            raise
        finally:
            data.close()
            if self.metrics is not None:
                self.metrics.close()

    def stop_requested(self) -> bool:
        """Whether the elastic supervisor asked this run to stop at this checkpoint (rank 0 looks, every
        rank follows: a collective)."""
        asked = self.rank == 0 and supervisor_messages.stop_requested(self.run_folder)
        return comm.gather_rows([float(asked)])[0][0] > 0

    def stop_at_checkpoint(self, step: int, saved: str) -> dict:
        """End the run after the checkpoint `saved` of `step`, saying so to the supervisor (which relaunches)."""
        if self.rank == 0:
            supervisor_messages.record_stopped(self.run_folder, step, self.world)
            log.info(f"stopped at checkpoint {saved} ({self.samples_seen(step):,} samples seen, step {step} on "
                     f"{self.world} rank(s)) on the elastic supervisor's request (it relaunches on more ranks "
                     f"with --resume latest)")
        comm.barrier()
        return {}

    def log_progress(self, done: int, epoch: int, loss: float, lr: float, figures: dict) -> None:
        """Rank 0: the progress line and its metrics record."""
        if self.rank != 0:
            return
        set_losses = self.head.set_losses if isinstance(self.head, SetHeads) else []
        log.info(progress_line(done, self.plan.max_update, self.cfg.grad_accum, epoch, loss, lr, figures)
                 + (" | sets' losses " + ", ".join(f"{value:.4f}" for value in set_losses) if set_losses else ""))
        self.metrics.write(done, epoch=epoch, loss=loss, lr=lr, world_size=self.world,
                           samples_per_sec_per_rank=figures["samples_per_sec_per_rank"],
                           samples_per_sec=figures["samples_per_sec"],
                           data_wait_fraction=figures["data_wait_fraction"],
                           **{f"phase/{name}": share for name, share in figures["phases"].items()},
                           **{f"margin/{'' if number == 0 else f'set{number}/'}{name}": value
                              for number, head in enumerate(self.heads) for name, value in head.margin.state().items()},
                           **({"distill/cosine": self.module.distill_cosine} if self.setup.teacher else {}),
                           **{f"loss/set{number}": value for number, value in enumerate(set_losses)})

    def verify(self, step: int, params=None) -> dict:
        """Rank 0: the verification report of `params` (default: rank 0's current backbone).

        .bin sets: accuracy and the best so far (kept in checkpoints); IJB sets: their headline figures.
        """
        if not self.setup.evaluation:
            return {}
        with watchdog.working("verification"):
            return self.setup.evaluation.evaluate(step, params or self.module.get_params(), self.metrics, self.best)

    def verify_keeping_steps(self, step: int) -> None:
        """The evaluation of `step` between steps (rank 0's work, agreed on). If it fails, every rank writes
        the checkpoint of `step` first (when checkpoints are on), then stops: no training is lost to it."""
        try:
            with comm.fail_together("verification"):
                self.verify(step)
        except Exception as error:      # raised on every rank alike
            if comm.lost_peer(error) or not self.cfg.save_interval:
                raise
            saved = self.save_checkpoint(step)
            if self.rank == 0:
                log.error(f"step {step}: the evaluation failed; the checkpoint {saved} is written (continue with "
                          "--resume latest once the evaluation's input is fixed)")
            raise

    def save_checkpoint(self, step: int, backbone: "checkpoint.BackboneSnapshot | None" = None) -> str:
        """Every rank: the checkpoint of `step` (collective), with the run's own state fields."""
        cfg, plan = self.cfg, self.plan
        state = checkpoints.RunState(steps_per_epoch=plan.steps_per_epoch, global_batch=plan.global_batch,
                                     max_update=plan.max_update, samples_seen=self.samples_seen(step),
                                     num_images=plan.num_images, best=self.best, config=cfg.to_dict(),
                                     margin_state=self.heads[0].margin.state(),
                                     freeze_until_samples=self.freeze_until_samples)
        with watchdog.working("checkpoint"):
            return checkpoint.save(self.run_folder.checkpoints, step, module=self.module,
                                   banks=[head.bank for head in self.heads], symbol=self.setup.symbol, state=state,
                                   keep=cfg.keep_checkpoints, backbone=backbone,
                                   extra_margin_states=[head.margin.state() for head in self.heads[1:]])

    def export(self, backbone: checkpoint.BackboneSnapshot) -> "tuple[str, dict]":
        """Rank 0: the model for inference (embedding only, rank-averaged parameters) and its verification.

        The final verification measures exactly the exported file's parameters,
        so its figures and thresholds describe that file.
        """
        prefix = self.run_folder.model
        symbol = self.setup.inference
        params = float32_params(symbol, backbone.average_arg, backbone.average_aux, "the rank-averaged backbone")
        export_model(prefix, symbol, *params)
        results = self.verify(self.plan.max_update, params)
        write_json(self.run_folder.model_files.verification, results)
        return prefix, results

    def finish(self, loss: float, started: float) -> dict:
        """The model for inference and its verification, then the final checkpoint (holding the final best).

        A failed export still leaves the final checkpoint (its centers exist nowhere
        else), then stops the run with the export's error.
        """
        backbone = checkpoint.take_snapshot(self.module)       # collective
        prefix, results, export_error = None, {}, None
        try:
            with comm.fail_together("exporting the model"):
                if self.rank == 0:
                    prefix, results = self.export(backbone)
        except Exception as error:      # raised on every rank alike
            if comm.lost_peer(error):
                raise
            export_error = error
        last = self.save_checkpoint(self.plan.max_update, backbone)   # prepare() refused a run with nothing to train
        if export_error is not None:
            log.error(f"the final checkpoint {last} is written; the model for inference is not")
            raise export_error
        summary = {}
        if self.rank == 0:
            steps = self.plan.max_update
            summary = dict(steps=steps, final_loss=loss, seconds=round(time.time() - started, 1),
                           verification=results, best=self.best)
            self.metrics.write(steps, summary=summary)
            accuracies = ", ".join(f"{name} {r['accuracy']:.4f}" for name, r in results.items()
                                   if "accuracy" in r) or "no .bin sets"
            log.info(f"done: {steps} steps in {format_duration(time.time() - started)}, "
                     f"final loss {loss:.4f}, verification of the exported model: {accuracies}; checkpoint {last}; "
                     f"model for inference: {self.run_folder.model_files.symbol} + "
                     f"{self.run_folder.model_files.params(0)}")
        mx.nd.waitall()
        comm.barrier()      # nobody leaves (shutting Horovod down) while rank 0 writes
        if self.rank == 0:      # the run's own word that it ended normally, for a supervisor (runtime/supervisor.py)
            supervisor_messages.record_finished(self.run_folder, steps=self.plan.max_update,
                                        samples_seen=self.samples_seen(self.plan.max_update), world_size=self.world,
                                        checkpoint=last, length=[self.cfg.max_update, self.cfg.num_epoch])
        return summary
