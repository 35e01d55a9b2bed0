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
"""Coordinates :func:`bounded` widens to float64 at a time (8 MiB): the norm of a model of any size costs that."""


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

    def weighted_vector(self) -> torch.Tensor:
        """The vector a collaborator submits, in float64.

        [w * delta, w * delta_c], followed by w * control when drift correction is on (then 2 (d + 1) numbers,
        still only summed).
        """
        # One float64 vector, filled part by part and scaled in place: converting, concatenating and scaling
        # apart would hold three vectors of the model's size at once.
        delta = self.delta.detach().reshape(-1)
        control = None if self.control is None else self.control.detach().reshape(-1)
        size = delta.numel() + 1 + (0 if control is None else control.numel())
        vector = torch.empty(size, dtype=torch.float64)
        vector[: delta.numel()] = delta.to("cpu")
        vector[delta.numel()] = self.delta_c
        if control is not None:
            vector[delta.numel() + 1 :] = control.to("cpu")
        return vector.mul_(self.weight)


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
