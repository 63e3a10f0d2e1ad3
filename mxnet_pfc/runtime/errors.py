"""The base of every error this project raises on purpose.

A `PfcError` is a problem the user can act on (bad input, a configuration
that does not fit, a damaged file, a rank that failed); its message says what
and where. Commands catch this type (with OSError: a file system's own
complaint), print the message and stop (exit_status). The trainer also prints
MXNet's and Horovod's errors as one line (stops.stop_on_error); any other
exception is a defect of ours and is reported with its traceback.
MXNet's own file errors name no file and start with a C++ stack: models and
arrays are read through runtime/mxnet_files.py, whose errors name the file and
keep MXNet's reason (mxnet_reason here). A message that
quotes a value from a file or an option quotes it through quoted() or short(),
which cut it to a few hundred characters.
The subclasses keep a builtin base (ValueError, RuntimeError ...) as well, so
code that caught those before keeps working. This module imports no MXNet, so
a module that needs none (data.faces, plan, the supervisor) does not load it
through this one.
"""
import re
import reprlib
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


def quoted(value, limit: int = 200) -> str:
    """repr(value) for a message, cut after about `limit` characters with how long the whole is: what a
    file or a user gave may be megabytes (a state.json field holding a long list), and a message quotes it
    whole only when it is short. Nested values are shown a few levels and items deep (reprlib), so that even
    quoting a huge or deeply nested value costs little."""
    if isinstance(value, (str, bytes)):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"
    text = _SHORT_REPR.repr(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)) and len(value) > _SHOWN_ITEMS:
        text += f" ({len(value):,} items)"
    return text if len(text) <= limit else f"{text[:limit]}..."


def short(value, limit: int = 200) -> str:
    """`value` for a message that shows names and paths bare: a str as it is, anything else as quoted(value);
    either cut after about `limit` characters, saying how long the whole is."""
    if isinstance(value, str):
        return value if len(value) <= limit else f"{value[:limit]}... ({len(value):,} characters)"
    return quoted(value, limit)


_SHOWN_ITEMS = 8
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel, _SHORT_REPR.maxstring, _SHORT_REPR.maxother = 3, 60, 60
for _name in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset", "maxdeque", "maxarray"):
    setattr(_SHORT_REPR, _name, _SHOWN_ITEMS)


def mxnet_reason(error: BaseException) -> str:
    """The line of an MXNet error that says what failed, without MXNet's time and C++ source.

    MXNet 1.9's messages start with "Traceback (most recent call last):" and the
    C++ file, and end with "MXNetError: <what failed>" (sometimes
    "[HH:MM:SS] src/file.cc:73: <what failed>" inside it): keep what failed. A
    message holding bytes that are not UTF-8 (a garbage JSON file's, quoted by
    its parser) reaches Python as a UnicodeDecodeError in MXNet's own error
    handling: the message is read again, those bytes replaced.
    """
    text = str(error)
    mx = sys.modules.get("mxnet")       # loaded by whoever ran MXNet; this module never loads it
    if isinstance(error, UnicodeDecodeError) and mx is not None:
        text = mx.base._LIB.MXGetLastError().decode("utf-8", "replace") or text
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    reason = next((line for line in reversed(lines) if line.startswith("MXNetError:")), None)
    if reason is None:
        reason = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    reason = reason[len("MXNetError:"):] if reason.startswith("MXNetError:") else reason
    return re.sub(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", reason).strip()
