"""Where a server state is kept: in memory, or (64 MiB and more) in a file read by piece; stepping it by piece.

The aggregator's state and a site's model chain (:mod:`fedfair.runtime.collaborator.chain`) are kept alike.
A piece is the state restricted to theta's coordinates [start, stop): theta, its average and the second moment
sliced; the control variate and the velocity ([theta's coordinates, c] each) sliced with their c entry kept.
The server step (:func:`fedfair.core.server.apply`) is elementwise in theta's coordinates and reads the c
entries and the scalars alike in every piece, so stepping a state piece by piece is, bit for bit, stepping it
whole. A state's file is unlinked as soon as it is made: it never outlives the process, and a restarted
process finds nothing it could take for a state (the aggregator resumes from its checkpoint).
"""

from __future__ import annotations

import errno
import os
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from fedfair.core.algorithm import FedSRCVaR
from fedfair.core.server import Aggregate, ServerState

IN_FILE_FROM = 64 << 20
"""Bytes of tensors from which a state is kept in a file: 2.8 million parameters under server momentum. A
smaller state stays in memory and is stepped whole, as the aggregator steps it."""

PIECE = 1 << 18
"""Theta's coordinates a state in a file is read, stepped and written at a time: 2 MiB of float64 a tensor,
a few of them a site, where 2^20 (8 MiB) held 100 MB among three sites verifying at once."""

ServerStep = Callable[[ServerState, Aggregate, bool], ServerState]
"""The plan's server step with its settings bound: (state, aggregate, consume) to the next state."""

_FIELDS = ("theta", "theta_average", "control", "velocity", "second_moment")
"""A server state's tensors, in the order a file holds them."""

_WITH_C = frozenset({"control", "velocity"})
"""The tensors of d + 1 values, theta's coordinates then c's: every piece of them keeps the last."""

_ITEM = np.dtype(np.float64).itemsize


def held_in_file(dimension: int, tensors: int) -> bool:
    """Whether a state of `tensors` float64 tensors of a model of `dimension` parameters is kept in a file."""
    return large(_ITEM * dimension * tensors)


def large(size: int) -> bool:
    """Whether `size` bytes of a state (or of a checkpoint of one) are read a span at a time."""
    return size >= IN_FILE_FROM


def tensors_of(algorithm: FedSRCVaR) -> int:
    """How many float64 tensors a server state of `algorithm` comes to hold (theta and its average, and more)."""
    return 2 + algorithm.local.corrects_drift + (algorithm.momentum > 0.0) + 2 * (algorithm.adam is not None)


def spans(length: int, in_file: bool) -> Iterator[tuple[int, int]]:
    """The [start, stop) spans a state reads `length` values by: pieces in a file, the whole in memory."""
    step = PIECE if in_file else max(length, 1)
    for start in range(0, length, step):
        yield start, min(start + step, length)


class HeldState(ABC):
    """A server state of a model of `dimension` parameters: its scalars at hand, its tensors read by span."""

    def __init__(self, dimension: int, like: ServerState, in_file: bool) -> None:
        self.dimension = dimension
        self.round, self.c, self.c_average = like.round, like.c, like.c_average
        self.averaged_rounds = like.averaged_rounds
        self.fields = tuple(field for field in _FIELDS if getattr(like, field) is not None)
        self.in_file = in_file

    def has(self, field: str) -> bool:
        """Whether the state holds the tensor `field` (a ServerState attribute: control, velocity, ...)."""
        return field in self.fields

    def spans(self, length: int | None = None) -> Iterator[tuple[int, int]]:
        """The spans this state reads `length` values by (default: theta's coordinates, its pieces)."""
        return spans(self.dimension if length is None else length, self.in_file)

    @abstractmethod
    def values(self, field: str, start: int, stop: int) -> np.ndarray:
        """Values [start, stop) of the tensor `field`, float64 (one of :meth:`spans`' spans, or within one)."""

    @abstractmethod
    def piece(self, start: int, stop: int) -> ServerState:
        """The state restricted to theta's coordinates [start, stop), one of :meth:`spans`: tensors of its own."""

    @abstractmethod
    def copy_field(self, field: str, file: int, offset: int) -> int:
        """Write the tensor `field`'s values, float64, into `file` from byte `offset` on; the bytes written.

        Raises:
            OSError: the write failed (a full disk: ENOSPC), as the system raised it.
        """


class InMemory(HeldState):
    """A state held whole: its one piece is the state itself."""

    def __init__(self, state: ServerState) -> None:
        super().__init__(state.theta.numel(), state, in_file=False)
        self.state = state

    def values(self, field: str, start: int, stop: int) -> np.ndarray:
        """A view of the tensor's values, uncopied."""
        tensor: torch.Tensor = getattr(self.state, field)
        return tensor.numpy()[start:stop]

    def piece(self, start: int, stop: int) -> ServerState:
        """The state itself, its one piece being the whole."""
        if (start, stop) != (0, self.dimension):
            raise ValueError(f"a state in memory has one piece, [0, {self.dimension}), not [{start}, {stop})")
        return self.state

    def copy_field(self, field: str, file: int, offset: int) -> int:
        """Written from the tensor's own memory: no copy in this process."""
        values = np.ascontiguousarray(getattr(self.state, field).numpy(), dtype=np.float64)
        _write(file, values, offset)
        return values.nbytes


class InFile(HeldState):
    """A state in an unnamed file in `folder` (None: the system's temporary folder), laid out by `like`'s tensors.

    Its pieces are written by :meth:`write` in any order; the file is closed when the state is let go.
    """

    def __init__(self, dimension: int, like: ServerState, folder: Path | None) -> None:
        super().__init__(dimension, like, in_file=True)
        handle, path = tempfile.mkstemp(prefix="fedfair-", suffix=".state", dir=folder)
        os.unlink(path)
        self._file, self._folder = handle, os.path.dirname(path)
        weakref.finalize(self, os.close, handle)
        self._offsets: dict[str, int] = {}
        offset = 0
        for field in self.fields:
            self._offsets[field] = offset
            offset += _ITEM * (dimension + 1 if field in _WITH_C else dimension)

    def values(self, field: str, start: int, stop: int) -> np.ndarray:
        """Read from the file into an array of their own."""
        values = np.empty(stop - start, dtype=np.float64)
        _read(self._file, values, self._offsets[field] + _ITEM * start)
        return values

    def piece(self, start: int, stop: int) -> ServerState:
        """Read from the file, each tensor into memory of its own (the step may be formed in it)."""
        tensors: dict[str, torch.Tensor | None] = dict.fromkeys(_FIELDS)
        for field in self.fields:
            if field in _WITH_C:
                values = np.empty(stop - start + 1, dtype=np.float64)
                for into, at in self._with_c(values, start, stop):
                    _read(self._file, into, self._offsets[field] + _ITEM * at)
            else:
                values = self.values(field, start, stop)
            tensors[field] = torch.from_numpy(values)
        theta, average = tensors["theta"], tensors["theta_average"]
        assert theta is not None and average is not None  # every state has both
        return ServerState(
            round=self.round,
            theta=theta,
            c=self.c,
            theta_average=average,
            c_average=self.c_average,
            averaged_rounds=self.averaged_rounds,
            control=tensors["control"],
            velocity=tensors["velocity"],
            second_moment=tensors["second_moment"],
        )

    @classmethod
    def of(cls, state: ServerState, folder: Path | None) -> InFile:
        """`state` (in memory) copied into a file in `folder`, a span at a time (:meth:`write`'s errors)."""
        kept = cls(state.theta.numel(), state, folder)
        for field in kept.fields:
            values = getattr(state, field).numpy()
            for start, stop in kept.spans(values.size):
                kept.put(field, start, values[start:stop])
        return kept

    def write(self, piece: ServerState, start: int, stop: int) -> None:
        """Keep `piece`, this state over theta's coordinates [start, stop), in the file (:meth:`put`'s errors)."""
        for field in self.fields:
            tensor: torch.Tensor = getattr(piece, field)
            values = tensor.numpy()
            if field not in _WITH_C:
                self.put(field, start, values)
                continue
            for part, at in self._with_c(values, start, stop):
                self.put(field, at, part)

    def put(self, field: str, start: int, values: np.ndarray) -> None:
        """Write `values` as the tensor `field`'s values from index `start` on.

        Raises:
            OSError: the write failed (a full disk: ENOSPC), named by the folder, the file having no name.
        """
        try:
            _write(self._file, np.ascontiguousarray(values, dtype=np.float64), self._offsets[field] + _ITEM * start)
        except OSError as error:
            raise OSError(error.errno, error.strerror, self._folder) from error

    def copy_field(self, field: str, file: int, offset: int) -> int:
        """Copied file to file by the system (``copy_file_range``): no byte passes through this process.

        Where the system cannot (another file system, an old kernel), read and written a piece at a time.
        """
        length = self.dimension + 1 if field in _WITH_C else self.dimension
        source, done, count = self._offsets[field], 0, _ITEM * length
        try:
            while done < count:
                copied = os.copy_file_range(self._file, file, count - done, source + done, offset + done)
                if copied == 0:
                    raise OSError(f"a server state's file ended {source + done} bytes in; it was cut short")
                done += copied
        except OSError as error:
            if error.errno not in (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL) or done:
                raise
            for start, stop in self.spans(length):
                _write(file, self.values(field, start, stop), offset + _ITEM * start)
        return count

    def _with_c(self, values: np.ndarray, start: int, stop: int) -> list[tuple[np.ndarray, int]]:
        """A piece's [coordinates, c] values, as the parts of them the file holds together, each with its index."""
        if stop == self.dimension:
            return [(values, start)]
        return [(values[:-1], start), (values[-1:], self.dimension)]


def keep(
    pieces: Iterable[tuple[int, int, ServerState]], dimension: int, in_file: bool, folder: Path | None
) -> HeldState:
    """The state whose pieces (start, stop, piece) are `pieces`, over :func:`spans` (dimension, `in_file`).

    In memory, the one piece (the whole state) as it is; in a file in `folder`, written as they come. An error
    raised while the pieces are made leaves nothing kept.
    """
    kept: InFile | None = None
    for start, stop, piece in pieces:
        if not in_file:
            return InMemory(piece)
        if kept is None:
            kept = InFile(dimension, piece, folder)
        kept.write(piece, start, stop)
        del piece  # the next piece is made without this one beside it
    if kept is None:
        raise ValueError("a state has at least one piece; a model has at least one parameter")
    return kept


def holding(state: ServerState | InFile) -> HeldState:
    """`state` read by span: a state in memory (a ServerState) as its one piece, a state in a file as it is."""
    return state if isinstance(state, InFile) else InMemory(state)


def stepped(
    state: HeldState,
    read: Callable[[int, int], np.ndarray],
    total_weight: float,
    server_step: ServerStep,
    *,
    give_up: bool,
    folder: Path | None,
) -> HeldState:
    """The state `server_step` makes of `state` and the decoded update sum whose values [a, b) `read(a, b)` gives.

    A state in a file is stepped a piece at a time into a new file in `folder` (each piece read is the step's
    own to form the next in); a state in memory whole, formed in its own tensors when the caller gives it up
    (`give_up`). Raises what the step raises (AggregateError: the round is void), `state` then unchanged.
    """
    dimension, with_control = state.dimension, state.has("control")
    steps = (
        (
            start,
            stop,
            server_step(
                state.piece(start, stop),
                Aggregate.from_vector(
                    torch.from_numpy(_sum_piece(read, start, stop, dimension, with_control)),
                    total_weight,
                    with_control=with_control,
                ),
                give_up or state.in_file,
            ),
        )
        for start, stop in state.spans()
    )
    return keep(steps, dimension, state.in_file, folder)


def _sum_piece(
    read: Callable[[int, int], np.ndarray], start: int, stop: int, dimension: int, with_control: bool
) -> np.ndarray:
    """The piece [start, stop) of a decoded update sum that `Aggregate.from_vector` splits as the state's piece.

    Theta's coordinates [start, stop) and the c entry ([w delta, w delta_c]); with drift correction the control
    variate's same coordinates and c entry after them. `read(a, b)` gives the decoded values [a, b); adjacent
    spans are read as one, so the whole sum (one piece in memory) is read at once, uncopied.
    """
    wanted = [(start, stop), (dimension, dimension + 1)]
    if with_control:
        half = dimension + 1
        wanted += [(half + start, half + stop), (half + dimension, half + dimension + 1)]
    merged: list[tuple[int, int]] = []
    for low, high in wanted:
        if merged and merged[-1][1] == low:
            merged[-1] = (merged[-1][0], high)
        else:
            merged.append((low, high))
    parts = [read(low, high) for low, high in merged]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _read(file: int, into: np.ndarray, offset: int) -> None:
    """Fill `into` (contiguous) from `file` at byte `offset`."""
    view = into.data.cast("B")
    done = 0
    while done < len(view):
        count = os.preadv(file, [view[done:]], offset + done)
        if count == 0:
            raise OSError(f"a server state's file ended {offset + done} bytes in; it was cut short")
        done += count


def _write(file: int, values: np.ndarray, offset: int) -> None:
    """Write `values` (contiguous) to `file` at byte `offset`."""
    view = values.data.cast("B")
    done = 0
    while done < len(view):
        done += os.pwrite(file, view[done:], offset + done)
