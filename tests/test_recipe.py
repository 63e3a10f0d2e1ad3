"""Own data trains the field's standard recipe, named after the data; the synthetic default stays the toy run.

Also the start-up log's recipe line and CPU cost estimate, and --help grouped by the configuration's sections."""
import re
import subprocess
import sys

import pytest

from launch import REPO, config_sh, rank_env, run_command
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import run_length

# make_config({}) at commit 1769cfc, before recipes: `make run` must train exactly this.
SYNTHETIC_DEFAULT = {
    'dataset': 'synthetic', 'rec': 'output/data/synthetic/train.rec', 'images': '', 'extra_sets': (),
    'num_classes': 500, 'extra_classes': (), 'set_shares': (), 'set_weights': (),
    'num_images': 0, 'val_targets': ('output/data/synthetic/val.bin',), 'ijb_targets': (), 'image_size': 112,
    'synthetic_identities': 500, 'synthetic_images_per_identity': 32, 'synthetic_val_pairs': 1000,
    'decode_threads': 2, 'network': 'r18-lite', 'network_output': '', 'embedding_size': 128, 'dropout': 0.0,
    'fp16': False, 'pretrained': '', 'teacher': '', 'distill_weight': 1.0, 'loss': 'cosface-small',
    'margin_s': 32.0, 'margin_m1': 1.0, 'margin_m2': 0.0, 'margin_m3': 0.2, 'adaface_m': 0.4, 'adaface_h': 0.333,
    'adaface_t_alpha': 0.01, 'elastic_m': 0.5, 'elastic_std': 0.05, 'magface_l_a': 10.0, 'magface_u_a': 110.0,
    'magface_l_m': 0.45, 'magface_u_m': 0.8, 'magface_lambda_g': 35.0, 'curricular_m': 0.5,
    'curricular_t_alpha': 0.01, 'subcenter_k': 3, 'sample_rate': 1.0, 'interclass_filtering_threshold': 0.0,
    'init_centers': 'random', 'batch_size': 32, 'grad_accum': 1, 'lr': 0.05, 'lr_base_batch': 64, 'momentum': 0.9,
    'weight_decay': 0.0005, 'lr_schedule': 'poly', 'num_epoch': 1, 'decay_epochs': (10.0, 16.0, 18.0),
    'lr_factor': 0.1, 'warmup_epochs': 0.1, 'poly_power': 2.0, 'max_update': 0, 'freeze_backbone_steps': 0,
    'output': 'output/synthetic_r18-lite_cosface-small', 'context': 'auto', 'seed': 0, 'frequent': 25,
    'verbose': 125, 'val_batch_size': 64, 'tensorboard': True, 'val_at_start': False, 'save_interval': 125,
    'keep_checkpoints': 3, 'stall_timeout': 1200.0, 'resume': '', 'start_over': False}

# insightface recognition/arcface_torch configs/base.py + ms1mv3_r50.py, written out here (not read from RECIPES):
# r50, 512-d, ArcFace s=64 m=0.5, SGD 0.9 / 5e-4, 128 per GPU at lr 0.1 on 8 GPUs (0.1 per 1024), 20 epochs,
# no warm-up, PolynomialLRWarmup power 1, verbose 2000, frequent 10.
ARCFACE_TORCH_R50 = dict(network="r50", embedding_size=512, loss="arcface", margin_s=64.0, margin_m1=1.0,
                         margin_m2=0.5, margin_m3=0.0, sample_rate=1.0, momentum=0.9, weight_decay=5e-4,
                         batch_size=128, lr=0.1, lr_base_batch=1024, num_epoch=20, warmup_epochs=0,
                         lr_schedule="poly", poly_power=1.0, verbose=2000, frequent=10)


def fields_of(cfg, names) -> dict:
    return {name: getattr(cfg, name) for name in names}


def test_the_synthetic_default_is_unchanged():
    for cfg in (config_lib.make_config({}), config_lib.parse_args([])):
        values = cfg.to_dict()
        assert values.pop("recipe") == "synthetic-toy"
        assert values == SYNTHETIC_DEFAULT


@pytest.mark.parametrize("argv, output", [
    (["--rec", "data/mine/train.rec"], "output/mine_r50_arcface"),
    (["--images", "FACES/"], "output/FACES_r50_arcface"),
    (["--images", "/data/people"], "output/people_r50_arcface"),
    (["--dataset", "synthetic", "--rec", "sets/ms1m-retinaface-t1/train.rec"], "output/ms1m-retinaface-t1_r50_arcface"),
])
def test_own_data_trains_the_standard_recipe_named_after_the_data(argv, output):
    cfg = config_lib.parse_args(argv)
    assert fields_of(cfg, ARCFACE_TORCH_R50) == ARCFACE_TORCH_R50
    assert cfg.output == output and "synthetic" not in cfg.output
    assert cfg.recipe == "arcface_torch-ms1mv3_r50"
    assert (cfg.synthetic_identities, cfg.num_classes, cfg.val_targets) == (0, 0, ("auto",))
    # options win over the recipe; the output follows the network and loss given
    cfg = config_lib.parse_args([*argv, "--batch_size", "64", "--lr", "0.05", "--network", "r100"])
    assert (cfg.batch_size, cfg.lr, cfg.network, cfg.lr_base_batch) == (64, 0.05, "r100", 1024)
    assert cfg.output == output.replace("_r50_", "_r100_")
    # and a recipe may be named: the toy one on your own set
    toy = config_lib.parse_args([*argv, "--recipe", "synthetic-toy"])
    assert (toy.network, toy.loss, toy.batch_size, toy.lr, toy.num_epoch) == ("r18-lite", "cosface-small", 32, 0.05, 1)


def test_named_sets_train_their_arcface_torch_config():
    emore = config_lib.parse_args(["--dataset", "emore"])       # faces_emore is MS1MV2: configs/ms1mv2_r50.py
    assert fields_of(emore, ARCFACE_TORCH_R50) == ARCFACE_TORCH_R50 and emore.num_classes == 85742
    assert emore.recipe == "arcface_torch-ms1mv2_r50" and emore.output == "output/emore_r50_arcface"
    webface = config_lib.parse_args(["--dataset", "webface"])
    assert webface.recipe == "arcface_torch-ms1mv3_r50" and fields_of(webface, ARCFACE_TORCH_R50) == ARCFACE_TORCH_R50
    glint = config_lib.parse_args(["--dataset", "glint360k"])    # configs/glint360k_r50.py: CosFace 0.4, wd 1e-4
    assert glint.recipe == "arcface_torch-glint360k_r50" and glint.output == "output/glint360k_r50_cosface"
    assert fields_of(glint, ARCFACE_TORCH_R50) == dict(ARCFACE_TORCH_R50, loss="cosface", margin_m2=0.0,
                                                       margin_m3=0.4, weight_decay=1e-4)
    # a named set's recipe stays with your own files; the output is named after them
    mine = config_lib.parse_args(["--dataset", "glint360k", "--rec", "data/mine/train.rec"])
    assert (mine.recipe, mine.loss, mine.num_classes, mine.output) == (
        "arcface_torch-glint360k_r50", "cosface", 0, "output/mine_r50_cosface")
    with pytest.raises(config_lib.ConfigError, match="unknown recipe 'ms1m'; choose one of: arcface_torch-ms1mv3_r50"):
        config_lib.parse_args(["--rec", "data/mine/train.rec", "--recipe", "ms1m"])


def test_a_saved_configuration_keeps_its_recipe():
    for argv in (["--rec", "data/mine/train.rec", "--recipe", "synthetic-toy"], ["--rec", "data/mine/train.rec"], []):
        cfg = config_lib.parse_args(argv)
        saved = {name: list(value) if isinstance(value, tuple) else value for name, value in cfg.to_dict().items()}
        assert config_lib.make_config(saved) == cfg


def test_the_recipe_line_says_where_each_value_came_from():
    line = config_lib.recipe_line(config_lib.parse_args(["--rec", "data/mine/train.rec", "--batch_size", "64",
                                                         "--lr", "0.05"]))
    assert line == ("recipe: arcface_torch-ms1mv3_r50 (insightface recognition/arcface_torch/configs/ms1mv3_r50.py); "
                    "from options: batch_size=64, lr=0.05")
    line = config_lib.recipe_line(config_lib.parse_args(["--dataset", "glint360k", "--network", "r18-lite",
                                                         "--context", "cpu"]))
    assert line == ("recipe: arcface_torch-glint360k_r50 (insightface recognition/arcface_torch/configs/"
                    "glint360k_r50.py); from options: network=r18-lite, context=cpu; "
                    "from the network preset r18-lite: embedding_size=128")
    assert config_lib.recipe_line(config_lib.parse_args([])) == (
        "recipe: synthetic-toy (this project's CPU-sized synthetic run, docs/training.md)")
    assert config_lib.recipe_line(config_lib.parse_args(["--dataset", "speed-1m"])) == (
        "recipe: none (the configuration's defaults, as the speed presets use); "
        "from the dataset preset speed-1m: max_update=200, frequent=10")


def test_the_recipe_line_of_a_resumed_run_compares_it_with_the_checkpoint():
    cfg = config_lib.parse_args(["--rec", "data/mine/train.rec", "--resume", "latest"])
    same = {name: list(value) if isinstance(value, tuple) else value for name, value in cfg.to_dict().items()}
    assert config_lib.recipe_line(cfg, same).endswith(
        "; resumed: the checkpoint's run had recipe arcface_torch-ms1mv3_r50, the same settings")
    older = {name: value for name, value in dict(same, lr=0.2).items() if name != "recipe"}
    assert config_lib.recipe_line(cfg, older).endswith(
        "; resumed: the checkpoint's run recorded no recipe (written before recipes), and differs in: lr 0.2 -> 0.1")


def test_the_cpu_cost_estimate():
    line = run_length.cost_line(3.1, 40452, 20 * 40452, 0)
    assert line.startswith("on CPU: 3.1 s/step; an epoch is 40,452 steps (35 h), the run 20 epochs (29 days "
                           "from here); a GPU machine is the way (README)")
    assert "(45 s), the run 0.5 epochs (9 s from here)" in run_length.cost_line(0.5, 90, 45, 27)
    assert run_length.readable_duration(7199) == "120 min" and run_length.readable_duration(7200) == "2 h"
    own = config_lib.parse_args(["--rec", "data/mine/train.rec"])
    assert run_length.wants_cost_estimate(own, "cpu(0)") and not run_length.wants_cost_estimate(own, "gpu(0)")
    assert not run_length.wants_cost_estimate(config_lib.parse_args([]), "cpu(0)")          # the toy run: for CPUs
    assert not run_length.wants_cost_estimate(config_lib.parse_args(["--dataset", "speed-1m"]), "cpu(0)")


def test_a_real_recipe_on_cpu_says_its_cost_before_it_goes_on(set_b, tmp_path):
    """The real recipe on a user's set (r18-lite to keep the test short) on CPU, as a user launches it."""
    proc = run_command(config_sh("--rec", set_b / "train.rec", "--network", "r18-lite", "--batch_size", 8,
                                 "--max_update", 5, "--val_targets", "", "--context", "cpu",
                                 "--output", tmp_path / "run", ranks=1), timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert ("recipe: arcface_torch-ms1mv3_r50 (insightface recognition/arcface_torch/configs/ms1mv3_r50.py); from "
            "options: network=r18-lite, batch_size=8, max_update=5, context=cpu; from the network preset r18-lite: "
            "embedding_size=128") in proc.stdout
    # 320 images / (8 x 1 rank) = 40 steps an epoch; the run is 5 steps, timed after step 1 over steps 2..4
    assert re.search(r"on CPU: [\d.]+ s/step; an epoch is 40 steps \([\d.]+ (s|min)\), the run 0\.125 epochs "
                     r"\([\d.]+ s from here\); a GPU machine is the way \(README\)", proc.stdout), proc.stdout[-4000:]


def test_help_is_grouped_by_the_configuration_sections_with_every_field_once():
    out = subprocess.run([sys.executable, "-m", "mxnet_pfc.train", "--help"], cwd=REPO, env=rank_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    titles = [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles[titles.index("data"):] == list(config_lib.SECTIONS)
    sections = re.split(r"^(" + "|".join(re.escape(t) for t in config_lib.SECTIONS) + r"):$", text, flags=re.M)
    by_title = dict(zip(sections[1::2], sections[2::2]))
    listed = []
    for title, names in config_lib.SECTIONS.items():
        options = re.findall(r"^  --(\w+) ", by_title[title], flags=re.M)
        assert options == list(names)
        listed += options
        flat = " ".join(by_title[title].split())
        for name in names:        # each field's own help, as FIELD_HELP says it
            assert " ".join(config_lib.FIELD_HELP[name].split()) in flat, name
    assert sorted(listed) == sorted(f.name for f in config_lib.fields(config_lib.Config))
    assert len(listed) == len(set(listed))
    assert sorted(re.findall(r"^  --(\w+) ", text, flags=re.M)) == sorted(listed)    # none outside the groups
