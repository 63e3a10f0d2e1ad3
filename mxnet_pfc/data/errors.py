"""The data layer's error, without MXNet (records.py, the iterators and set_rows.py raise it)."""
from mxnet_pfc.runtime.errors import PfcError


class DataError(PfcError, ValueError):
    """A data set that cannot be read as described: names the file and the problem."""
