"""The models a collaborator was sent, followed a slice at a time: the output model it computes from them.

:class:`Trajectory` follows the training models of the rounds that count toward the output model (theta-bar,
c-bar: the suffix average of `fedfair.core.server.apply`) and says whether the output model the aggregator sends
is that average, within the rounding the averaging allows. The models live in the outcome record's file
(:mod:`fedfair.runtime.collaborator.outcome`), read back :data:`_SLICE` values at a time (:class:`Stored`) or
formed as they are read (:class:`Folded`), so a process holds none of them whole.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np

from fedfair.runtime.collaborator.archives import read_header

ROUNDING_ULPS = 4.0
"""Rounding allowed per averaged model, in ulps of the largest value averaged: one fold
a + (x - a) / k rounds three times, each by half an ulp of a value at most twice that size."""


@dataclass(frozen=True)
class Stored:
    """A model's values as the record's file holds them (member `member`), read a slice at a time."""

    path: Path
    member: str
    dtype: np.dtype[np.floating]
    size: int

    def slices(self) -> Iterator[np.ndarray]:
        """The values, :data:`_SLICE` at a time, from the first."""
        with zipfile.ZipFile(self.path) as archive, archive.open(f"{self.member}.npy") as stream:
            read_header(stream)
            for start in range(0, self.size, _SLICE):
                count = min(_SLICE, self.size - start)
                yield np.frombuffer(stream.read(count * self.dtype.itemsize), dtype=self.dtype, count=count)


@dataclass(frozen=True)
class Folded:
    """A running average with one more model folded in, formed a slice at a time as it is read.

    `theta` folded into `average` as the `count`-th model by the server's own update (:func:`_fold`); the
    first model alone when `average` is None.
    """

    average: Values | None
    theta: Values
    count: int
    dtype = np.dtype(np.float64)

    @property
    def size(self) -> int:
        """How many values: theta's."""
        return self.theta.size

    def slices(self) -> Iterator[np.ndarray]:
        """The values, :data:`_SLICE` at a time, from the first."""
        if self.average is None:
            yield from (np.asarray(piece, dtype=np.float64) for piece in slices_of(self.theta))
            return
        for average, theta in zip(slices_of(self.average), slices_of(self.theta), strict=True):
            yield _fold(average, theta, self.count)


Values = np.ndarray | Stored | Folded
"""A model's values: in memory (the download of the round being followed), in the record's file, or an
average still to be formed from those."""


def whole(values: Values) -> np.ndarray:
    """`values` as one array: a fresh one, the caller's own, unless they are an array already."""
    if isinstance(values, np.ndarray):
        return values
    array = np.empty(values.size, dtype=values.dtype)
    for start, piece in zip(range(0, values.size, _SLICE), values.slices(), strict=True):
        array[start : start + piece.size] = piece
    return array


Theta = TypeVar("Theta", bound=Values, covariant=True)


@dataclass(frozen=True)
class ServedModel(Generic[Theta]):
    """A model (theta, c) the aggregator served this collaborator for round `round`.

    `theta` is read-only, in the dtype it travelled in: the downloaded array itself (not a copy) until the
    record is saved, then only in the record's file (:class:`Stored`).
    """

    round: int
    theta: Theta
    c: float


def served_model(round_number: int, theta: np.ndarray, c: float) -> ServedModel[np.ndarray]:
    """Round `round_number`'s model as sent: `theta` (viewed, not copied) and `c`."""
    # The caller's array itself, not a copy, read-only through this view until the record's file holds it.
    kept = theta.view()
    kept.setflags(write=False)
    return ServedModel(round_number, kept, float(c))


def slices_of(values: Values) -> Iterator[np.ndarray]:
    """`values`, :data:`_SLICE` at a time: views of an array, read from the record's file, or formed."""
    if not isinstance(values, np.ndarray):
        return values.slices()
    return (values[start : start + _SLICE] for start in range(0, values.size, _SLICE))


@dataclass
class Trajectory:
    """The suffix average of the training models this site was sent, as the server forms it.

    `fedfair.core.server.apply` adds a round's start model to the average when the round applies and the
    rounds applied so far (it included) exceed `skipped`. A site sees each round's start model; a round
    applied when the next round's model differs (an aborted round leaves it as it was). So a site that was
    sent every training round's model from the first can follow the average: `last` is the latest round's
    model (whether that round applied is known at the next one), `applied` the rounds before it that did.
    `following` turns False for good once a round is missed (the site joined late, or sat one out).
    """

    skipped: int
    """The applied rounds left out of the average (the plan's `average_from_round`)."""
    following: bool = True
    last: ServedModel[Values] | None = None
    applied: int = 0
    averaged: int = 0
    average: Values | None = None
    average_c: float = 0.0
    scale: float = 0.0
    """The largest magnitude of theta's and c's values averaged: the rounding bound's unit."""
    unchanged: set[int] = field(default_factory=set)
    """Rounds whose next round was sent the same model: they did not apply (seen even when not `following`)."""

    def sent(self, model: ServedModel[Values]) -> None:
        """Follow training round `model.round`'s model (a round run again after a crash replaces its own)."""
        last = self.last
        if last is not None and model.round == last.round:
            self.last = model
            return
        consecutive = last is not None and model.round == last.round + 1
        if last is not None and consecutive and _same(last, model):
            self.unchanged.add(last.round)
        elif last is not None and consecutive and self.following:
            self.applied += 1
            if self.applied > self.skipped:
                self.average, self.average_c, self.scale = self.folded(last)
                self.averaged += 1
        if not consecutive and not (last is None and model.round == 1):
            self.following = False
        self.last = model

    def folded(self, model: ServedModel[Values]) -> tuple[Folded, float, float]:
        """(average, average_c, scale) with `model` added, by the server's own update a + (x - a) / k.

        The new average is formed as it is read (:class:`Folded`): the record writes it to its file a slice
        at a time, and no model's worth of float64 is ever held.
        """
        count = self.averaged + 1
        scale = max(self.scale, _largest_magnitude(model.theta), abs(model.c))
        if self.average is None:
            return Folded(None, model.theta, count), model.c, scale
        return Folded(self.average, model.theta, count), self.average_c + (model.c - self.average_c) / count, scale

    def mismatch(self, output: ServedModel[Values]) -> str | None:
        """Why `output` is not the average this site can compute, or None: it is, or the site cannot tell.

        Whether the final round applied is not known here, so both outcomes are candidates: applied, its
        start model enters the average (if the rounds applied then exceed `skipped`; else the output is
        the model after its step, which no site is sent, and nothing can be told); aborted, the average
        stands as it is (or, before any model entered it, the output is the final round's model itself).
        """
        last = self.last
        if not self.following or last is None or last.round != output.round:
            return None
        # Each candidate is (average to fold the last model into or None, the model or None, its c, scale, folds);
        # its theta is formed a slice at a time as it is compared, never held whole beside the output.
        candidates: list[tuple[Values | None, Values | None, float, float, int]] = []
        if self.applied + 1 > self.skipped:
            count = self.averaged + 1
            scale = max(self.scale, _largest_magnitude(last.theta), abs(last.c))
            average_c = last.c if self.average is None else self.average_c + (last.c - self.average_c) / count
            candidates.append((self.average, last.theta, average_c, scale, count))
        if self.applied > self.skipped and self.average is not None:
            candidates.append((self.average, None, self.average_c, self.scale, self.averaged))
        elif self.applied <= self.skipped:
            candidates.append((None, last.theta, last.c, _largest_magnitude(last.theta), 0))
        # Models travel in float32 (contract.model_download): this site averages float32(theta_t) where the server
        # averages theta_t, and compares with float32(theta-bar); each cast moves a value by at most half an ulp.
        travelled = _cast_rounding(last.theta.dtype) + _cast_rounding(output.theta.dtype)
        gaps = []
        for average, theta, c, scale, folds in candidates:
            reference = theta if theta is not None else average
            assert reference is not None  # every candidate holds the model, the average or both
            if reference.size != output.theta.size:
                return f"model: the output model has {output.theta.size} values, the training rounds' {reference.size}"
            bound = (ROUNDING_ULPS * _FLOAT64_EPS * folds + travelled) * scale
            gap = max(_largest_gap(output.theta, average, theta, folds), abs(output.c - c))
            if gap <= bound:
                return None
            gaps.append((gap, bound, folds))
        if self.applied + 1 <= self.skipped:
            return None  # the final round may have applied: the output is then a model no site was sent
        gap, bound, folds = min(gaps)
        return (
            f"model: the output model this collaborator was sent to evaluate in round {output.round} is not the "
            f"average of the models it was sent for the {folds} training rounds the plan averages: it differs by "
            f"{gap:.3g} (rounding allows {bound:.3g})"
        )


_FLOAT64_EPS = float(np.finfo(np.float64).eps)
"""The unit of the fold's rounding: this site and the server both average in float64."""


def _cast_rounding(dtype: np.dtype[np.floating]) -> float:
    """How far a model that travelled in `dtype` may sit from the server's float64 one, in units of the scale.

    A whole ulp, not half: the scale itself is read from the cast values, which may be half an ulp short.
    """
    return 0.0 if dtype == np.float64 else float(np.finfo(dtype).eps)


_SLICE = 1 << 20
"""Coordinates the fold and the comparison take at a time (8 MiB in float64): their temporaries cost that."""


def _fold(average: np.ndarray, theta: np.ndarray, count: int) -> np.ndarray:
    """A slice of the server's running average a + (x - a) / k, k = `count`, x = `theta`, from those slices."""
    folded: np.ndarray = average + (theta - average) / count
    return folded


def _largest_magnitude(theta: Values) -> float:
    """The largest |value| of `theta` (0 for none), a slice at a time."""
    return max((float(np.abs(piece).max()) for piece in slices_of(theta)), default=0.0)


def _largest_gap(output: Values, average: Values | None, theta: Values | None, count: int) -> float:
    """The largest |output - candidate|, formed a slice at a time in float64.

    The candidate is `theta` folded into `average` (:class:`Folded`), or `average` alone when `theta` is None.
    """
    candidate = average if theta is None else Folded(average, theta, count)
    assert candidate is not None  # every candidate holds the model, the average or both
    pieces = zip(slices_of(output), slices_of(candidate), strict=True)
    return max((float(np.abs(piece - formed).max()) for piece, formed in pieces), default=0.0)


def _same(one: ServedModel[Values], other: ServedModel[Values]) -> bool:
    if one.c != other.c or one.theta.size != other.theta.size:
        return False
    return all(np.array_equal(a, b) for a, b in zip(slices_of(one.theta), slices_of(other.theta), strict=True))
