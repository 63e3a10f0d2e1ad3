"""The base of every error this project raises on purpose.

A `PfcError` is a problem the user can act on (bad input, a configuration
that does not fit, a damaged file, a rank that failed); its message says what
and where. Commands catch this type (with OSError: a file system's own
complaint), print the message and stop. The trainer also prints MXNet's and
Horovod's errors as one line (stops.stop_on_error); any other exception is a
defect of ours and is reported with its traceback.
The subclasses keep a builtin base (ValueError, RuntimeError ...) as well, so
code that caught those before keeps working.
"""


class PfcError(Exception):
    """A problem with the run's input, files or peers, explained in the message."""


class CheckpointError(PfcError, ValueError):
    """A checkpoint that is missing, incomplete, or does not fit the configured run.

    Defined here because both the checkpoint folder (checkpoint.py) and the
    memory bank's shards in it (memory_bank.py) raise it.
    """


def mxnet_reason(error: BaseException) -> str:
    """The line of an error that says what failed.

    MXNet 1.9's messages start with "Traceback (most recent call last):" and the
    C++ file, and end with "MXNetError: <what failed>": keep that last part.
    """
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    for line in reversed(lines):
        if line.startswith("MXNetError:"):
            return line[len("MXNetError:"):].strip()
    return lines[-1] if lines[0].startswith("Traceback") else lines[0]
