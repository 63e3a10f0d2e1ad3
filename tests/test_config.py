"""Configuration: presets, precedence, overrides, checks, --help; the learning-rate schedule."""
import json
import subprocess
import sys

import pytest

from launch import REPO, rank_env
from mxnet_pfc.training import config as cfg
from mxnet_pfc.training.lr_schedule import LRSchedule


def test_default_is_the_synthetic_cpu_run():
    c = cfg.parse_args([])
    assert (c.dataset, c.network, c.loss) == ("synthetic", "r18-lite", "cosface-small")
    assert (c.margin_s, c.margin_m2, c.margin_m3) == (32.0, 0.0, 0.2)
    assert c.output == "output/synthetic_r18-lite_cosface-small"
    assert cfg.parse_args(["--loss", "cosface"]).margin_m3 == 0.4


def test_presets_then_command_line_win():
    c = cfg.parse_args(["--dataset", "emore", "--network", "r100", "--loss", "arcface", "--lr", "0.2",
                        "--decay_epochs", "4,8", "--fp16", "true"])
    assert (c.num_classes, c.rec) == (85742, "data/faces_emore/train.rec")
    assert (c.network, c.margin_m2, c.lr, c.decay_epochs, c.fp16) == ("r100", 0.5, 0.2, (4.0, 8.0), True)
    # a field given on the command line beats the presets that set it
    assert cfg.parse_args(["--dataset", "synthetic", "--network", "mbf"]).network == "mbf"
    assert cfg.parse_args(["--loss", "arcface", "--margin_m2", "0.45"]).margin_m2 == 0.45


def test_config_is_frozen():
    with pytest.raises(Exception):
        cfg.parse_args([]).lr = 1.0


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "ms1m"], "unknown dataset 'ms1m'; choose one of: emore"),
    (["--network", "r7"], "unknown network 'r7'"),
    (["--loss", "softmax"], "unknown loss 'softmax'"),
    (["--sample_rate", "0"], "sample_rate = 0.0: must be in"),
    (["--batch_size", "0"], "batch_size = 0"),
    (["--decay_epochs", "8,4"], "decay_epochs"),
    (["--lr_schedule", "cosine"], "lr_schedule = 'cosine'"),
    (["--dataset", "speed-1m", "--num_images", "0"], "num_images"),
    (["--synthetic_identities", "50"], "synthetic_identities = 50"),
])
def test_bad_values_name_the_field(argv, message):
    with pytest.raises(cfg.ConfigError, match=message.replace("(", r"\(")):
        cfg.parse_args(argv)


def test_unknown_field_and_bad_type_stop_the_parser(capsys):
    for argv in (["--learning_rate", "1"], ["--batch_size", "many"], ["--fp16", "maybe"]):
        with pytest.raises(SystemExit):
            cfg.parse_args(argv)
    assert "fp16: expected true or false" in capsys.readouterr().err


def test_saved_config_round_trips(tmp_path):
    c = cfg.parse_args(["--dataset", "glint360k", "--sample_rate", "0.1"])
    cfg.save(c, str(tmp_path / "config.json"))
    saved = json.load(open(tmp_path / "config.json"))
    assert cfg.make_config(saved) == c


def test_train_help_lists_every_field():
    out = subprocess.run([sys.executable, "-m", "mxnet_pfc.train", "--help"], cwd=REPO, env=rank_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for name in ("--dataset", "--network", "--loss", "--sample_rate", "--lr_base_batch", "glint360k", "r18-lite"):
        assert name in out.stdout


def test_train_rejects_bad_config_with_exit_code_2():
    out = subprocess.run([sys.executable, "-m", "mxnet_pfc.train", "--network", "r7"], cwd=REPO, env=rank_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "unknown network 'r7'" in out.stderr


def test_multistep_schedule_with_warmup():
    schedule = LRSchedule(0.1, 100, "multistep", decay_steps=(50, 80), factor=0.1, warmup_steps=10)
    assert schedule(0) == pytest.approx(0.01) and schedule(9) == pytest.approx(0.1)
    assert [schedule(s) for s in (10, 49, 50, 79, 80, 99)] == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001, 0.001])


def test_poly_schedule_with_warmup():
    schedule = LRSchedule(0.2, 110, "poly", warmup_steps=10, power=2)
    assert schedule(4) == pytest.approx(0.1)
    assert schedule(10) == pytest.approx(0.2)
    assert schedule(60) == pytest.approx(0.2 * 0.5 ** 2)
    assert schedule(110) == 0.0
