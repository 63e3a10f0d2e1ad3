"""mxnet-pfc: Partial FC for MXNet + Horovod (sharded, sampled, exact margin softmax).

The modules at this level are the commands (`python -m mxnet_pfc.NAME`); the
folders are the layers: head, runtime, training, data, eval, models. The head's
public classes are importable from here; they load MXNet only when first used,
so a command that does arithmetic alone (plan) starts without it.
"""
import importlib

_MARGINS = ("CombinedMarginLoss", "AdaFaceMargin", "CurricularFaceMargin", "ElasticFaceMargin", "MagFaceMargin",
            "SubCenterArcFace", "make_margin")
_PUBLIC = {**{name: "mxnet_pfc.head.margin" for name in _MARGINS},
           "MemoryBank": "mxnet_pfc.head.memory_bank",
           "shard_range": "mxnet_pfc.head.sampler", "PartialFC": "mxnet_pfc.head.partial_fc",
           "PartialFCInputError": "mxnet_pfc.head.partial_fc"}
__all__ = sorted(_PUBLIC)
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'mxnet_pfc' has no attribute {name!r}")
