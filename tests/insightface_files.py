"""Graphs and files written by insightface's own MXNet code, for the tests of issue 25.

Everything here runs insightface's code from the unmodified copies in tests/third_party/insightface (which commit,
which files, and what is stood in for: its README.md), in this process, with their config modules set the way their
training scripts set them. Only what their scripts do inside a function we cannot call (train.py's save in
train_net's batch callback, train_memory.py's get_symbol_embedding and its MemoryBank arguments) is repeated here,
each time naming the lines it repeats.

Importing this module has no side effects; each call imports their code afresh (so one call's config never leaks
into the next) and removes it from sys.modules again, since both of their folders have a `symbol_utils` and a config
module imported by bare name.
"""
import argparse
import contextlib
import importlib
import importlib.util
import io
import logging
import sys
import types
from pathlib import Path

import mxnet as mx
import numpy as np

THIRD_PARTY = Path(__file__).resolve().parent / "third_party" / "insightface"
ARCFACE = THIRD_PARTY / "arcface_mxnet"
PARTIAL_FC = THIRD_PARTY / "partial_fc_mxnet"
IMAGE_SHAPE = (3, 112, 112)     # raw 0..255 RGB; both projects' graphs do (x - 127.5) * 0.0078125 themselves
# The centers and momentum of the rows a ceil split leaves unused (global row >= num_classes), so a test sees at
# once if one of them was taken for a class.
PAD_VALUE = -1000.0

# arcface_mxnet network: name -> (entry of their sample_config.network, config fields set on top of it).
# r100 and y1 are the entries of the model-zoo LResNet-IR and MobileFaceNet models; 18 is the fewest layers
# fresnet.get_symbol accepts.
ARCFACE_NETWORKS = {
    "fresnet": ("r100", {"num_layers": 18}),
    "fmobilefacenet": ("y1", {}),
}


# ---------------------------------------------------------------- running their code


class _EasyDict(dict):
    """Stands in for easydict.EasyDict (not installed): a dict whose keys are also attributes, all their configs
    use of it."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self[name] = value


def _module(name: str, **attributes) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    return module


def _missing_packages() -> dict:
    """Stand-ins for packages their modules import but this environment lacks: easydict (their configs) and
    sklearn (fresnet.py imports it and never uses it)."""
    stand_ins = {}
    if importlib.util.find_spec("easydict") is None:
        stand_ins["easydict"] = _module("easydict", EasyDict=_EasyDict)
    if importlib.util.find_spec("sklearn") is None:
        stand_ins["sklearn"] = _module("sklearn")
    return stand_ins


def _from_copies(module) -> bool:
    return str(getattr(module, "__file__", None) or "").startswith(str(THIRD_PARTY))


@contextlib.contextmanager
def _their_code(folders: list, stand_ins: dict):
    """Their scripts import siblings by bare name from their own folder: put `folders` first on sys.path and
    `stand_ins` in sys.modules; afterwards put back sys.path, every sys.modules entry that now holds one of their
    modules or a stand-in, and the root logger's level (train.py sets INFO on import). Their builders print their
    config; that goes nowhere."""
    saved_path = list(sys.path)
    saved_modules = dict(sys.modules)
    root_level = logging.getLogger().level
    sys.path[:0] = [str(folder) for folder in folders]
    sys.modules.update(stand_ins)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        sys.path[:] = saved_path
        for name, module in list(sys.modules.items()):
            if module is not saved_modules.get(name) and (_from_copies(module) or name in stand_ins):
                if name in saved_modules:
                    sys.modules[name] = saved_modules[name]
                else:
                    del sys.modules[name]
        logging.getLogger().setLevel(root_level)


def _load_as(name: str, path: Path) -> types.ModuleType:
    """Import the file at `path` as module `name` (their README's `cp sample_config.py config.py`, without the
    copy)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _sane_bn_stats(aux: dict, rng: np.random.Generator) -> dict:
    """Moving means near 0 and variances in [0.5, 1.5], drawn per layer: not the initializer's 0 and 1 for every
    layer, so a loader that skipped the aux: entries would change the embeddings and be seen."""
    out = {}
    for key, value in aux.items():
        if key.endswith("moving_var"):
            out[key] = mx.nd.array(rng.uniform(0.5, 1.5, value.shape), dtype=value.dtype)
        elif key.endswith("moving_mean"):
            out[key] = mx.nd.array(rng.normal(0.0, 0.1, value.shape), dtype=value.dtype)
        else:
            out[key] = value
    return out


def _bound_params(symbol, label_names, initializer, seed: int):
    """The module their trainer fits, bound on the CPU and initialised with their initializer: (arg, aux)."""
    module = mx.mod.Module(symbol, data_names=["data"], label_names=label_names, context=mx.cpu())
    module.bind(data_shapes=[("data", (2,) + IMAGE_SHAPE)],
                label_shapes=[(name, (2,)) for name in label_names], for_training=True)
    mx.random.seed(seed)            # MXNet's initializers draw from its global generator
    module.init_params(initializer=initializer)
    return module.get_params()


# ---------------------------------------------------------------- arcface_mxnet


def _arcface_train_symbol(network: str, embedding_size: int, num_classes: int, fields: dict):
    """train.py's training symbol (its get_symbol: embedding, fc7 head with the ArcFace margin, softmax) and its
    config, after train.py's parse_args (generate_config with its default dataset and loss) and train_net
    (per_batch_size, batch_size); then `network`'s preset, the width, the class count and `fields`."""
    entry, preset = ARCFACE_NETWORKS.get(network, (network, {}))
    stand_ins = _missing_packages()
    # train.py imports it for validation only; the real one needs scipy and sklearn, not installed
    stand_ins["verification"] = _module("verification")
    with _their_code([ARCFACE, ARCFACE / "symbol", ARCFACE / "common"], stand_ins):
        their = _load_as("config", ARCFACE / "sample_config.py")
        default = their.default
        their.generate_config(entry, default.dataset, default.loss)
        config = their.config
        config.per_batch_size = config.batch_size = default.per_batch_size
        config.update(preset, emb_size=embedding_size, num_classes=num_classes, **fields)
        train = importlib.import_module("train")
        symbol = train.get_symbol(argparse.Namespace(per_batch_size=default.per_batch_size))
        return symbol, _EasyDict(config)


def arcface_symbol(network: str, embedding_size: int, **fields) -> mx.sym.Symbol:
    """The embedding graph of arcface_mxnet's `network` ('fresnet', 'fmobilefacenet' or an entry of their
    sample_config.network), as train.py builds it: its internal output `fc1_output`, input `data`.
    `fields` set config fields on top (num_layers, net_blocks, net_input, net_output, ...)."""
    symbol, _ = _arcface_train_symbol(network, embedding_size, 2, fields)
    return symbol.get_internals()["fc1_output"]


def write_model_zoo(prefix, network: str, embedding_size: int, num_classes: int, seed: int, *, epoch: int = 0,
                    **fields) -> dict:
    """PREFIX-symbol.json and PREFIX-%04d.params as arcface_mxnet's train.py saves a model: its training module's
    parameters, initialised by its initializer (seeded; BatchNorm moving stats drawn, see _sane_bn_stats), saved
    as its ckpt_embedding branch does (config.ckpt_embedding is True in sample_config): the symbol is the internal
    `fc1_output`, the arg: entries are all but the fc7 head's, the aux: entries all. With fields
    ckpt_embedding=False it saves the whole training symbol and every parameter, fc7_weight included.
    train.py names the epoch by its save counter (1 with its default --ckpt 3); the released models are epoch 0.
    Returns the paths, the config values that shaped the graph, and the fc7 head it dropped or kept."""
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    symbol, config = _arcface_train_symbol(network, embedding_size, num_classes, fields)
    if config.net_name in ("fresnet", "fmobilefacenet"):      # train.py's choice of initializer
        initializer = mx.init.Xavier(rnd_type="gaussian", factor_type="out", magnitude=2)
    else:
        initializer = mx.init.Xavier(rnd_type="uniform", factor_type="in", magnitude=2)
    arg, aux = _bound_params(symbol, ["softmax_label"], initializer, seed)
    aux = _sane_bn_stats(aux, np.random.default_rng(seed))
    # train.py, train_net._batch_callback, `if do_save:`
    if config.ckpt_embedding:
        saved_symbol = symbol.get_internals()["fc1_output"]
        saved_arg = {k: v for k, v in arg.items() if not k.startswith("fc7")}
    else:
        saved_symbol, saved_arg = symbol, arg
    mx.model.save_checkpoint(str(prefix), epoch, saved_symbol, saved_arg, aux)
    return {
        "prefix": str(prefix), "epoch": epoch,
        "symbol": Path("%s-symbol.json" % prefix), "params": Path("%s-%04d.params" % (prefix, epoch)),
        "config": {k: config[k] for k in ("net_name", "num_layers", "net_blocks", "net_input", "net_output",
                                          "net_unit", "net_act", "net_se", "bn_mom", "emb_size", "num_classes",
                                          "ckpt_embedding") if k in config},
        "fc7_weight": arg["fc7_weight"].asnumpy(),
    }


# ---------------------------------------------------------------- partial_fc/mxnet


class _Horovod:
    """Stands in for horovod.mxnet in callbacks.py's CallBackModelSave, which averages every parameter over the
    ranks with hvd.allreduce(tensor, average=True) before rank 0 saves model_average. Here one process plays every
    rank: `ranks` maps id(rank 0's tensor) to all ranks' tensors of that parameter (those missing are the same on
    every rank)."""

    def __init__(self, ranks: dict):
        self.ranks = ranks

    def allreduce(self, tensor, average=True):
        tensors = self.ranks.get(id(tensor), [tensor])
        total = mx.nd.add_n(*tensors) if len(tensors) > 1 else tensors[0].copy()
        return total / len(tensors) if average else total


class _Module:
    """What CallBackModelSave asks of memory_module.SampleDistributeModule (which needs Horovod and a GPU):
    get_export_params(), the backbone's (arg, aux)."""

    def __init__(self, arg: dict, aux: dict):
        self.arg, self.aux = arg, aux

    def get_export_params(self):
        return dict(self.arg), dict(self.aux)


def _partial_fc_stand_ins(hvd: "_Horovod | None" = None) -> dict:
    """With `hvd`, also what callbacks.py imports."""
    stand_ins = _missing_packages()
    if hvd is not None:
        mxnet_part = _module("horovod.mxnet", allreduce=hvd.allreduce)
        stand_ins["horovod"] = _module("horovod", mxnet=mxnet_part, __path__=[])
        stand_ins["horovod.mxnet"] = mxnet_part
        # callbacks.py imports it for CallBackVertification; the real one needs scipy and sklearn
        verification = _module("evaluation.verification")
        stand_ins["evaluation"] = _module("evaluation", verification=verification, __path__=[])
        stand_ins["evaluation.verification"] = verification
    return stand_ins


def _partial_fc_config(embedding_size: int, num_classes: int, fields: dict):
    """default.py's config after train_memory.py's parse_args (generate_config with its default loss, dataset and
    network: cosface, emore, r100), then the fewest layers their resnet.get_symbol accepts (18), the width, the
    class count and `fields`."""
    default = importlib.import_module("default")
    default.generate_config("cosface", "emore", "r100")
    config = default.config
    config.update(num_layers=18, embedding_size=embedding_size, num_classes=num_classes, **fields)
    return config


def _partial_fc_symbols():
    """train_memory.py's get_symbol_embedding (repeated: importing train_memory.py needs Horovod, its data
    iterator and its module): the training symbol (embedding, blocked label) and the embedding it saves."""
    resnet = importlib.import_module("symbol.resnet")
    embedding = resnet.get_symbol()
    all_label = mx.symbol.BlockGrad(mx.symbol.Variable("softmax_label"))
    return mx.symbol.Group([embedding, all_label]), embedding


def partial_fc_symbol(embedding_size: int, **fields) -> mx.sym.Symbol:
    """The embedding graph the MXNet Partial FC trains and saves (resnet.get_symbol with its default.py config,
    18 layers, net_output 'FC'): output `fc1_output`, input `data`. `fields` set config fields on top."""
    with _their_code([PARTIAL_FC], _partial_fc_stand_ins()):
        _partial_fc_config(embedding_size, 2, fields)
        return _partial_fc_symbols()[1]


def write_partial_fc_run(folder, num_classes: int, world_size: int, embedding_size: int, seed: int,
                         **fields) -> dict:
    """The output folder of an MXNet Partial FC run on `world_size` ranks, written by its code:
    - model-symbol.json / model-0000.params and model_average-*: callbacks.py's CallBackModelSave, called on
      rank 0 at update 10000, with the backbone initialised by train_memory.py's initializer (Normal(0.1),
      seeded). Every rank gets its own BatchNorm moving stats (they are not synchronised in a real run), so the
      rank-averaged model_average differs from model in its aux: entries only.
    - %d_centers.param / %d_centers_mom.param for each rank: memory_bank.MemoryBank (gpu=False, num_local and
      num_sample as train_memory.py computes them), filled through its set() and written by its save(). Global
      class c is row c - r * num_local of rank r = c // num_local; rows past num_classes hold PAD_VALUE.
    Returns the paths, num_local, and the full (num_classes, D) centers and momentum written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    hvd = _Horovod({})
    with _their_code([PARTIAL_FC], _partial_fc_stand_ins(hvd)):
        config = _partial_fc_config(embedding_size, num_classes, fields)
        training_symbol, save_symbol = _partial_fc_symbols()
        arg, aux = _bound_params(training_symbol, ["softmax_label"], mx.init.Normal(0.1), seed)
        rank_aux = [_sane_bn_stats(aux, rng) for _ in range(world_size)]
        hvd.ranks.update({id(rank_aux[0][k]): [ranks[k] for ranks in rank_aux] for k in aux})

        callbacks = importlib.import_module("callbacks")
        memory_bank = importlib.import_module("memory_bank")
        save = callbacks.CallBackModelSave(save_symbol, _Module(arg, rank_aux[0]), str(folder / "model"), rank=0)
        save(types.SimpleNamespace(num_update=10000, num_epoch=0, loss=None))

        # train_memory.py, train_net: the ceil split and the sampled count
        num_local = (config.num_classes + world_size - 1) // world_size
        num_sample = int(num_local * config.sample_ratio)
        rows = num_local * world_size
        centers = np.full((rows, embedding_size), PAD_VALUE, np.float32)
        momentum = np.full((rows, embedding_size), PAD_VALUE, np.float32)
        centers[:num_classes] = rng.standard_normal((num_classes, embedding_size))
        momentum[:num_classes] = rng.normal(0.0, 0.01, (num_classes, embedding_size))
        for rank in range(world_size):
            bank = memory_bank.MemoryBank(num_sample=num_sample, num_local=num_local, rank=rank, local_rank=rank,
                                          embedding_size=config.embedding_size, prefix=str(folder), gpu=False)
            mine = slice(rank * num_local, (rank + 1) * num_local)
            bank.set(mx.nd.arange(num_local, dtype="int64"), mx.nd.array(centers[mine]),
                     mx.nd.array(momentum[mine]))
            bank.save()
    return {
        "folder": folder, "prefix": str(folder / "model"),
        "symbol": folder / "model-symbol.json", "params": folder / "model-0000.params",
        "average_prefix": str(folder / "model_average"), "average_symbol": folder / "model_average-symbol.json",
        "average_params": folder / "model_average-0000.params",
        "centers_files": [folder / ("%d_centers.param" % r) for r in range(world_size)],
        "momentum_files": [folder / ("%d_centers_mom.param" % r) for r in range(world_size)],
        "num_local": num_local, "world_size": world_size, "num_classes": num_classes,
        "embedding_size": embedding_size,
        "centers": centers[:num_classes].copy(), "momentum": momentum[:num_classes].copy(),
    }
