"""The base of every error this project raises on purpose.

A `PfcError` is a problem the user can act on (bad input, a configuration
that does not fit, a damaged file, a rank that failed); its message says what
and where. Commands catch this type (with OSError: a file system's own
complaint), print the message and stop (exit_status). The trainer also prints
MXNet's and Horovod's errors as one line (stops.stop_on_error); any other
exception is a defect of ours and is reported with its traceback.
MXNet's own file errors name no file and start with a C++ stack: models and
arrays are read through load_checkpoint / load_params / load_arrays here, whose
errors name the file and keep MXNet's reason (mxnet_reason).
The subclasses keep a builtin base (ValueError, RuntimeError ...) as well, so
code that caught those before keeps working. MXNet is imported by the loaders
only, so a module that needs no MXNet (data.faces, plan) does not load it
through this one.
"""
import re
import sys


class PfcError(Exception):
    """A problem with the run's input, files or peers, explained in the message."""


class CheckpointError(PfcError, ValueError):
    """A checkpoint that is missing, incomplete, or does not fit the configured run.

    Defined here because both the checkpoint folder (checkpoint.py) and the
    memory bank's shards in it (memory_bank.py) raise it.
    """


class ConfigError(PfcError, ValueError):
    """A configuration value that is unknown or out of range; the message names the field.

    Here rather than in training/config.py because the runtime (device.py) refuses settings too.
    """


def exit_status(prefix: str, command, *args) -> int:
    """command(*args)'s exit status (None: 0); a PfcError or OSError it raises is printed to stderr as
    "PREFIX: message" and the status is 1. PREFIX is the command's name (`mxnet_pfc.embed`), or what it
    could not do. The one place the commands turn these errors into a message.
    """
    try:
        return command(*args) or 0
    except (PfcError, OSError) as error:
        print(f"{prefix}: {error}", file=sys.stderr)
        return 1


def mxnet_reason(error: BaseException) -> str:
    """The line of an MXNet error that says what failed, without MXNet's time and C++ source.

    MXNet 1.9's messages start with "Traceback (most recent call last):" and the
    C++ file, and end with "MXNetError: <what failed>" (sometimes
    "[HH:MM:SS] src/file.cc:73: <what failed>" inside it): keep what failed. A
    message holding bytes that are not UTF-8 (a garbage JSON file's, quoted by
    its parser) reaches Python as a UnicodeDecodeError in MXNet's own error
    handling: the message is read again, those bytes replaced.
    """
    import mxnet as mx

    text = str(error)
    if isinstance(error, UnicodeDecodeError):
        text = mx.base._LIB.MXGetLastError().decode("utf-8", "replace") or text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    reason = next((line for line in reversed(lines) if line.startswith("MXNetError:")), None)
    if reason is None:
        reason = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    reason = reason[len("MXNetError:"):] if reason.startswith("MXNetError:") else reason
    return re.sub(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", reason).strip()


def load_arrays(file: str, error_type=PfcError):
    """mx.nd.load(file), a failure raised as error_type naming the file and what MXNet found wrong."""
    import mxnet as mx

    try:
        return mx.nd.load(file)
    except (mx.base.MXNetError, UnicodeDecodeError) as error:
        raise error_type(f"{file}: cannot load: {mxnet_reason(error)}") from None


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
    mx.model.load_checkpoint reads them; a failure is error_type naming the file."""
    import mxnet as mx

    from mxnet_pfc.runtime.run_folder import ModelFiles

    files = ModelFiles(prefix)
    file = files.symbol
    try:
        symbol = mx.sym.load(file)
    except (mx.base.MXNetError, UnicodeDecodeError) as error:
        raise error_type(f"{file}: cannot load: {mxnet_reason(error)}") from None
    return (symbol, *load_params(files.params(epoch), error_type))
