"""The test catalogue (tests/README.md) is what catalogue.py writes, and every test file has a summary and a layer."""
import subprocess
import sys

import catalogue
from launch import REPO


def test_every_test_file_has_a_one_line_docstring_and_one_layer():
    files = catalogue.all_test_files()
    assert [name for name in files if catalogue.summary(name) is None] == []
    listed = [name for _, names in catalogue.LAYERS.values() for name in names]
    assert sorted(listed) == files          # each file in exactly one layer, and no layer names a file not there


def test_the_readme_is_the_generated_catalogue():
    assert catalogue.README.read_text() == catalogue.render(), "tests/README.md is out of date: run make catalogue"


def test_a_layers_marker_selects_its_files_tests():
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m",
                           "head", "tests/test_exchange.py", "tests/test_config.py"], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected and all(line.startswith("tests/test_exchange.py::") for line in collected), proc.stdout[-3000:]
    assert "deselected" in proc.stdout
