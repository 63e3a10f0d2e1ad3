"""The test catalogue: tests/README.md, written from each test file's docstring, by the layer it tests.

`python tests/catalogue.py` (or `make catalogue`) writes it; test_catalogue.py fails when it is out of date.
LAYERS says which layer of the package each test file tests; conftest.py marks the tests with it, so that
`pytest -m head` runs the head's tests.
"""
import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
README = TESTS / "README.md"

# layer: (what it is, its test files). Every tests/test_*.py is in exactly one (test_catalogue.py checks).
LAYERS = {
    "head": ("The Partial FC head (`mxnet_pfc/head/`): the step and its collectives, the margins, the sampler, "
             "the memory bank and its memory model, the fused kernels.",
             ("test_adaface.py", "test_bad_input.py", "test_bank_memory.py", "test_center_search.py",
              "test_curricularface.py", "test_distributed.py", "test_elasticface.py", "test_exchange.py",
              "test_graph_safety.py", "test_kernels.py", "test_magface.py", "test_plan.py", "test_reference.py",
              "test_set_heads.py", "test_sharding_and_sampling.py", "test_subcenter.py")),
    "data": ("Data (`mxnet_pfc/data/`): RecordIO sets and image folders, decoding, the iterators, packing and "
             "the synthetic sets.",
             ("test_clean.py", "test_cleaning.py", "test_damaged_images.py", "test_data.py", "test_data_safety.py",
              "test_faces.py", "test_image_bounds.py", "test_overlap.py", "test_overlap_run.py", "test_own_data.py",
              "test_record_index.py", "test_sets_iter.py", "test_synthetic_planted.py")),
    "training": ("The trainer (`mxnet_pfc/training/`): configuration and recipes, the module, checkpoints and "
                 "resumes, starting points, distillation, a run end to end through config.sh.",
                 ("test_checkpoint.py", "test_config.py", "test_distillation.py", "test_faults.py",
                  "test_insightface_files.py", "test_insightface_runs.py", "test_loss_fields.py",
                  "test_loss_presets.py", "test_module.py", "test_recipe.py", "test_run_history.py",
                  "test_run_inputs.py", "test_sets_training.py", "test_starting_points.py", "test_training.py",
                  "test_user_path.py")),
    "runtime": ("The processes of a run (`mxnet_pfc/runtime/`): launching and stopping ranks, the watchdog, the "
                "elastic supervisor, Slurm, the output folder's files, errors and MXNet's files.",
                ("test_array_files.py", "test_checkpoint_files.py", "test_elastic.py", "test_elastic_adopt.py",
                 "test_elastic_trust.py",
                 "test_launch_signals.py", "test_messages.py", "test_run_folder.py", "test_slurm.py",
                 "test_slurm_bounds.py", "test_stops.py", "test_supervisor_decide.py", "test_two_hosts.py",
                 "test_watchdog.py")),
    "eval": ("Evaluation (`mxnet_pfc/eval/`): verification on .bin pair sets, IJB-B / IJB-C.",
             ("test_bin_file.py", "test_ijb.py", "test_verification.py")),
    "models": ("Trained models (`mxnet_pfc/models/`, `symbols/`): the backbones, export, inference.",
               ("test_export.py", "test_export_checkpoints.py", "test_symbols.py")),
    "setup": ("The package as a whole: installing it, the GPU set-up and preflight, every command's --help, the "
              "layering, the documentation's examples, the benchmark scripts.",
              ("test_bench_data.py", "test_benchmarks.py", "test_catalogue.py", "test_doc_examples.py",
               "test_doctor.py", "test_gpu_setup.py", "test_help.py", "test_installed.py", "test_layering.py")),
}
LAYER_OF = {name: layer for layer, (_, names) in LAYERS.items() for name in names}

HEADER = """\
# The tests

`make test-fast` runs the unit and single-process tests, what to run after
each edit: a test that launches ranks (horovodrun, mpirun, config.sh, run.sh,
the elastic supervisor, Slurm, bench_memory.py) is skipped where
`launch.start_command` would start them (`MXNET_PFC_FAST_TESTS=1`), and so is
a single-process test marked `slow` (pytest.ini). `make test` installs what is
missing (see [docs/install.md](../docs/install.md)) and runs every test below
with pytest; `.ci/run` runs `make test`. Both run on three pytest-xdist workers,
a file at a time, the files that share one of the session's runs on one worker
(`conftest.py`; `TEST_WORKERS=0` runs them in one process); the tests start
ranks with Horovod's launcher less its Gloo-built check (`launch.horovodrun`).
How long the suite takes is in
[docs/benchmarks.md](../docs/benchmarks.md#the-test-suite). Tests that need
something this machine may not allow (network namespaces for two hosts) skip
and say why. Every multi-process test runs under a timeout that kills the whole
process group.

Helpers: `reference.py` is the float64 reference the head is tested against
(dense matrices, hand-derived gradients checked by finite differences, written
from [docs/DESIGN.md](../docs/DESIGN.md) section 2); `launch.py` starts
multi-rank runs; `two_hosts.py` builds two network namespaces with sshd;
`*_worker.py` are the programs the multi-rank tests run on each rank.

## The catalogue

Each test file under the layer of the package it tests, with the first line of
its docstring (the rest of the docstring says more). `pytest -m LAYER` runs one
layer's tests (`pytest -m head`). This list is written by `make catalogue`
(`tests/catalogue.py`) from the docstrings; `test_catalogue.py` fails when it is
out of date.
"""


def all_test_files() -> "list[str]":
    """The names of tests/test_*.py."""
    return sorted(path.name for path in TESTS.glob("test_*.py"))


def summary(name: str) -> "str | None":
    """The test file's one-line summary: its docstring's first line, when the docstring has one (a first line
    that goes on to the next is no summary)."""
    doc = ast.get_docstring(ast.parse((TESTS / name).read_text()))
    lines = (doc or "").splitlines()
    if not lines or not lines[0].strip() or (len(lines) > 1 and lines[1].strip()):
        return None
    return lines[0].strip()


def render() -> str:
    """tests/README.md as it should be."""
    parts = [HEADER]
    for layer, (what, names) in LAYERS.items():
        parts.append(f"\n### {layer}\n\n{what}\n\n")
        parts += [f"- `{name}`: {summary(name)}\n" for name in names]
    return "".join(parts)


def main() -> int:
    problems = [f"{name}: no one-line docstring" for name in all_test_files() if summary(name) is None]
    problems += [f"{name}: in no layer of tests/catalogue.py's LAYERS" for name in all_test_files()
                 if name not in LAYER_OF]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    README.write_text(render())
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
