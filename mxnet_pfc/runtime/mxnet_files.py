"""MXNet's model and array files, read as data a user was handed: the one place that loads them.

MXNet believes every count and shape in an array file (a 24-byte file can make it allocate gigabytes)
and builds any operator a graph names; its errors name no file and start with a C++ stack. So an array
file is opened as files.opened_regular opens every handed file, its layout walked by array_file.problem
before MXNet reads the very file checked (by its descriptor); a graph goes through symbol_file; and every
failure is the caller's error type naming the file, with MXNet's reason (errors.mxnet_reason).
"""
from __future__ import annotations

import os

from mxnet_pfc.runtime import array_file, reading
from mxnet_pfc.runtime.errors import PfcError, mxnet_reason
from mxnet_pfc.runtime.files import opened_regular
from mxnet_pfc.runtime.run_folder import ModelFiles
from mxnet_pfc.runtime.symbol_file import load_symbol

# No bound of its own: a rank's centers of a 100M-class run are tens of GB; array_file bounds the cost
# of what the file announces by what it holds.
MAX_ARRAY_FILE_BYTES = 1 << 44


@reading.reads_file          # a file that kills the rank reading it is named to the supervisor
def load_arrays(file: str, error_type=PfcError):
    """mx.nd.load(file), a failure raised as error_type naming the file and what is wrong with it."""
    import mxnet as mx

    try:
        with opened_regular(file, MAX_ARRAY_FILE_BYTES, "an MXNet array file", error_type) as (f, size):
            problem = array_file.problem(f, size)
            if problem is not None:
                raise error_type(f"{file}: cannot load: {problem}")
            try:
                return mx.nd.load(f"/proc/self/fd/{f.fileno()}" if os.path.isdir("/proc/self/fd") else file)
            except (mx.base.MXNetError, UnicodeDecodeError) as error:
                raise error_type(f"{file}: cannot load: {mxnet_reason(error)}") from None
    except FileNotFoundError as error:
        raise error_type(f"{file}: cannot load: {error.strerror}") from None


def load_params(file: str, error_type=PfcError) -> "tuple[dict, dict]":
    """(arg_params, aux_params) of an MXNet .params file; a failure is error_type naming the file.

    mx.model.load_params, whose errors name neither the file nor, for a file
    saved without arg:/aux: names, anything at all.
    """
    saved = load_arrays(file, error_type)
    if not isinstance(saved, dict) or not all(key.startswith(("arg:", "aux:")) for key in saved):
        raise error_type(f"{file}: not a model's parameters: its arrays are not named arg:NAME and aux:NAME")
    params = {"arg": {}, "aux": {}}
    for key, value in saved.items():
        params[key[:3]][key[4:]] = value
    return params["arg"], params["aux"]


def load_checkpoint(prefix: str, epoch: int = 0, error_type=PfcError):
    """(symbol, arg_params, aux_params) of PREFIX-symbol.json + PREFIX-EPOCH.params, as
    mx.model.load_checkpoint reads them; a failure is error_type naming the file. The graph is read
    through symbol_file.load_symbol, which refuses the operators no file may use."""
    files = ModelFiles(prefix)
    symbol = load_symbol(files.symbol, error_type)
    return (symbol, *load_params(files.params(epoch), error_type))
