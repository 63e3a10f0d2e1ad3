"""Fixtures shared by test files."""
import pytest

from launch import REFERENCE_RUN, config_sh, run_command, tiny_synthetic_run


@pytest.fixture(scope="session")
def reference(tmp_path_factory):
    """The uninterrupted 2-rank reference run: (data folder, output folder)."""
    root = tmp_path_factory.mktemp("reference")
    proc = run_command(config_sh(*tiny_synthetic_run(root / "data", root / "run", *REFERENCE_RUN)), timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return root / "data", root / "run"
