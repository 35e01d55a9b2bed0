"""The model chain's anchor, kept beside the config so that it outlives the process: ``NAME.FEDERATION.chain.npz``.

A site checks each model it is sent against the server states it computed itself from the sums it verified
(:mod:`fedfair.runtime.collaborator.chain`). Held in memory only, a restart would leave it with nothing to check
the next model against. So once it verified a training round's sum it keeps, in one file written atomically
(temporary file, fsync, rename: :func:`fedfair.core.files.atomic_write`) before its verdict leaves, the
:class:`Anchor`: the state whose model round r was sent, and the state the plan's server step makes of round r's
verified sum (or why it makes none). A restarted process takes the chain up from it. States are written and read
a span at a time: a large one (:mod:`fedfair.runtime.state_files`) is never held whole; an average that is still
theta's copy is written once, as theta (:data:`VERSIONS`).

Why: docs/security.md, "Verified aggregation".
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedfair.core.files import atomic_write
from fedfair.core.server import ServerState
from fedfair.runtime.collaborator.archives import HEADERS, Sliced, read_header, write_archive
from fedfair.runtime.state_files import InFile, InMemory, HeldState, held_in_file

CHAIN_SUFFIX = "chain.npz"
"""The anchor is kept as NAME.FEDERATION.chain.npz beside the config."""

FORMAT = "fedfair-chain"
VERSION = 2
VERSIONS = (1, 2)
"""Version 2 leaves out the theta_average of a state that averages nothing yet (``averaged_rounds`` 0: it is theta's
copy, :func:`fedfair.core.server.server_apply`), which halves what a round writes and syncs; 1 always wrote it."""

_SCALARS = ("round", "c", "c_average", "averaged_rounds")
"""A state's scalars (:class:`~fedfair.runtime.state_files.HeldState`), kept as one-value arrays."""

_WITH_C = frozenset({"control", "velocity"})
"""The tensors of d + 1 values (theta's coordinates, then c's)."""

_READ = 1 << 18
"""Values read from the file at a time into a state kept in a file (2 MiB of float64)."""


@dataclass(frozen=True)
class Anchor:
    """What a site verified last: round `round`'s state, and, once it verified that round's sum, what it makes.

    `next` is the plan's server step applied to the verified sum; None when the site did not verify the sum
    (`verified` False) or when the sum makes no step, `void` then saying why (the round is void).
    """

    round: int
    state: HeldState
    verified: bool = False
    next: HeldState | None = None
    void: str = ""


@dataclass(frozen=True)
class _Tensor:
    """One tensor of a kept state, a span at a time (the :class:`~.archives.Sliced` protocol)."""

    state: HeldState
    field: str
    dtype = np.dtype(np.float64)

    @property
    def size(self) -> int:
        return self.state.dimension + (1 if self.field in _WITH_C else 0)

    def slices(self) -> Iterator[np.ndarray]:
        for start, stop in self.state.spans(self.size):
            yield self.state.values(self.field, start, stop)


def write_anchor(path: Path, anchor: Anchor) -> None:
    """Keep `anchor` at `path`, atomically (OSError, naming the path, on a full disk: the old file stays)."""
    arrays: dict[str, np.ndarray | Sliced] = {
        "format": np.array(FORMAT),
        "version": np.array(VERSION, dtype=np.int64),
        "round": np.array(anchor.round, dtype=np.int64),
        "verified": np.array(anchor.verified),
        "void": np.array(anchor.void),
    }
    for prefix, state in (("state", anchor.state), ("next", anchor.next)):
        if state is None:
            continue
        arrays[f"{prefix}.fields"] = np.array(list(state.fields))
        for name in _SCALARS:
            arrays[f"{prefix}.{name}"] = np.array(getattr(state, name))
        for field in state.fields:
            if not (field == _AVERAGE and _average_is_theta(state.averaged_rounds)):
                arrays[f"{prefix}.{field}"] = _Tensor(state, field)
    atomic_write(path, lambda stream: write_archive(stream, arrays))


def read_anchor(path: Path, folder: Path | None) -> Anchor:
    """The anchor kept at `path`; a large state is read into a file in `folder` a span at a time.

    Raises:
        ValueError: the file is not an anchor of this version, or a state in it is not whole.
        OSError: it cannot be read.
    """
    try:
        with HEADERS, np.load(path, allow_pickle=False) as arrays:
            if str(arrays["format"]) != FORMAT or int(arrays["version"]) not in VERSIONS:
                raise ValueError(f"not a {FORMAT} file of version {' or '.join(map(str, VERSIONS))}")
            scalars = {name: arrays[name] for name in arrays.files if not _is_tensor(name)}
        round_number, verified, void = int(scalars["round"]), bool(scalars["verified"]), str(scalars["void"])
        state = _state(path, scalars, "state", folder)
        after = _state(path, scalars, "next", folder) if "next.fields" in scalars else None
    except (KeyError, zipfile.BadZipFile) as error:
        raise ValueError(f"an anchor without {error}") from None
    if round_number < 1 or (after is not None and not verified):
        raise ValueError(f"an anchor of round {round_number} that is not one a site writes")
    return Anchor(round_number, state, verified, after, void)


_AVERAGE = "theta_average"


def _average_is_theta(averaged_rounds: int) -> bool:
    """Whether a state of `averaged_rounds` averages nothing yet, so that its theta_average is theta's copy."""
    return averaged_rounds == 0


def _is_tensor(name: str) -> bool:
    prefix, _, field = name.partition(".")
    return prefix in ("state", "next") and field not in (*_SCALARS, "fields")


def _state(path: Path, scalars: dict[str, np.ndarray], prefix: str, folder: Path | None) -> HeldState:
    """The state kept under `prefix`: whole in memory, or (a large one) into a file in `folder` by span."""
    fields = [str(field) for field in scalars[f"{prefix}.fields"].tolist()]
    if "theta" not in fields or "theta_average" not in fields:
        raise ValueError(f"its {prefix} holds no theta")
    with zipfile.ZipFile(path) as archive:
        with archive.open(f"{prefix}.theta.npy") as stream:
            shape, _ = read_header(stream)
        dimension = shape[0] if len(shape) == 1 else 0
        if dimension < 1:
            raise ValueError(f"its {prefix} theta is not a model's")
        in_file = held_in_file(dimension, len(fields))
        tensors: dict[str, torch.Tensor] = {}
        # Written once where it is theta's copy (:func:`_average_is_theta`), read as theta's.
        stored = {field: f"{prefix}.{field}" for field in fields}
        if (
            _average_is_theta(int(scalars[f"{prefix}.averaged_rounds"]))
            and f"{prefix}.{_AVERAGE}.npy" not in archive.namelist()
        ):
            stored[_AVERAGE] = f"{prefix}.theta"
        for field in fields:
            length = dimension + (field in _WITH_C)
            # A state kept in a file is laid out by its tensors' presence alone: an empty one stands for each.
            whole = [] if in_file else list(_member(archive, stored[field], length, whole=True))
            tensors[field] = torch.from_numpy(whole[0] if whole else np.empty(0))
        state = ServerState(
            round=int(scalars[f"{prefix}.round"]),
            theta=tensors["theta"],
            c=float(scalars[f"{prefix}.c"]),
            theta_average=tensors["theta_average"],
            c_average=float(scalars[f"{prefix}.c_average"]),
            averaged_rounds=int(scalars[f"{prefix}.averaged_rounds"]),
            control=tensors.get("control"),
            velocity=tensors.get("velocity"),
            second_moment=tensors.get("second_moment"),
        )
        if not in_file:
            return InMemory(state)
        kept = InFile(dimension, state, folder)
        for field in fields:
            at = 0
            for piece in _member(archive, stored[field], dimension + (field in _WITH_C), whole=False):
                kept.put(field, at, piece)
                at += piece.size
        return kept


def _member(archive: zipfile.ZipFile, name: str, length: int, *, whole: bool) -> Iterator[np.ndarray]:
    """The float64 values of member `name` (`length` of them): at once (`whole`) or :data:`_READ` at a time."""
    with archive.open(f"{name}.npy") as stream:
        shape, dtype = read_header(stream)
        if shape != (length,) or dtype != np.float64:
            raise ValueError(f"its {name} is a {dtype} array of shape {shape}, not {length} float64 values")
        step = length if whole else _READ
        for start in range(0, length, step):
            count = min(step, length - start)
            data = stream.read(count * 8)
            if len(data) != count * 8:
                raise ValueError(f"its {name} is cut short")
            yield np.frombuffer(data, dtype=np.float64).copy()
