"""Distillation from a frozen teacher (--teacher, --distill_weight): its gradient, and through config.sh.

The term's gradient against a float64 computation, and through config.sh: the student moves towards its
teacher while Partial FC trains, the teacher's cost is in the per-phase log, the export leaves the projection
out, a resume continues it bit for bit, and a teacher that does not fit stops both ranks before step 1."""
import json

import mxnet as mx
import numpy as np
import pytest

from launch import ckpt, config_sh, own_set_run, rank_stop_line, run_command
from mxnet_pfc.runtime.errors import ConfigError
from mxnet_pfc.training import distill

pytestmark = pytest.mark.xdist_group("learned")      # with the others using conftest.learned (conftest.py)


@pytest.mark.parametrize("student_width, teacher_width", [(6, 6), (5, 7)])
def test_the_distillation_term_and_its_gradients_match_a_float64_computation(student_width, teacher_width):
    """Loss = scale x sum_i (1 - cos(P s_i, t_i)); the gradients for s and for P, from the formula
    d cos(u, t) / du = (t^ - cos u^) / |u|, written here in float64."""
    rng = np.random.default_rng(0)
    n, scale = 4, 0.3
    s = rng.standard_normal((n, student_width))
    t = rng.standard_normal((n, teacher_width))
    P = rng.standard_normal((teacher_width, student_width)) if student_width != teacher_width else np.eye(n)
    symbol = distill.training_symbol(mx.sym.Variable("s"), student_width, teacher_width, scale)
    args = {"s": mx.nd.array(s), distill.TEACHER_INPUT: mx.nd.array(t)}
    if student_width != teacher_width:
        args[distill.PROJECTION_WEIGHT] = mx.nd.array(P)
    grads = {name: mx.nd.zeros(value.shape) for name, value in args.items()}
    executor = symbol.bind(mx.cpu(), args, args_grad=grads)
    outputs = executor.forward(is_train=True)
    executor.backward([mx.nd.zeros((n, student_width)), mx.nd.ones((n,))])

    u = s @ P.T if student_width != teacher_width else s
    uh, th = u / np.linalg.norm(u, axis=1, keepdims=True), t / np.linalg.norm(t, axis=1, keepdims=True)
    cos = (uh * th).sum(1)
    d_u = -scale * (th - cos[:, None] * uh) / np.linalg.norm(u, axis=1, keepdims=True)
    np.testing.assert_allclose(outputs[1].asnumpy(), 1 - cos, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outputs[0].asnumpy(), s, rtol=1e-6)
    if student_width != teacher_width:
        np.testing.assert_allclose(grads["s"].asnumpy(), d_u @ P, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(grads[distill.PROJECTION_WEIGHT].asnumpy(), d_u.T @ s, rtol=1e-4, atol=1e-6)
    else:
        np.testing.assert_allclose(grads["s"].asnumpy(), d_u, rtol=1e-4, atol=1e-6)


def distill_records(output) -> dict:
    records = [json.loads(line) for line in open(output / "metrics.jsonl")]
    return {r["step"]: (r["loss"], r["distill/cosine"]) for r in records if "loss" in r}


def test_a_student_moves_towards_its_teacher_and_a_resume_continues_the_projection(learned, set_b, tmp_path):
    """A 64-d student of the 128-d learned model on set B, 2 ranks, distill_weight 10: the mean cosine
    to the teacher rises; the teacher's share of a step is logged; the export is the student alone; a
    resume from step 10 gives steps 11-20 (loss and cosine) bit for bit."""
    teacher = learned[0] / "run"
    output = tmp_path / "student"
    options = ("--teacher", teacher, "--distill_weight", 10, "--embedding_size", 64, "--max_update", 20,
               "--save_interval", 10)
    proc = run_command(config_sh(*own_set_run(set_b, output, *options)), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "learned 64 -> 128 projection" in proc.stdout and "| data wait" in proc.stdout
    assert " teacher " in next(line for line in proc.stdout.splitlines() if "step 1/20" in line)
    records = distill_records(output)
    cosine = [records[step][1] for step in sorted(records)]
    assert np.mean(cosine[-3:]) > np.mean(cosine[:3]) + 0.2, cosine
    print(f"cosine to the teacher: {cosine[0]:.3f} -> {cosine[-1]:.3f}")
    exported = json.loads((output / "model-symbol.json").read_text())
    assert not any("distill" in node["name"] for node in exported["nodes"])
    assert not any("distill" in name for name in mx.nd.load(str(output / "model-0000.params")))
    saved = mx.nd.load(str(ckpt(output / "checkpoints", 10) / "model-0000.params"))
    assert saved[f"arg:{distill.PROJECTION_WEIGHT}"].shape == (128, 64)

    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    (resumed / "checkpoints" / ckpt(output / "checkpoints", 10).name).symlink_to(ckpt(output / "checkpoints", 10))
    proc = run_command(config_sh(*own_set_run(set_b, resumed, *options, "--resume", "latest")), timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert distill_records(resumed) == {step: value for step, value in records.items() if step > 10}


def test_a_teacher_that_does_not_fit_stops_both_ranks_before_the_first_step(set_b, tmp_path):
    """A teacher trained on 96 x 96 faces (its parameters are for that input) is named on both ranks; a
    missing teacher is named by setup's reading."""
    data = mx.sym.Variable("data")
    symbol = mx.sym.FullyConnected(mx.sym.flatten(data), num_hidden=8, name="fc")
    mx.model.save_checkpoint(str(tmp_path / "small"), 0, symbol,
                             {"fc_weight": mx.nd.zeros((8, 3 * 96 * 96)), "fc_bias": mx.nd.zeros((8,))}, {})
    with pytest.raises(ConfigError, match=f"teacher = '{tmp_path}/missing': .*no model there"):
        distill.read_teacher(str(tmp_path / "missing"), 112)
    teacher = tmp_path / "small"
    proc = run_command(config_sh(*own_set_run(set_b, tmp_path / "run", "--teacher", teacher, "--max_update", 2)),
                       timeout=300)
    assert proc.returncode != 0
    for rank in range(2):
        line = rank_stop_line(proc.stdout, rank)
        expected = "are for another input than 3 x 112 x 112 faces: fc_weight (8, 27648), at this input (8, 37632)"
        assert f"teacher = '{teacher}'" in line and expected in line, proc.stdout[-3000:]
    assert "step 1/" not in proc.stdout
