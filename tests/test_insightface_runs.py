"""Starting from the files users have from InsightFace's MXNet code, written by that code itself.

That code runs from tests/third_party/insightface (tests/insightface_files.py). Here: its backbones as symbol
files (--network), its model-zoo and Partial FC parameters (--pretrained), and the centers of a run of its
MXNet Partial FC (--init_centers), continued here on another number of ranks."""
import json
import sys

import numpy as np
import pytest

import insightface_files as theirs
import symbols
from launch import ckpt, config_sh, losses, own_set_run, run_command
from mxnet_pfc.data import synthetic_set
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.runtime.errors import CheckpointError, ConfigError
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import starting_point
from mxnet_pfc.training.config import resolve_config

SMALL = dict(net_input=0)      # their 7x7 stride-2 stem, a config field of both projects: ~4x cheaper on CPU
CHEAP = ("--batch_size", 4, "--lr_base_batch", 8, "--warmup_epochs", 0)     # their resnet-18 on 2 CPU ranks


def configure(fields: dict):
    """The trainer's configuration of `fields` on dummy data of 10 classes, completed as a rank completes it
    at start-up (a symbol file's width is read there)."""
    return resolve_config(config_lib.make_config({"dataset": "speed-1m", "num_classes": 10, **fields}), 1)


def their_graphs(tmp_path) -> dict:
    """{name: (symbol file, params prefix)} of each of their backbones as their code saves it."""
    zoo_r18 = theirs.write_model_zoo(tmp_path / "zoo-r18" / "model", "fresnet", 128, 10, seed=1, num_layers=18)
    zoo_mbf = theirs.write_model_zoo(tmp_path / "zoo-mbf" / "model", "fmobilefacenet", 128, 10, seed=2)
    training = theirs.write_model_zoo(tmp_path / "zoo-training" / "model", "fmobilefacenet", 128, 10, seed=3,
                                      ckpt_embedding=False)
    run = theirs.write_partial_fc_run(tmp_path / "pfc", 10, 2, 128, seed=4)
    return {"fresnet": (zoo_r18["symbol"], zoo_r18["prefix"]), "fmobilefacenet": (zoo_mbf["symbol"], zoo_mbf["prefix"]),
            "fmobilefacenet-training": (training["symbol"], training["prefix"]),
            "partial-fc-resnet": (run["symbol"], run["average_prefix"])}


def test_their_backbones_are_networks_and_their_parameters_load_by_name(tmp_path):
    """Each of their saved graphs is a --network whose width is read from it; its parameters fill it
    completely under --pretrained. Their whole training graph (outputs blockgrad, softmax ...) gives its
    fc1_output, and its fc7 head's weight is listed as not used."""
    for name, (symbol_file, prefix) in their_graphs(tmp_path).items():
        cfg = configure({"network": str(symbol_file)})
        assert cfg.embedding_size == 128, name
        symbol = symbols.get_symbol(cfg.network, cfg.embedding_size, output=cfg.network_output)
        assert symbol.list_outputs() == ["fc1_output"], name
        pretrained = starting_point.read_pretrained(prefix, symbol, (2, 3, 112, 112))
        assert pretrained.kept_random == (), name
        assert pretrained.unused == (("fc7_weight",) if name == "fmobilefacenet-training" else ()), name
        assert "pretrained backbone: " in pretrained.describe()


def test_a_graph_that_is_not_an_embedding_is_refused_naming_why(tmp_path):
    graphs = their_graphs(tmp_path)
    training_graph = str(graphs["fmobilefacenet-training"][0])
    with pytest.raises(ConfigError, match="depends on the label input.*softmax_label.*--network_output"):
        configure({"network": training_graph, "network_output": "softmax"})
    with pytest.raises(ConfigError, match="has no output 'fc9'"):
        configure({"network": training_graph, "network_output": "fc9"})
    with pytest.raises(ConfigError, match="embedding_size = 512: the graph of --network .* gives 128-d"):
        configure({"network": training_graph, "embedding_size": 512})
    with pytest.raises(ConfigError, match="no such symbol file"):
        configure({"network": str(tmp_path / "nowhere-symbol.json")})
    (tmp_path / "broken-symbol.json").write_text('{"nodes": [')
    with pytest.raises(ConfigError, match="not an MXNet symbol file"):
        configure({"network": str(tmp_path / "broken-symbol.json")})


@pytest.mark.parametrize("world", [1, 2, 4])
def test_centers_of_their_partial_fc_re_shard_onto_any_world_size(tmp_path, world):
    """Their 3-rank run of 10 classes (ceil split: 4, 4, 2 used + 2 unused rows) onto W ranks: rank r gets
    exactly its classes' centers and momentum, never an unused row."""
    run = theirs.write_partial_fc_run(tmp_path / "pfc", 10, 3, 8, seed=5)
    for rank in range(world):
        first, count = shard_range(10, rank, world)
        got = starting_point.read_centers(str(run["folder"]), 10, 8, 1, first, count)
        assert "InsightFace Partial FC run" in got.source and "(3 rank(s))" in got.source
        assert np.array_equal(got.centers, run["centers"][first:first + count])
        assert np.array_equal(got.momentum, run["momentum"][first:first + count])


def test_their_centers_for_another_class_count_or_width_are_refused_naming_both(tmp_path):
    run = theirs.write_partial_fc_run(tmp_path / "pfc", 10, 3, 8, seed=5)
    folder = str(run["folder"])
    with pytest.raises(CheckpointError, match=r"its 3 ranks hold 4 rows each, which fits a run of 10\.\.12 classes; "
                                              r"this run has num_classes = 13"):
        starting_point.read_centers(folder, 13, 8, 1, 0, 13)
    with pytest.raises(CheckpointError, match="8-d, this run's embedding_size is 16"):
        starting_point.read_centers(folder, 10, 16, 1, 0, 10)
    run["momentum_files"][1].unlink()
    with pytest.raises(CheckpointError, match="incomplete.*missing 1_centers_mom.param"):
        starting_point.read_centers(folder, 10, 8, 1, 0, 10)


def verified(model, bin_file, tmp_path) -> float:
    report = tmp_path / "verify.json"
    proc = run_command([sys.executable, "-m", "mxnet_pfc.verify", model, bin_file, "--json", report], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return json.loads(report.read_text())[bin_file.stem]["accuracy"]


def test_a_run_of_their_partial_fc_continues_here_on_another_number_of_ranks(set_b, tmp_path):
    """Their 3-rank run (resnet-18 backbone, 40 classes) goes on here on 2 ranks: its symbol file as the
    network, its model_average as the backbone (verification at step 0 equals `mxnet_pfc.verify` of their
    files), its centers re-sharded; the run trains, exports, and resumes bit for bit from its checkpoint."""
    run = theirs.write_partial_fc_run(tmp_path / "theirs", 40, 3, 128, seed=6, **SMALL)
    pairs = tmp_path / "pairs.bin"        # 20 pairs: their resnet-18 is ~15x our r18-lite's cost on the CPU
    synthetic_set.write_verification_set(str(pairs), 10, 20, seed=11)
    theirs_on_b = verified(run["average_prefix"], pairs, tmp_path)
    output = tmp_path / "here"
    options = own_set_run(set_b, output, *CHEAP, "--network", run["symbol"], "--pretrained", run["average_prefix"],
                          "--init_centers", run["folder"], "--max_update", 4, "--save_interval", 2,
                          "--val_targets", pairs)
    proc = run_command(config_sh(*options, "--val_at_start", "true"), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"class centers and their momentum from InsightFace Partial FC run {run['folder']} (3 rank(s))" \
        in proc.stdout
    loaded = [line for line in proc.stdout.splitlines() if "pretrained backbone:" in line]
    assert loaded and "keep their random start" not in loaded[0], loaded
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    assert [r["val/pairs/accuracy"] for r in records if r["step"] == 0 and "val/pairs/accuracy" in r] == [theirs_on_b]
    assert (output / "model-symbol.json").exists()
    centers = np.concatenate([np.load(ckpt(output / "checkpoints", 4) / f"centers-rank{r:05d}.npy")
                              for r in range(2)])
    assert centers.shape == (40, 128)

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    first = ckpt(output / "checkpoints", 2)
    (resumed / "checkpoints" / first.name).symlink_to(first)
    proc = run_command(config_sh(*own_set_run(set_b, resumed, *CHEAP, "--network", run["symbol"], "--max_update", 4,
                                              "--save_interval", 2, "--resume", "latest", "--val_targets", "")),
                       timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert {step: loss for step, loss in losses(output).items() if step > 2} == losses(resumed)
