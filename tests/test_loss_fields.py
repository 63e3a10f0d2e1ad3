"""The configuration's loss fields come from head/margin.py alone: a loss added there is a field, option, preset."""
import dataclasses
import inspect
import subprocess
import sys

from launch import REPO
from mxnet_pfc.head import margin
from mxnet_pfc.training import config


def test_every_margin_parameter_that_is_a_field_is_stated_once_and_agrees():
    """Each class says each of its fields but margin_s in a sentence; a field two classes share (margin_s,
    margin_m1..m3) has the same type and default in both, so that the first class's statement holds."""
    for kind, _ in margin.LOSSES.values():
        assert set(kind.CONFIG_HELP) == set(margin.config_params(kind)) - {"s"}, kind.__name__
        signature = inspect.signature(kind).parameters
        for param in margin.config_params(kind):
            field = margin.config_fields()[margin.config_field(kind, param)]
            assert (field.type, field.default) == (signature[param].annotation, signature[param].default), \
                (kind.__name__, param)


def test_the_config_has_each_margin_field_with_its_type_default_and_help_in_the_loss_section():
    by_name = {f.name: f for f in dataclasses.fields(config.Config)}
    for name, field in margin.config_fields().items():
        assert (by_name[name].type, by_name[name].default) == (field.type, field.default), name
        assert config.FIELD_HELP[name] == field.help
        assert name in config.SECTIONS["head and loss"]
    for loss, (kind, _) in margin.LOSSES.items():       # a preset sets its own fields to its published values
        own = {margin.config_field(kind, p): margin.preset_params(loss)[p] for p in margin.config_params(kind)}
        assert config.LOSSES[loss] == {"loss": loss, **own}


NEW_LOSS = '''
from __future__ import annotations      # as margin.py has it
from mxnet_pfc.head import margin

class ToyMargin(margin.CombinedMarginLoss):
    """A loss added to margin.py only."""
    PARAM_NAMES = ("s", "q")
    CONFIG_PREFIX = "toy"
    CONFIG_HELP = {"q": "The toy loss's q, a test's (--loss toy)."}

    def __init__(self, s: float = 64.0, q: float = 0.25):
        super().__init__(s=s)
        self.q = q

margin.LOSSES["toy"] = (ToyMargin, {})
from mxnet_pfc.training import config
cfg = config.parse_args(["--loss", "toy", "--toy_q", "0.5", "--margin_s", "30"])
print(cfg.toy_q, cfg.margin_s, config.margin_of(cfg).q, config.make_config({}).toy_q)
config.build_parser().print_help()
'''


def test_a_loss_added_to_margin_py_only_is_a_field_an_option_and_a_preset():
    proc = subprocess.run([sys.executable, "-c", NEW_LOSS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    values, help_text = proc.stdout.split("\n", 1)
    assert values == "0.5 30.0 0.5 0.25"
    flat = " ".join(help_text.split())
    assert "--toy_q FLOAT The toy loss's q, a test's (--loss toy). Default: 0.25." in flat
    assert "toy_q for toy" in flat             # the --loss option lists the preset's own fields
