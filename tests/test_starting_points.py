"""Starting a run from what users have: a pretrained backbone, centers, a frozen warm-up, a symbol file.

Through config.sh: a pretrained backbone (--pretrained), centers imprinted from it or taken from a checkpoint
(--init_centers), a frozen warm-up (--freeze_backbone_steps), and any backbone given as a symbol file
(--network FILE).

Model A is the session's 2-rank run that learns (conftest.learned: 120 steps on 100 synthetic identities);
set B is another synthetic set (its own identities: another seed) on which A is fine-tuned. The checks of
exact loading use the reference run (conftest.reference) as well.
"""
import json
import sys

import mxnet as mx
import numpy as np
import pytest

import symbols
from launch import ckpt, config_sh, losses, own_set_run, rank_stop_line, run_command
from mxnet_pfc.head.sampler import shard_range
from mxnet_pfc.models import inference
from mxnet_pfc.runtime.errors import CheckpointError, ConfigError
from mxnet_pfc.training import config as config_lib
from mxnet_pfc.training import resume as resume_lib
from mxnet_pfc.training import starting_point

pytestmark = pytest.mark.xdist_group("learned")      # with the others using conftest.learned (conftest.py)


def verification_records(output) -> dict:
    """{step: accuracy on val} from rank 0's metrics.jsonl."""
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    return {r["step"]: r["val/val/accuracy"] for r in records if "val/val/accuracy" in r}


def test_a_fine_tune_starts_from_the_pretrained_backbone_exactly_with_imprinted_centers_far_lower_and_a_frozen_warm_up(
        learned, set_b, tmp_path):
    """A's backbone on B, distilled from A itself, 6 steps of which the first 4 frozen, with imprinted and
    with random centers:
    - the verification at step 0 equals `mxnet_pfc.verify` of A's export on B's pairs (the backbone is
      loaded exactly);
    - imprinted centers start B's loss far below random centers' (both first steps embed in inference mode;
      the distillation term is 0 while the student is its teacher);
    - the checkpoint at step 4 holds A's backbone bit for bit (BatchNorm statistics too) while the centers
      moved, and the backbone moves after;
    - resumed on 1 rank from step 2 (half the global batch), the freeze lasts as many samples: steps 5..8 of
      16 images, and the backbone is still A's at step 8."""
    run_a = learned[0] / "run"
    report = tmp_path / "a-on-b.json"
    proc = run_command([sys.executable, "-m", "mxnet_pfc.verify", run_a, set_b / "val.bin", "--json", report],
                       timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    a_on_b = json.loads(report.read_text())["val"]["accuracy"]
    fine_tune = ("--pretrained", run_a, "--teacher", run_a, "--freeze_backbone_steps", 4, "--max_update", 6,
                 "--num_classes", 42)

    imprinted = tmp_path / "imprinted"
    proc = run_command(config_sh(*own_set_run(set_b, imprinted, *fine_tune, "--init_centers", "imprint",
                                              "--val_at_start", "true")), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "pretrained backbone: " in proc.stdout and f"loaded from {run_a}/model-0000.params" in proc.stdout
    # 42 classes, of which B's 40 have images: rank 1's last two have none and keep their random centers
    for rank, imprinted_classes in ((0, 21), (1, 19)):
        assert (f"imprinted centers: {imprinted_classes} of this rank's 21 classes have training images"
                in (imprinted / "logs" / f"rank{rank}.log").read_text())
    assert verification_records(imprinted)[0] == a_on_b

    random_centers = tmp_path / "random"
    proc = run_command(config_sh(*own_set_run(set_b, random_centers, *fine_tune, "--save_interval", 2)),
                       timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    first_imprinted, first_random = losses(imprinted)[1], losses(random_centers)[1]
    assert first_imprinted < 0.6 * first_random, (first_imprinted, first_random)
    print(f"A on B: {a_on_b:.4f}; first loss imprinted {first_imprinted:.3f}, random {first_random:.3f}")

    assert "steps 1..4 train only the class centers" in proc.stdout
    a_params = {**mx.nd.load(str(run_a / "model-0000.params"))}
    a_params = {key.partition(":")[2]: value for key, value in a_params.items()}

    def assert_backbone_is_a(folder):
        arg, aux = inference.load_backbone(str(folder), 0, same_world=True)
        assert set(arg) | set(aux) == set(a_params)
        for name, value in {**arg, **aux}.items():
            assert np.array_equal(value.asnumpy(), a_params[name].asnumpy()), (folder, name)

    assert_backbone_is_a(ckpt(random_centers / "checkpoints", 4))
    at_6 = inference.load_backbone(str(ckpt(random_centers / "checkpoints", 6)), 0, same_world=True)[0]
    assert any(not np.array_equal(value.asnumpy(), a_params[name].asnumpy()) for name, value in at_6.items())
    momentum_4 = np.load(ckpt(random_centers / "checkpoints", 4) / "momentum-rank00000.npy")
    assert np.abs(momentum_4).max() > 0         # the centers moved (their momentum starts at zero)

    one_rank = tmp_path / "one-rank"
    (one_rank / "checkpoints").mkdir(parents=True)
    at_2 = ckpt(random_centers / "checkpoints", 2)
    (one_rank / "checkpoints" / at_2.name).symlink_to(at_2)
    proc = run_command(config_sh(*own_set_run(set_b, one_rank, *fine_tune, "--save_interval", 2, "--resume",
                                              "latest"), ranks=1), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "steps 5..8 train only the class centers (--freeze_backbone_steps: until 128 samples)" in proc.stdout
    assert_backbone_is_a(ckpt(one_rank / "checkpoints", 8))


@pytest.mark.parametrize("world", [1, 3])
def test_centers_from_a_checkpoint_re_shard_onto_any_world_size(reference, world):
    """--init_centers CHECKPOINT on W ranks: rank r gets exactly rows [start, start + count) of the saved
    table (centers and momentum), read from the 2-rank checkpoint's shards."""
    _, run_a = reference
    saved = ckpt(run_a / "checkpoints", 30)
    table = {kind: np.concatenate([np.load(saved / f"{kind}-rank{r:05d}.npy") for r in range(2)])
             for kind in ("centers", "momentum")}
    for rank in range(world):
        first, count = shard_range(40, rank, world)
        got = starting_point.read_centers(str(run_a), 40, 128, 1, first, count)        # the run folder: its latest
        assert str(saved) in got.source
        assert np.array_equal(got.centers, table["centers"][first:first + count])
        assert np.array_equal(got.momentum, table["momentum"][first:first + count])


def bad_starting_points(tmp_path, run_a) -> dict:
    """{case: (trainer fields, the message expected)} of starting points that do not fit a run on set B."""
    arg, aux = mx.model.load_checkpoint(str(run_a / "model"), 0)[1:]
    mx.model.save_checkpoint(str(tmp_path / "narrow"), 0, mx.sym.Variable("data"),
                             {**arg, "pre_fc1_weight": mx.nd.zeros((64, 512))}, aux)
    mx.model.save_checkpoint(str(tmp_path / "foreign"), 0, mx.sym.Variable("data"),
                             {"conv0_weight": mx.nd.zeros((8, 3, 3, 3))}, {})
    mx.model.save_checkpoint(str(tmp_path / "int8"), 0, mx.sym.Variable("data"),
                             {**arg, "pre_fc1_weight": arg["pre_fc1_weight"].astype("int8")}, aux)
    mx.model.save_checkpoint(str(tmp_path / "nan"), 0, mx.sym.Variable("data"),
                             {**arg, "pre_fc1_bias": arg["pre_fc1_bias"] * np.nan}, aux)
    a_ckpt = ckpt(run_a / "checkpoints", 30)
    return {
        "missing": ({"pretrained": f"{tmp_path}/missing"},
                    f"pretrained = '{tmp_path}/missing': no such file {tmp_path}/missing-0000.params"),
        "narrow": ({"pretrained": f"{tmp_path}/narrow"},
                   f"1 parameter(s) of {tmp_path}/narrow-0000.params do not fit the network's shapes: "
                   "pre_fc1_weight (64, 512) in the file, (128, 512) in the network"),
        "foreign": ({"pretrained": f"{tmp_path}/foreign"}, "holds none of the network's parameters"),
        "int8": ({"pretrained": f"{tmp_path}/int8"}, "are not floating point: pre_fc1_weight (int8)"),
        "nan": ({"pretrained": f"{tmp_path}/nan"}, "non-finite values (NaN or inf) in pre_fc1_bias"),
        "no folder": ({"init_centers": f"{tmp_path}/nowhere"},
                      f"init_centers = '{tmp_path}/nowhere': not random or imprint, and no such folder"),
        "class count": ({"init_centers": str(run_a), "num_classes": 41},
                        f"checkpoint {a_ckpt} does not fit: it has 40 classes, the configuration 41 (num_classes)"),
    }


def test_each_starting_point_that_does_not_fit_is_named(reference, set_b, tmp_path):
    """A missing file, a parameter of another shape, a file with none of the network's parameters, an int8 or
    a NaN parameter, a missing centers folder, centers of another class count: each refused by setup's
    reading, naming it."""
    _, run_a = reference
    for case, (fields, expected) in bad_starting_points(tmp_path, run_a).items():
        cfg = config_lib.make_config({"dataset": "synthetic", "recipe": "synthetic-toy",
                                      "rec": str(set_b / "train.rec"), "num_classes": 40, **fields})
        symbol = symbols.get_symbol(cfg.network, cfg.embedding_size)
        with pytest.raises((ConfigError, CheckpointError)) as refused:
            starting_point.read_starting_point(cfg, 0, 2, symbol, 1)
        assert expected in str(refused.value), case


@pytest.mark.parametrize("case", ["narrow", "class count"])
def test_a_starting_point_that_does_not_fit_stops_every_rank_before_the_first_step(reference, set_b, tmp_path,
                                                                                   case):
    """Through config.sh on 2 ranks: the refusal is in both ranks' stop lines, and no step runs."""
    _, run_a = reference
    fields, expected = bad_starting_points(tmp_path, run_a)[case]
    options = [word for name, value in fields.items() for word in (f"--{name}", value)]
    proc = run_command(config_sh(*own_set_run(set_b, tmp_path / "run", "--max_update", 2, *options)), timeout=300)
    assert proc.returncode != 0
    for rank in range(2):
        assert expected in rank_stop_line(proc.stdout, rank), proc.stdout[-3000:]
    assert "step 1/" not in proc.stdout


def test_parameters_are_filed_as_the_network_files_them_and_a_comma_in_a_folder_is_no_epoch(reference, tmp_path):
    """A converted model that files a BatchNorm statistic under arg: still loads it as the network's auxiliary
    state; a run folder whose name holds a comma (lr0.1,bs512) is a folder, not PREFIX,EPOCH."""
    _, run_a = reference
    arg, aux = mx.model.load_checkpoint(str(run_a / "model"), 0)[1:]
    moved = sorted(aux)[0]
    mx.model.save_checkpoint(str(tmp_path / "converted"), 0, mx.sym.Variable("data"), {**arg, moved: aux[moved]},
                             {k: v for k, v in aux.items() if k != moved})
    symbol = symbols.get_symbol("r18-lite", 128)
    pretrained = starting_point.read_pretrained(str(tmp_path / "converted"), symbol, (2, 3, 112, 112))
    assert moved in pretrained.aux_params and moved not in pretrained.arg_params and not pretrained.kept_random
    with_comma = tmp_path / "lr0.1,bs512"
    with_comma.mkdir()
    for name in ("model-symbol.json", "model-0000.params"):
        (with_comma / name).write_bytes((run_a / name).read_bytes())
    assert starting_point.pretrained_params(str(with_comma))[2] == f"{with_comma}/model-0000.params"


def test_options_that_name_the_runs_own_output_are_refused_and_symbol_files_get_their_own_output():
    """--start_over moves the output's files before the run reads them; a run cannot be its own teacher;
    two model-zoo graphs (both model-symbol.json) train into two default output folders."""
    with pytest.raises(ConfigError, match="start_over = True: moves out's files .* --pretrained names a path "
                                          "inside it"):
        config_lib.make_config({"output": "out", "start_over": True, "pretrained": "out/model,3"})
    with pytest.raises(ConfigError, match="teacher = 'out/checkpoints': is inside this run's own output folder"):
        config_lib.make_config({"output": "out", "teacher": "out/checkpoints"})
    outputs = {config_lib.make_config({"network": f"zoo/{name}/model-symbol.json"}).output
               for name in ("ms1m-r100", "glint-r100")}
    assert outputs == {f"output/synthetic_{name}-r100-model_cosface-small" for name in ("ms1m", "glint")}


def test_a_projection_of_another_shape_starts_afresh_and_says_so():
    """Resuming a distilled run with a teacher of another width: its projection (and momentum) start afresh."""
    saved = mx.nd.zeros((128, 64))
    assert resume_lib.projection_to_continue(saved, (128, 64)) == (saved, ())
    kept, notes = resume_lib.projection_to_continue(saved, (256, 64))
    assert kept is None and notes == ("the distillation's projection starts afresh: the checkpoint's maps to 128 "
                                      "dimensions, this run's teacher has 256",)
    assert resume_lib.projection_to_continue(saved, None)[1] == (
        "the checkpoint's distillation projection is left out: this run has no projection",)
