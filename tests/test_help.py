"""Every option of every command has a sentence in --help (issue: options showing only a default)."""
import argparse
import importlib
import subprocess

import pytest

from launch import REPO

COMMANDS = ["mxnet_pfc.train", "mxnet_pfc.export", "mxnet_pfc.embed", "mxnet_pfc.verify", "mxnet_pfc.ijb",
            "mxnet_pfc.onnx_check", "mxnet_pfc.plan", "mxnet_pfc.data.pack", "mxnet_pfc.data.check",
            "mxnet_pfc.data.synthetic", "mxnet_pfc.elastic", "mxnet_pfc.doctor", "mxnet_pfc.clean",
            "mxnet_pfc.overlap", "mxnet_pfc.runtime.slurm",
            "bench_head", "bench_train", "bench_memory", "half_centers"]


class Captured(Exception):
    pass


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_says_what_it_is(command, monkeypatch):
    """The command's own parser, caught as main() parses; each option's help is a phrase, not just a default."""
    seen = {}

    def capture(self, args=None, namespace=None):
        seen["parser"] = self
        raise Captured

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))          # the benchmark scripts import as they run
    module = importlib.import_module(command)
    with pytest.raises(Captured):
        module.main(["--help"])
    actions = [a for a in seen["parser"]._actions if not isinstance(a, argparse._HelpAction)]
    assert actions
    missing = []
    for action in actions:
        text = (action.help or "").replace("%(default)s", "").strip()
        words = [w for w in text.split() if w.strip("().,:;") not in ("default", "")]
        name = f"{command} {'/'.join(action.option_strings) or action.dest}"
        if len(words) < 3:
            missing.append(f"{name}: help {action.help!r} is not a phrase")
        # an option that has a value when not given says which ('' stands for "none")
        default = action.default
        given_default = action.option_strings and not (default is None or default is False or default == ""
                                                       or default == argparse.SUPPRESS) \
            and not isinstance(action, argparse._StoreTrueAction)
        if given_default and "default" not in (action.help or "").lower():
            missing.append(f"{name}: help {action.help!r} does not say its default {action.default!r}")
    assert not missing, "\n".join(missing)


def test_make_run_passes_its_args_after_the_separator():
    """`make run ARGS="--network mbf"`: horovodrun would take --network for its --network-interface, so the
    Makefile puts ARGS after config.sh's "--" (issue 26)."""
    proc = subprocess.run(["make", "-n", "run", "ARGS=--network mbf"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert "bash config.sh -- --network mbf" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize("command", ["mxnet_pfc.verify", "mxnet_pfc.embed", "mxnet_pfc.ijb"])
def test_the_commands_take_the_trainers_spelling_of_batch_size(command):
    """The trainer's option is --batch_size (its fields' names); the commands' --batch-size also answers to it."""
    module = importlib.import_module(command)
    action = next(a for a in module.build_parser()._actions if a.dest == "batch_size")
    assert {"--batch-size", "--batch_size"} <= set(action.option_strings)
