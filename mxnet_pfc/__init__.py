"""mxnet-pfc: Partial FC for MXNet + Horovod (sharded, sampled, exact margin softmax)."""
from .margin import CombinedMarginLoss
from .memory_bank import MemoryBank, shard_range
from .partial_fc import PartialFC, PartialFCInputError

__all__ = ["CombinedMarginLoss", "MemoryBank", "PartialFC", "PartialFCInputError", "shard_range"]
__version__ = "0.1.0"
