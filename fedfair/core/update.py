"""What a collaborator contributes to a round, and the bound a federation of agreed weights puts on it.

The server needs only sums over collaborators of w * delta, w * delta_c and w (and of
w * sigma_k+ with drift correction), which is exactly what secure aggregation reveals;
`Update.weighted_vector` is the one vector a collaborator submits for them; a site that encodes it reads
it a piece at a time (:class:`WeightedVector`) and never forms it whole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

_NORM_SLICE = 1 << 20
"""Coordinates :func:`bounded` widens to float64 at a time (8 MiB) to sum their squares: the slices fix the
summation's order, so the norm, and every result that clips, stays the same bit for bit."""

_WIDEN_SLICE = 1 << 16
"""Coordinates :meth:`Update.weighted_pieces` widens and scales at a time by default (512 KiB of float64): each
value is formed alone, so the slice sets only the temporaries, which stay small beside a model of 10^7 or more."""


def weighted(
    values: torch.Tensor, weight: float, dtype: torch.dtype, span: int = _WIDEN_SLICE
) -> Iterator[torch.Tensor]:
    """`values`, flattened, times `weight`: each product formed in float64 and rounded once to `dtype`, in order.

    At most `span` values a piece, each piece a fresh tensor (never a view of `values`).
    """
    flat = values.detach().reshape(-1)
    for offset in range(0, flat.numel(), span):
        # Not in place: a float64 tensor's slice would be the caller's own.
        yield (flat[offset : offset + span].to("cpu", torch.float64) * weight).to(dtype)


def update_dimension(parameters: int, corrects_drift: bool) -> int:
    """The length of a training round's summed vector for a model of `parameters` numbers.

    D + 1 ([w * delta, w * delta_c]), or 2 (d + 1) with drift correction, whose control variates w * sigma_k+
    ride in the same vector (:meth:`Update.weighted_vector`).
    """
    return 2 * (parameters + 1) if corrects_drift else parameters + 1


@dataclass(frozen=True)
class Update:
    """What a collaborator contributes: its change of (theta, c) and its weight w_k = b_k.

    The server needs only w * delta, w * delta_c and w summed over collaborators,
    which is exactly what secure aggregation reveals. With drift correction,
    `control` is the collaborator's new control variate sigma_k+ ([theta's coordinates,
    c] in step units, float64), whose weighted sum is one more secure sum; it is None
    without.
    """

    delta: torch.Tensor
    delta_c: float
    weight: float
    control: torch.Tensor | None = None

    def _parts(self) -> list[torch.Tensor]:
        """What :meth:`weighted_vector` weights, in its order: delta, [delta_c], then the control variate."""
        parts = [self.delta.detach().reshape(-1), torch.tensor([self.delta_c], dtype=torch.float64)]
        if self.control is not None:
            parts.append(self.control.detach().reshape(-1))
        return parts

    @property
    def weighted_size(self) -> int:
        """The length of :meth:`weighted_vector`: d + 1, or 2 (d + 1) with drift correction."""
        return sum(part.numel() for part in self._parts())

    def weighted_pieces(self, dtype: torch.dtype = torch.float64, span: int = _WIDEN_SLICE) -> Iterator[torch.Tensor]:
        """The values of :meth:`weighted_vector` in its order, at most `span` a piece, none across two parts.

        The same bits as the whole vector, which is never formed: a site encodes its update from these.
        """
        for part in self._parts():
            yield from weighted(part, self.weight, dtype, span)

    def weighted_vector(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The vector a collaborator submits: [w * delta, w * delta_c], then w * control with drift correction.

        2 (d + 1) numbers with drift correction, still only summed. Each value is the float64 product,
        rounded once to `dtype`: a float32 model's update that travels in float32 (a runtime upload, whose
        encoding widens it back exactly) need not be held at twice its size.
        """
        # Filled a piece at a time: converting, concatenating and scaling apart would hold three vectors at once.
        vector = torch.empty(self.weighted_size, dtype=dtype)
        start = 0
        for piece in self.weighted_pieces(dtype):
            vector[start : start + piece.numel()] = piece
            start += piece.numel()
        return vector

    def weighted_finite(self, dtype: torch.dtype = torch.float64) -> bool:
        """Whether every value of :meth:`weighted_vector` (`dtype`) is finite, read from the parts without forming it.

        Rounding x to dtype(x * w) is monotone in x, so the vector's extremes are those of the parts' extremes,
        weighted; a NaN or an infinity anywhere reaches them (a NaN through the extremes, 0 * inf as NaN).
        """
        if not math.isfinite(self.weight):
            return False
        for part in self._parts():
            if part.numel() == 0:
                continue
            least, most = torch.aminmax(part)  # a reduction: no temporary of the part's size
            ends = torch.tensor([float(least), float(most)], dtype=torch.float64) * self.weight
            if not bool(torch.isfinite(ends.to(dtype)).all()):
                return False
        return True


@dataclass(frozen=True)
class WeightedVector:
    """`update.weighted_vector(dtype)`, not formed: what a site encodes a piece at a time.

    Its pieces (:meth:`pieces`) are the vector's bits in order; ``numpy.asarray`` forms it whole, for a plain
    upload, which sends it so.
    """

    update: Update
    dtype: torch.dtype

    @property
    def size(self) -> int:
        """The vector's length (:attr:`Update.weighted_size`)."""
        return self.update.weighted_size

    def pieces(self, span: int) -> Iterator[np.ndarray]:
        """The vector's values in order, at most `span` a piece (:meth:`Update.weighted_pieces`)."""
        for piece in self.update.weighted_pieces(self.dtype, span):
            yield piece.numpy()

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        vector = self.update.weighted_vector(self.dtype).numpy()
        return vector if dtype is None else vector.astype(dtype, copy=False)


def bounded(update: Update, weight: float, norm: float) -> Update:
    """`update` as a federation with agreed weights submits it.

    With the agreed `weight` in place of the batch size, and (delta, delta_c) scaled into the L2 ball of radius
    `norm`, so that this collaborator moves the weighted mean by at most weight * norm / total weight.

    An update already inside the ball is returned with its tensors untouched (bit for bit). The
    drift-correction control variate is a separate sum, bounded coordinate by coordinate by the
    encoding's clip, and is left as it is. A non-finite update is returned unscaled: the caller
    refuses it.
    """
    delta = update.delta.detach()
    # In float64, a slice at a time: the whole vector widened and squared would be two more copies of it.
    flat = delta.reshape(-1)
    squares = [
        float(flat[start : start + _NORM_SLICE].to(torch.float64).square().sum())
        for start in range(0, flat.numel(), _NORM_SLICE)
    ]
    length = math.sqrt(math.fsum(squares) + update.delta_c**2)
    if not math.isfinite(length) or length <= norm:
        return dataclasses.replace(update, weight=weight)
    scale = norm / length
    return dataclasses.replace(update, delta=delta * scale, delta_c=update.delta_c * scale, weight=weight)
