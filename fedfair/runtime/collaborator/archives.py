"""Model-sized arrays into .npz files a slice at a time: what the collaborator's records write, never copied whole.

``np.savez`` hands a zip member each array in copies of up to 16 MiB, and an array that is not in memory (a
model kept in a record's file, an average still to be formed) would have to be made whole first. Here a 1-D
array is written as views of its own memory, and anything that yields its values in slices as those slices.
The files are what ``np.savez`` writes (uncompressed members), so ``np.load`` reads them as before.
"""

from __future__ import annotations

import threading
import zipfile
from collections.abc import Iterator, Mapping
from typing import IO, Any, Protocol

import numpy as np

SLICE_BYTES = 1 << 20
"""Bytes of an in-memory array handed to the file per write: a view, so what it costs is the call."""

HEADERS = threading.RLock()
"""Held while numpy parses .npy headers (:func:`read_header`, ``np.load``'s members). numpy reads a header with
``ast.literal_eval``, and CPython 3.11 shares the AST constructor's recursion count between threads (gh-106905):
sites running as threads of one process that parse at once fail with ``SystemError: AST constructor recursion
depth mismatch``. Seen at the end of a threads-mode federation, three sites reading their records together."""


class Sliced(Protocol):
    """Values that are not held whole: how many, their type, and the values a slice at a time."""

    @property
    def dtype(self) -> np.dtype[Any]:
        """The values' type."""
        ...

    @property
    def size(self) -> int:
        """How many values."""
        ...

    def slices(self) -> Iterator[np.ndarray]:
        """The values, a slice at a time, from the first."""
        ...


def write_archive(stream: IO[bytes], arrays: Mapping[str, np.ndarray | Sliced]) -> None:
    """Write `arrays` into `stream` as ``np.savez`` would: 1-D arrays and sliced values without a whole copy."""
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, values in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                if isinstance(values, np.ndarray) and (values.ndim != 1 or not values.flags.c_contiguous):
                    np.lib.format.write_array(member, values, allow_pickle=False)  # a scalar, or a small table
                    continue
                header = {"descr": np.lib.format.dtype_to_descr(values.dtype), "fortran_order": False}
                np.lib.format.write_array_header_1_0(member, {**header, "shape": (values.size,)})
                for piece in _pieces(values):
                    member.write(piece.data)


def read_header(stream: IO[bytes]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """(shape, dtype) of the .npy member `stream` opens, leaving it at the first value; ValueError otherwise."""
    version = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    with HEADERS:
        shape, fortran_order, dtype = read(stream)
    if fortran_order or dtype.hasobject:
        raise ValueError("an array in the record is not a plain one")
    return shape, dtype


def _pieces(values: np.ndarray | Sliced) -> Iterator[np.ndarray]:
    if not isinstance(values, np.ndarray):
        return values.slices()
    step = max(1, SLICE_BYTES // max(1, values.itemsize))
    return (values[start : start + step] for start in range(0, values.size, step))
