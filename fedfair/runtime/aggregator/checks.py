"""What the aggregator checks of a sum before it applies it, and what a sum is.

A plain upload is checked one by one as it arrives (:func:`decode_plain`, and
:func:`screen_plain_update` against the plan's ``[influence]``); a decoded sum, plain or
secure, as a whole (:func:`check_decoded_update`, :func:`check_agreed_influence`). A failed
sum check voids the round (:class:`RoundAbortedError`); the model is never touched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedfair.core.errors import Refusal, RefusedError, RoundAbortedError
from fedfair.core.sum_bounds import NORM_SLACK, DecodedSum, encoding_breach, influence_breach
from fedfair.runtime.plan.influence import InfluenceSettings
from fedfair.runtime.transport.chunks import PlainValues, plain_rounding, plain_upload_size, read_plain_upload
from fedfair.secagg import EncodingConfig

UploadScreen = Callable[[str, np.ndarray, float], None]
"""A check of one plain upload (its values and weight) by its sender (raises RefusedError)."""


@dataclass
class SumOutcome:
    """The sum the aggregator learns, and what it knows about the round's participants."""

    weighted_sum: np.ndarray
    total_weight: float
    error_bound: float
    contributors: tuple[str, ...]
    dropped: dict[str, list[str]] = field(default_factory=dict)
    received_bytes: int = 0
    stage_seconds: dict[str, float] = field(default_factory=dict)
    culprits: dict[str, str] = field(default_factory=dict)
    """Collaborators to exclude from later rounds, with why (see :meth:`SumDriver._named`)."""
    noise_std: float = 0.0
    """The standard deviation of each coordinate's distributed DP noise in `weighted_sum` (0: exact)."""
    verdict_record_sha256: str = ""
    """SHA-256 (hex) of the bounded sum's signed verdict record as every site was sent it ("": no bounded sum)."""
    verified_by: frozenset[str] = frozenset()
    """The sites that sent their verdict on the masked round's verified sum (none for another kind of round)."""


def decode_plain(
    payload: bytes, dimension: int, encoding: EncodingConfig, wire: PlainValues
) -> tuple[np.ndarray, float]:
    """The server's decode check of a plain upload in the wire type `wire`: (values, weight).

    `dimension` finite values w * delta and the weight w (:func:`~fedfair.runtime.transport.chunks.plain_upload`),
    refused unless w is in (0, max_weight] and every value is within clip * w, plus twice the wire type's rounding
    (:func:`~fedfair.runtime.transport.chunks.plain_rounding`: float32 may round a value on the bound past it; twice,
    for the float64 arithmetic that states the limit).

    These are the bounds the fixed-point encoding enforces under secure aggregation (it
    clips each coordinate of the unweighted update to [-clip, clip]); honest collaborators
    clip their plain updates the same way, so only a broken or hostile one is refused.
    Without them one finite but huge update (1e100) would become the model.
    """
    if len(payload) != plain_upload_size(dimension, wire):
        raise RefusedError(
            Refusal.INVALID_UPLOAD,
            f"a plain update must hold {dimension} {wire.name} values and a float64 weight",
        )
    # A read-only view of the received bytes, checked by its extremes (NaN propagates through both):
    # no copy and no temporary of the vector's size, each of which would be fresh pages to fault in.
    coordinates, weight = read_plain_upload(payload, wire)
    low, high = (float(coordinates.min()), float(coordinates.max())) if coordinates.size else (0.0, 0.0)
    if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(weight)):
        raise RefusedError(Refusal.INVALID_UPLOAD, "the update contains NaN or Inf")
    if not 0.0 < weight <= encoding.max_weight:
        raise RefusedError(
            Refusal.INVALID_UPLOAD, f"the update's weight is outside (0, max_weight = {encoding.max_weight:g}]"
        )
    bound = encoding.clip * weight
    if max(high, -low) > bound + 2.0 * plain_rounding(bound, wire):
        raise RefusedError(
            Refusal.INVALID_UPLOAD,
            f"the update lies outside the clipping range (clip = {encoding.clip:g} per unit of weight)",
        )
    return coordinates, weight


def check_decoded_update(outcome: SumOutcome, clip: float | None, count: int) -> None:
    """The server's decode check of a summed training update (:func:`~fedfair.core.sum_bounds.encoding_breach`).

    A sum that breaks it means a contributor broke the encoding: the round is void (RoundAbortedError).
    """
    breach = encoding_breach(_decoded(outcome, count), clip)
    if breach is not None:
        raise RoundAbortedError(breach)


def screen_plain_update(influence: InfluenceSettings, batch_fraction: float, parameters: int) -> UploadScreen:
    """The aggregator's check of each plain training upload against the plan's [influence].

    The weight must be the one the plan agrees for its sender, and the update (its first d + 1 values over the
    weight: delta theta and delta c) at most `update_norm` long, so one site moves the mean by at most w_k C /
    W. Honest collaborators scale their updates into that ball (core.update.bounded).
    """

    def screen(peer: str, values: np.ndarray, weight: float) -> None:
        agreed = influence.weight_of(peer, batch_fraction)
        if weight != agreed:
            raise RefusedError(
                Refusal.INVALID_UPLOAD,
                f"the update's weight {weight:g} is not the {agreed:g} the plan's [influence] agrees for {peer}",
            )
        length = _norm(values[: parameters + 1]) / weight
        if length > influence.update_norm * (1.0 + NORM_SLACK):
            raise RefusedError(
                Refusal.INVALID_UPLOAD,
                f"the update's L2 norm {length:.6g} exceeds the plan's [influence] update_norm = "
                f"{influence.update_norm:g}",
            )

    return screen


_NORM_CHUNK = 1 << 16
"""Values squared and summed per pass by :func:`_norm`."""


def _norm(values: np.ndarray) -> float:
    """The L2 norm of `values`, summed in float64 a chunk at a time: no float64 copy of a float32 upload."""
    squares = 0.0
    for start in range(0, values.size, _NORM_CHUNK):
        piece = values[start : start + _NORM_CHUNK].astype(np.float64)
        squares += float(np.dot(piece, piece))
    return math.sqrt(squares)


def check_agreed_influence(
    outcome: SumOutcome, influence: InfluenceSettings, batch_fraction: float, parameters: int
) -> float:
    """The agreed total weight of the round's contributors, after checking the decoded sum against it.

    :func:`~fedfair.core.sum_bounds.influence_breach`: a decoded total that is not the agreed one, or a mean
    update longer than `update_norm`, voids the round (RoundAbortedError). This check is all a secure sum allows:
    it bounds each round's step, not one site's share of it (docs/design.md, "Bounded influence").
    """
    agreed = influence.total_weight(outcome.contributors, batch_fraction)
    decoded = _decoded(outcome, len(outcome.contributors))
    breach = influence_breach(decoded, agreed, influence.update_norm, parameters, outcome.contributors)
    if breach is not None:
        raise RoundAbortedError(breach)
    return agreed


def _decoded(outcome: SumOutcome, count: int) -> DecodedSum:
    return DecodedSum.of(outcome.weighted_sum, outcome.total_weight, outcome.error_bound, count)
