"""The paths under a run's output folder, pinned, and the records the trainer and supervisor exchange.

mxnet_pfc.runtime.run_folder: old runs, the elastic supervisor and the tests depend on every name and place,
so they are pinned here; and the records the trainer and the supervisor exchange there (supervisor_messages)."""
import os

from mxnet_pfc.runtime import supervisor_messages
from mxnet_pfc.runtime.run_folder import ModelFiles, RunFolder


def test_every_path_keeps_its_name_and_place():
    run = RunFolder("OUT")
    assert (run.checkpoints, run.logs, run.metrics, run.tensorboard, run.config, run.model,
            run.model_files.verification, run.earlier_runs, run.timeline) == (
        "OUT/checkpoints", "OUT/logs", "OUT/metrics.jsonl", "OUT/tensorboard", "OUT/config.json", "OUT/model",
        "OUT/model-verification.json", "OUT/earlier-runs", "OUT/elastic-timeline.tsv")
    assert run.images_index == "OUT/images-index.json"
    model = ModelFiles("M")
    assert model.written() == ("M-symbol.json", "M-0000.params", "M-verification.json", "M.onnx", "M-onnx-check.json")
    assert model.params(12) == "M-0012.params"
    assert (run.log_file(1), run.failure_record(1), run.crash_record(1), run.stacks_record(1),
            run.progress_record(1), run.finished_record) == (
        "OUT/logs/rank1.log", "OUT/logs/failed-rank1.txt", "OUT/logs/crash-rank1.txt", "OUT/logs/stacks-rank1.txt",
        "OUT/logs/progress-rank1.txt", "OUT/logs/finished.json")
    assert (run.elastic, run.stop_request, run.stopped_record, run.busy_record, run.job_record) == (
        "OUT/elastic", "OUT/elastic/stop-at-checkpoint", "OUT/elastic/stopped-at-checkpoint.json",
        "OUT/elastic/output-busy.json", "OUT/elastic/job.json")


def test_start_over_moves_what_a_run_writes_and_nothing_else():
    """The run lock, the supervisor's files and the image index stay in place (DESIGN 5.5)."""
    assert RunFolder("OUT").run_files() == (
        "OUT/checkpoints", "OUT/logs", "OUT/metrics.jsonl", "OUT/tensorboard", "OUT/config.json",
        "OUT/model-symbol.json", "OUT/model-0000.params", "OUT/model-verification.json", "OUT/model.onnx",
        "OUT/model-onnx-check.json")


def test_the_run_folder_of_a_checkpoint(tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "ckpt-000001-step-00000008"
    assert RunFolder.holding(str(checkpoint)) == RunFolder(str(tmp_path / "run"))
    assert RunFolder.holding(str(tmp_path / "elsewhere" / "ckpt-000001-step-00000008")) is None


def test_the_records_the_trainer_leaves_for_its_supervisor(tmp_path, monkeypatch):
    """Only a launched trainer says it was refused (a run started by hand has no supervisor to tell); the
    finished record carries the launch id; stopping at a checkpoint consumes the request."""
    run = RunFolder(str(tmp_path))
    os.makedirs(run.elastic)
    monkeypatch.delenv(supervisor_messages.LAUNCH_ENV, raising=False)
    supervisor_messages.record_busy(run, "in use")
    assert not os.path.exists(run.busy_record)
    monkeypatch.setenv(supervisor_messages.LAUNCH_ENV, "L1")
    supervisor_messages.record_busy(run, "in use")
    assert supervisor_messages.read(run.busy_record) == {"refused": "in use", "launch": "L1"}
    supervisor_messages.request_stop(run, 4)
    assert supervisor_messages.stop_requested(run)
    supervisor_messages.record_stopped(run, 16, 2)
    assert not supervisor_messages.stop_requested(run)
    assert supervisor_messages.read(run.stopped_record) == {"step": 16, "world_size": 2}
    os.makedirs(run.logs)
    supervisor_messages.record_finished(run, steps=30)
    assert supervisor_messages.read(run.finished_record) == {"steps": 30, "launch": "L1"}
    supervisor_messages.clear_for_launch(run)
    assert not any(os.path.exists(p) for p in (run.stop_request, run.stopped_record, run.busy_record))
