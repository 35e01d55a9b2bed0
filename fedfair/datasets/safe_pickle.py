"""Reading the two pickled data files (MNIST, RAND HIE) without running code from them.

A pickle can name any importable callable and have it called while loading, so
unpickling a file from a third-party package is arbitrary code execution unless
the loader restricts what the file may name. These unpicklers admit only the
numpy functions that rebuild plain arrays. The RAND HIE file is a pickled pandas
DataFrame; rather than letting it call into pandas, its pandas names resolve to
inert stand-ins that only record their arguments, and the columns are read off
those records.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np
from numpy._core import multiarray as _multiarray
from numpy._core import numeric as _numeric

# numpy's private array rebuilder for pickles, which numpy's type stubs leave out.
_FROMBUFFER: Any = _numeric._frombuffer  # type: ignore[attr-defined]

# What rebuilding an ndarray needs, under its numpy 1.x and 2.x module names.
_NUMPY_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _multiarray._reconstruct,
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class NumpyUnpickler(pickle.Unpickler):
    """An unpickler that can rebuild numpy arrays, tuples, lists, dicts and scalars, and nothing else."""

    def allowed_globals(self) -> dict[tuple[str, str], Any]:
        """(module, name) -> the object a pickle may refer to under that name; nothing else is found."""
        return _NUMPY_GLOBALS

    def find_class(self, module: str, name: str) -> Any:
        """The allowed object for ``module.name``; never an import.

        Raises:
            pickle.UnpicklingError: the name is not in :meth:`allowed_globals`.
        """
        try:
            return self.allowed_globals()[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refused global {module}.{name}: this data file may only rebuild numpy arrays and tables of them"
            ) from None


def load_numpy_pickle(data: bytes) -> Any:
    """Unpickle ``data`` allowing only numpy arrays and builtin containers.

    ``latin1`` reads Python 2 pickles (MNIST's), whose array buffers are byte strings.
    """
    return NumpyUnpickler(io.BytesIO(data), encoding="latin1").load()


class _Recorded:
    """Stand-in for a pandas class: keeps constructor arguments and pickled state, runs nothing."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _DataFrame(_Recorded):
    pass


class _BlockManager(_Recorded):
    pass


class _Index(_Recorded):
    pass


class _RangeIndex(_Recorded):
    pass


def _unpickle_block(values: np.ndarray, placement: np.ndarray, ndim: int) -> tuple[np.ndarray, np.ndarray]:
    """Stand-in for pandas' block rebuild: a 2-D block is (columns x rows) values and their column positions."""
    return values, placement


def _new_index(cls: type, fields: dict[str, Any]) -> np.ndarray:
    """Stand-in for pandas' index rebuild: the index's labels as an array."""
    if cls is _RangeIndex:
        return np.arange(fields["start"], fields["stop"], fields["step"])
    return np.asarray(fields["data"])


_DATAFRAME_GLOBALS: dict[tuple[str, str], Any] = {
    **_NUMPY_GLOBALS,
    ("pandas.core.frame", "DataFrame"): _DataFrame,
    ("pandas.core.internals.managers", "BlockManager"): _BlockManager,
    ("pandas._libs.internals", "_unpickle_block"): _unpickle_block,
    ("pandas.core.indexes.base", "_new_Index"): _new_index,
    ("pandas.core.indexes.base", "Index"): _Index,
    ("pandas.core.indexes.range", "RangeIndex"): _RangeIndex,
}


class DataFrameUnpickler(NumpyUnpickler):
    """Reads a pickled pandas 2.x DataFrame of plain numpy columns into inert records."""

    def allowed_globals(self) -> dict[tuple[str, str], Any]:
        """The numpy names, plus inert stand-ins for the pandas classes a pickled DataFrame refers to."""
        return _DATAFRAME_GLOBALS


def load_dataframe_pickle(data: bytes) -> dict[str, np.ndarray]:
    """The columns of a pickled pandas DataFrame, in order, as numpy arrays.

    Supports the layout pandas 2.x writes (a BlockManager of 2-D blocks).

    Raises:
        pickle.UnpicklingError: any other layout, or a global outside the allowed ones; nothing is guessed.
    """
    frame = DataFrameUnpickler(io.BytesIO(data)).load()
    try:
        manager = frame.state["_mgr"]
        blocks, (column_names, row_index) = manager.args
        columns: dict[str, np.ndarray] = {}
        for values, placement in blocks:
            for row, position in zip(values, placement, strict=True):
                columns[str(column_names[position])] = row
        ordered = {str(name): columns[str(name)] for name in column_names}
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise pickle.UnpicklingError(f"not a pandas 2.x DataFrame pickle of numpy columns ({error})") from None
    if any(len(column) != len(row_index) for column in ordered.values()):
        raise pickle.UnpicklingError("DataFrame pickle has columns of different lengths")
    return ordered
