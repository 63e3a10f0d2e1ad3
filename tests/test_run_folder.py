"""The paths under a run's output folder (mxnet_pfc.runtime.run_folder): old runs, the elastic supervisor
and the tests depend on every name and place, so they are pinned here."""
from mxnet_pfc.runtime.run_folder import RunFolder


def test_every_path_keeps_its_name_and_place():
    run = RunFolder("OUT")
    assert (run.checkpoints, run.logs, run.metrics, run.tensorboard, run.config, run.model, run.verification,
            run.earlier_runs, run.timeline) == (
        "OUT/checkpoints", "OUT/logs", "OUT/metrics.jsonl", "OUT/tensorboard", "OUT/config.json", "OUT/model",
        "OUT/model-verification.json", "OUT/earlier-runs", "OUT/elastic-timeline.tsv")
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
