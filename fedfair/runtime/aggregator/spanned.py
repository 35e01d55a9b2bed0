"""torch's checkpoint format for a server state kept in a file: written and read a span at a time.

torch.save writes each tensor's storage whole from memory and torch.load reads it whole into memory. A state in
a file (:mod:`fedfair.runtime.state_files`) is streamed instead: the same zip (a pickle, one stored record per
tensor), which torch.load reads as its own, written from the state's spans; and read back record by record into
a new state file. The pickle is read by an unpickler that resolves only what these files hold: a tensor's
rebuild, its float64 storage and an ordered dict (anything else is refused, as torch's weights_only is).
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from fedfair.core.server import ServerState
from fedfair.runtime.state_files import InFile, HeldState

_ARCHIVE = "archive"
"""The folder torch.save names inside the zip when it writes to a stream."""


@dataclass(frozen=True)
class Spanned:
    """The float64 tensor `field` of `state` (theta, theta_average, control, velocity), to be written by span."""

    state: HeldState
    field: str

    @property
    def length(self) -> int:
        """Its number of values: theta's coordinates, and c's entry too for a control variate or a velocity."""
        return self.state.dimension + (1 if self.field in ("control", "velocity") else 0)


@dataclass(frozen=True)
class Stored:
    """A tensor as a checkpoint's pickle names it: the zip record `key` of `length` float64 values."""

    key: str
    length: int


def write_spanned(stream: IO[bytes], payload: Mapping[str, Any]) -> None:
    """Write `payload`, its tensors given as :class:`Spanned`, to `stream` as torch.save would write them.

    The stream is written front to back (a writer without seek gets data descriptors, as zip allows).
    """
    records: list[Spanned] = []

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if isinstance(obj, Stored):
                return ("storage", torch.DoubleStorage, obj.key, "cpu", obj.length)
            return None

        def reducer_override(self, obj: Any) -> Any:
            if not isinstance(obj, Spanned):
                return NotImplemented
            records.append(obj)
            stored = Stored(str(len(records) - 1), obj.length)
            return (torch._utils._rebuild_tensor_v2, (stored, 0, (obj.length,), (1,), False, collections.OrderedDict()))

    pickled = io.BytesIO()
    Pickler(pickled, protocol=2).dump(payload)  # torch.save's protocol
    with zipfile.ZipFile(stream, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        archive.writestr(f"{_ARCHIVE}/data.pkl", pickled.getvalue())
        archive.writestr(f"{_ARCHIVE}/byteorder", "little")
        for key, record in enumerate(records):
            with archive.open(f"{_ARCHIVE}/data/{key}", "w", force_zip64=True) as entry:
                for start, stop in record.state.spans(record.length):
                    values = np.ascontiguousarray(record.state.values(record.field, start, stop), dtype="<f8")
                    entry.write(values.data.cast("B"))
        archive.writestr(f"{_ARCHIVE}/version", "3\n")


class _Unpickler(pickle.Unpickler):
    """A checkpoint's pickle with its tensors as :class:`Stored`: nothing but these three names resolves."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _stored
        if (module, name) == ("torch", "DoubleStorage"):
            return torch.DoubleStorage
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"a checkpoint holds no {module}.{name}; it was not written by fedfair")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and pid[1] is torch.DoubleStorage):
            raise pickle.UnpicklingError("a checkpoint's tensors are float64 storages; this one is not")
        return Stored(str(pid[2]), int(pid[4]))


def _stored(storage: Stored, offset: int, size: Any, stride: Any, *_: Any) -> Stored:
    """A tensor's rebuild: a whole storage of one dimension, as fedfair's checkpoints hold each tensor."""
    if offset != 0 or tuple(size) != (storage.length,) or tuple(stride) != (1,):
        raise pickle.UnpicklingError("a checkpoint's tensor is not a whole storage of one dimension")
    return storage


def read_spanned(file: IO[bytes]) -> tuple[Any, zipfile.ZipFile, str]:
    """The payload of the checkpoint zip in `file` (bytes before it allowed), tensors as :class:`Stored`.

    With the open archive and the folder its records lie in, for :func:`state_in_file`.
    """
    archive = zipfile.ZipFile(file)
    names = archive.namelist()
    if not names:
        raise ValueError("an empty zip is no checkpoint")
    folder = names[0].split("/", 1)[0]
    return _Unpickler(io.BytesIO(archive.read(f"{folder}/data.pkl"))).load(), archive, folder


def state_in_file(
    outline: ServerState, raw: Mapping[str, Any], archive: zipfile.ZipFile, records: str, folder: Path
) -> InFile:
    """The state of a checkpoint's ``state`` entry `raw`, its tensors read by span into a file in `folder`.

    `outline` is that state's scalars, checked, and which tensors it holds (their values unused).
    """
    theta = raw["theta"]
    if not isinstance(theta, Stored):
        raise ValueError("field state.theta must be a tensor")
    state = InFile(theta.length, outline, folder)
    for field in state.fields:
        stored = raw[field]
        length = theta.length + (field in ("control", "velocity"))
        if not isinstance(stored, Stored) or stored.length != length:
            raise ValueError(f"field state.{field} must be a tensor of {length} values")
        with archive.open(f"{records}/data/{stored.key}") as entry:
            for start, stop in state.spans(length):
                data = entry.read(8 * (stop - start))
                if len(data) != 8 * (stop - start):
                    raise ValueError(f"field state.{field}'s record is cut short")
                state.put(field, start, np.frombuffer(data, dtype="<f8"))
    return state
