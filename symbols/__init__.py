"""Backbones as MXNet symbols, chosen by name through a registry (never `eval`).

Every backbone maps `data` (N x 3 x 112 x 112, raw 0..255 pixels) to a float32
embedding (N x embedding_size).
"""
from functools import partial

from . import iresnet, mobilefacenet

INPUT_SHAPE = (3, 112, 112)

NETWORKS = {
    "r18": partial(iresnet.get_symbol, 18),
    "r34": partial(iresnet.get_symbol, 34),
    "r50": partial(iresnet.get_symbol, 50),
    "r100": partial(iresnet.get_symbol, 100),
    "mbf": mobilefacenet.get_symbol,
    # iResNet-18 at quarter width behind a stride-4 stem: ~40x cheaper, sized for
    # CPU runs (the synthetic default, the tests)
    "r18-lite": partial(iresnet.get_symbol, 18, width_mult=0.25, stem_stride=4),
}


def names():
    return sorted(NETWORKS)


def get_symbol(name, embedding_size=512, dropout=0.0, fp16=False):
    """The embedding symbol of the registered network `name`."""
    try:
        build = NETWORKS[name]
    except KeyError:
        raise ValueError(f"unknown network {name!r}; registered: {', '.join(names())}") from None
    return build(embedding_size=embedding_size, dropout=dropout, fp16=fp16)
