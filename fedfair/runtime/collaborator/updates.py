"""What a collaborator's trained update is, and the bounds it must keep before it is sent.

An update is [w * delta, w * delta_c] (with drift correction, then w * sigma_k+): plain rounds clip it as the
secure encoding does, and a drift-corrected one whose control variate lies past the clip is refused, not
clipped (a clipped control variate would steer every site's next steps).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from fedfair.core.update import WeightedVector


@dataclass(frozen=True)
class TrainedUpdate:
    """The outcome of training on one round's model (digest `model`).

    `vector` is [w * delta, w * delta_c] (then w * sigma_k+ with drift correction): not formed (a
    :class:`~fedfair.core.update.WeightedVector`, which the encoding reads a piece at a time), or a whole read-only
    one; None when there is nothing to contribute (the trainer refused, or the update was not finite); `weight` is w.
    """

    round: int
    model: str
    vector: WeightedVector | np.ndarray | None
    weight: float


def clip_plain_update(vector: np.ndarray, weight: float, clip: float) -> np.ndarray:
    """[w * delta] clipped coordinate-wise to [-clip * w, clip * w].

    What the secure encoding does to it (`fedfair.secagg.encode.Encoder.encode`, the same float operations), and
    what the aggregator's plain decode check (`decode_plain`) accepts.
    """
    bound = clip * weight
    clipped: np.ndarray = np.clip(vector, -bound, bound)
    return clipped


def control_beyond_clip(vector: np.ndarray, weight: float, clip: float) -> str | None:
    """Why a drift-corrected vector [w delta, w delta_c, w sigma_k+] must not be sent, or None.

    The encoding (and the plain path's clip) bounds every weighted coordinate by clip * w. An
    update's coordinates are clipped like a gradient, but a clipped control variate would be a
    wrong one, and the server's sigma, the mean of them, would steer every collaborator's next
    steps off course, silently: so a control coordinate past the bound is refused instead.
    """
    return control_pieces_beyond_clip([vector[vector.size // 2 :]], weight, clip)


def control_pieces_beyond_clip(control: Iterable[np.ndarray], weight: float, clip: float) -> str | None:
    """:func:`control_beyond_clip` of the weighted control variate w * sigma_k+, read a piece at a time."""
    bound = clip * weight
    beyond, largest = 0, 0.0
    for piece in control:
        magnitudes = np.abs(piece)
        beyond += int(np.count_nonzero(magnitudes > bound))
        largest = max(largest, float(magnitudes.max(initial=0.0)))
    if not beyond:
        return None
    return (
        f"{beyond} coordinates of the drift correction's control variate exceed the encoding's clip "
        f"(largest {largest / weight:.4g} per unit of weight, clip {clip:g}), and clipping would corrupt it; raise "
        "[secure_aggregation] clip in the plan above that (or lower [training] lr / threshold_lr)"
    )
