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
        delta_c = torch.tensor([self.delta_c], dtype=torch.float64)
        parts = [self.delta.detach().to("cpu", torch.float64), delta_c]
        if self.control is not None:
            parts.append(self.control.detach().to("cpu", torch.float64))
        return torch.cat(parts) * self.weight


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
    length = math.sqrt(float(delta.to(torch.float64).square().sum()) + update.delta_c**2)
    if not math.isfinite(length) or length <= norm:
        return dataclasses.replace(update, weight=weight)
    scale = norm / length
    return dataclasses.replace(update, delta=delta * scale, delta_c=update.delta_c * scale, weight=weight)
