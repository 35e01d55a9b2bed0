"""What a collaborator contributes to a round, and the bound a federation of agreed weights puts on it.

The server needs only sums over collaborators of w * delta, w * delta_c and w (and of
w * sigma_k+ with drift correction), which is exactly what secure aggregation reveals;
`Update.weighted_vector` is the one vector a collaborator submits for them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

_NORM_SLICE = 1 << 20
"""Coordinates :func:`bounded` widens to float64 at a time (8 MiB) to sum their squares: the slices fix the
summation's order, so the norm, and every result that clips, stays the same bit for bit."""

_WIDEN_SLICE = 1 << 16
"""Coordinates :meth:`Update.weighted_vector` widens and scales at a time (512 KiB of float64): each value is
formed alone, so the slice sets only the temporaries, which stay small beside a model of 10^7 or more."""


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

    def weighted_vector(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """The vector a collaborator submits: [w * delta, w * delta_c], then w * control with drift correction.

        2 (d + 1) numbers with drift correction, still only summed. Each value is the float64 product,
        rounded once to `dtype`: a float32 model's update that travels in float32 (a runtime upload, whose
        encoding widens it back exactly) need not be held at twice its size.
        """
        # One vector, filled and scaled a slice at a time in float64: converting, concatenating and scaling
        # apart would hold three vectors of the model's size at once.
        parts = [self.delta.detach().reshape(-1), torch.tensor([self.delta_c], dtype=torch.float64)]
        if self.control is not None:
            parts.append(self.control.detach().reshape(-1))
        vector = torch.empty(sum(part.numel() for part in parts), dtype=dtype)
        start = 0
        for part in parts:
            for offset in range(0, part.numel(), _WIDEN_SLICE):
                # Not in place: a float64 part's slice would be the caller's own tensor.
                piece = part[offset : offset + _WIDEN_SLICE].to("cpu", torch.float64) * self.weight
                vector[start + offset : start + offset + piece.numel()] = piece
            start += part.numel()
        return vector


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
