"""The memory planner: its model against the arrays the head really allocates, and the search for what fits."""
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest

from launch import REPO, rank_env
from mxnet_pfc import CombinedMarginLoss, PartialFC
from mxnet_pfc.head.memory_model import GIB, fits, head_memory, largest_batch, largest_rate


@pytest.mark.parametrize("rate", [0.1, 1.0])
def test_model_counts_what_the_head_allocates(rate):
    classes, dim, batch = 20_000, 16, 8
    head = PartialFC(CombinedMarginLoss(), embedding_size=dim, num_classes=classes, sample_rate=rate)
    rng = np.random.default_rng(0)
    head.forward_backward(mx.nd.array(rng.normal(size=(batch, dim))), rng.integers(0, classes, batch))
    model = head_memory(classes, 1, dim, rate, batch)
    assert model.num_sample == head.sampled_index.shape[0]
    assert model.centers == head.bank.weight.size * 4 and model.momentum == head.bank.weight_mom.size * 4
    # The sampler's tables live on the host, beside the draws copied there (the model allows one
    # more per row of the batch); none of it is device memory.
    tables = (head.sampler._table.nbytes + head.sampler._chosen.nbytes) if rate < 1 else 0
    draws = head.sampler.num_draws + batch if rate < 1 else 0
    assert model.host == tables + draws * (4 + 8 + 8)
    assert model.total == model.centers + model.momentum + model.sampled + model.logits + model.gradients
    logits = head.workspace._flat["logits"]
    assert model.logits == logits.size * 4
    # The fused CPU kernels take the centers in cache-sized blocks: no S x D buffer at all. The
    # model counts the MXNet-op path (GPU): the gathered centers (not at rate 1, read in place)
    # and their gradient, S x D float32 each, plus small per-center vectors.
    assert head.ops.name == "fused" and set(head.workspace._flat) == {"logits"}
    rows = model.num_sample * dim * 4
    assert model.sampled >= rows * (1 if rate == 1.0 else 2)


@pytest.mark.parametrize("rate", [0.1, 1.0])
def test_model_counts_the_rows_of_sub_centers(rate):
    """With K sub-centers per class the bank holds K rows per class, and the fused path's workspace the N x S x K
    cosines, the pooled N x S logits and their N x S winners (the model counts the MXNet path's arrays, the
    GPU's, which hold more: an upper bound here)."""
    from mxnet_pfc.head.margin import SubCenterArcFace

    classes, dim, batch, K = 20_000, 16, 8, 3
    head = PartialFC(SubCenterArcFace(subcenters=K), embedding_size=dim, num_classes=classes, sample_rate=rate)
    rng = np.random.default_rng(0)
    head.forward_backward(mx.nd.array(rng.normal(size=(batch, dim))), rng.integers(0, classes, batch))
    model = head_memory(classes, 1, dim, rate, batch, subcenters=K)
    assert model.num_sample == head.sampled_index.shape[0]
    assert model.centers == head.bank.weight.size * 4 == K * head_memory(classes, 1, dim, rate, batch).centers
    workspace = sum(a.size * 4 for a in head.workspace._flat.values())
    assert workspace == batch * model.num_sample * (K + 2) * 4
    assert model.logits == batch * model.num_sample * 4 * (1 + 5 * K) >= workspace


def test_model_counts_the_held_gradients_of_accumulation():
    classes, dim, batch = 20_000, 16, 8
    head = PartialFC(CombinedMarginLoss(), embedding_size=dim, num_classes=classes, sample_rate=0.1)
    rng = np.random.default_rng(0)
    head.forward_backward(mx.nd.array(rng.normal(size=(batch, dim))), rng.integers(0, classes, batch), 2, update=False)
    held = sum(a.size * 4 for a in head.bank._held)
    model = head_memory(classes, 1, dim, 0.1, batch, grad_accum=2)
    assert head_memory(classes, 1, dim, 0.1, batch).held_gradients == 0
    assert held <= model.held_gradients <= held + 2 * 2 * model.num_sample * (dim * 2 + 2) * 4
    assert model.total == head_memory(classes, 1, dim, 0.1, batch).total + model.held_gradients


def test_published_ten_million_on_eight_gpus_by_hand():
    m = head_memory(10_000_000, 8, 512, 0.1, 128)
    assert m.num_local == 1_250_000 and m.num_sample == 125_000
    assert m.centers == m.momentum == 1_250_000 * 512 * 4
    assert m.logits == 1024 * 125_000 * 4
    assert head_memory(10_000_000, 8, 512, 0.1, 128, "float16").centers == m.centers // 2


def test_largest_rate_and_batch_are_the_edges_of_what_fits():
    budget = 7 * GIB
    rate = largest_rate(10_000_000, 8, 512, 128, "float32", budget)
    assert head_memory(10_000_000, 8, 512, rate, 128).total <= budget
    assert head_memory(10_000_000, 8, 512, rate + 0.001, 128).total > budget
    batch = largest_batch(10_000_000, 8, 512, 0.1, "float32", budget)
    assert head_memory(10_000_000, 8, 512, 0.1, batch).total <= budget < head_memory(10_000_000, 8, 512, 0.1,
                                                                                      batch + 1).total
    assert largest_rate(10_000_000, 8, 512, 128, "float32", GIB) is None      # centers alone exceed 1 GiB


def test_rate_one_is_reported_apart_from_the_sampled_rates():
    # 29M identities on 8 x 32 GB, 4 GB reserve, batch 64: every center read in place fits, while
    # rate 0.9 (gathered copy and gradient, 2 x S x D) does not. "Largest rate 1" would say 0.9 fits.
    budget = 28 * GIB
    assert fits(29_000_000, 8, 512, 1.0, 64, "float32", budget)
    assert head_memory(29_000_000, 8, 512, 0.9, 64).total > budget
    rate = largest_rate(29_000_000, 8, 512, 64, "float32", budget)
    assert rate < 1
    assert head_memory(29_000_000, 8, 512, rate, 64).total <= budget < head_memory(29_000_000, 8, 512,
                                                                                   rate + 0.001, 64).total
    assert not fits(10_000_000, 8, 512, 1.0, 64, "float32", 7 * GIB)


def test_command_prints_the_published_settings_and_has_help():
    run = lambda *a: subprocess.run([sys.executable, "-m", "mxnet_pfc.plan", *a], cwd=REPO, env=rank_env(),  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    out = run("--published", "--reserve", "4", "--batch", "64")
    assert out.returncode == 0, out.stderr
    for what in ("10M identities on 8 RTX 2080 Ti", "100M identities on 64 RTX 2080 Ti",
                 "largest sample rate below 1", "sample rate 1 at this batch: fits", "sampler (host)"):
        assert what in out.stdout
    assert run("--help").returncode == 0
    bad = run("--sample-rate", "0")
    assert bad.returncode == 2 and "--sample-rate must be in (0, 1]" in bad.stderr


def test_command_runs_without_mxnet():
    """The planner is arithmetic (head/sampler.py's sizing functions): it never loads MXNet."""
    code = ("import sys; from mxnet_pfc import plan; plan.main(['--published']); plan.main([]); "
            "assert 'mxnet' not in sys.modules, 'the planner loaded MXNet'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=rank_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "10M identities on 8 RTX 2080 Ti" in proc.stdout, proc.stderr[-2000:]


def test_several_sets_count_every_head_over_its_rows_of_the_batch():
    """Two sets trained together (SetHeads): each head allocates its own bank and logits over its rows of the
    batch; the planner's sum of the sets' heads is what they hold, and the command prints it."""
    from mxnet_pfc.data.set_rows import rows_per_set
    from mxnet_pfc.head.memory_model import combined
    from mxnet_pfc.head.set_heads import SetHeads

    classes, dim, batch, rate = [20_000, 5_000], 16, 8, 0.1
    rows = rows_per_set(batch, classes)
    heads = [PartialFC(CombinedMarginLoss(), embedding_size=dim, num_classes=n, sample_rate=rate) for n in classes]
    rng = np.random.default_rng(0)
    labels = np.concatenate([rng.integers(0, n, r) for n, r in zip(classes, rows)])
    SetHeads(heads, rows).forward_backward(mx.nd.array(rng.normal(size=(batch, dim))), labels)
    total = combined([head_memory(n, 1, dim, rate, r) for n, r in zip(classes, rows)])
    assert total.centers == sum(head.bank.weight.size * 4 for head in heads)
    assert total.logits == sum(head.workspace._flat["logits"].size * 4 for head in heads)
    assert total.num_sample == sum(head.sampled_index.shape[0] for head in heads)
    out = subprocess.run([sys.executable, "-m", "mxnet_pfc.plan", "--classes", "20000,5000", "--world", "1",
                          "--embedding", str(dim), "--batch", str(batch)], cwd=REPO, env=rank_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"all 2 heads on each rank (batch {batch}/rank = {rows[0]} + {rows[1]})" in out.stdout
    assert f"head total (device)  {total.total / GIB:9.3f} GiB" in out.stdout.split("all 2 heads")[1]
