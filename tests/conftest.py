"""Fixtures shared by test files, and a marker per layer of the package (catalogue.LAYERS)."""
import pytest

import launch
import margin_golden
from catalogue import LAYER_OF, LAYERS
from launch import LEARNED_RUN, REFERENCE_RUN, config_sh, run_command, small_synthetic_run, tiny_synthetic_run
from mxnet_pfc.data import synthetic_set


def pytest_configure(config):
    for layer, (what, _) in LAYERS.items():
        config.addinivalue_line("markers", f"{layer}: {what}")


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The uninterrupted 2-rank reference run: (data folder, output folder)."""
    root = tmp_path_factory.mktemp("reference")
    proc = run_command(config_sh(*tiny_synthetic_run(root / "data", root / "run", *REFERENCE_RUN)), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return root / "data", root / "run"


@pytest.fixture(scope="session")
def learned(tmp_path_factory):
    """A 2-rank run that learns (120 steps, 100 identities; test_training checks that it does), the model the
    fine-tuning tests start from: (folder holding data/ and run/, the launcher's output)."""
    root = tmp_path_factory.mktemp("learned")
    rate, batch, grad_accum = LEARNED_RUN
    proc = run_command(config_sh(*small_synthetic_run(root, "--sample_rate", rate, "--batch_size", batch,
                                                      "--grad_accum", grad_accum)), timeout=360)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return root, proc.stdout


@pytest.fixture(scope="session")
def set_b(tmp_path_factory):
    """Synthetic set B, a user's own set to fine-tune on: 40 identities x 8 images and 100 held-out pairs,
    drawn with another seed than the generated sets of the runs above (other identities)."""
    folder = tmp_path_factory.mktemp("set-b")
    synthetic_set.generate(str(folder), 40, 8, val_identities=25, val_pairs=100, seed=7)
    return folder


@pytest.fixture(scope="session", params=margin_golden.RUNS, ids=lambda run: f"world{run[0]}-{run[1]}")
def margin_run(request, tmp_path_factory):
    """Every margin test's scenarios (margin_golden.register) on one (world size, kernel path), in one launch:
    (inputs, every rank's results). Session-scoped, so pytest groups the margin tests by run."""
    world, ops = request.param
    return margin_golden.golden(request.param, tmp_path_factory.mktemp(f"margins{world}{ops}"))


@pytest.hookimpl(tryfirst=True)         # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Each test gets the marker of its file's layer (`pytest -m head` runs the head's tests), and the fast
    lane (make test-fast) skips the tests marked slow, as it skips those that launch ranks.

    make test and make test-fast run the tests on three workers (pytest-xdist, --dist loadgroup), a group each
    at a time: a file is one group, so that its module fixtures are built once; the files that use one of the
    session's costly runs (conftest.learned, conftest.margin_run) say so with an xdist_group mark and share a
    worker, where it is built once, and so do test_slurm.py and test_two_hosts.py (two_hosts.TwoHosts' veth
    pair has one name)."""
    for item in items:
        layer = LAYER_OF.get(item.path.name)
        if layer is not None:
            item.add_marker(layer)
        if not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    if launch.FAST_LANE:
        skip = pytest.mark.skip(reason="slow: `make test` runs it (the fast lane skips it)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)
