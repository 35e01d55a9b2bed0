"""The bounds a round's decoded training sum keeps before any server step is applied to it.

Under secure aggregation every contributor clips each coordinate of its update to [-clip, clip], scales the
update (delta theta, delta c) into the plan's ``update_norm`` ball and encodes it with the weight the plan
agrees for it. So an honest sum is finite, lies in the box clip x W, has the agreed total weight W and a mean
step at most ``update_norm`` long, each up to the encoding's rounding. The aggregator voids a round whose sum
breaks a bound (:mod:`fedfair.runtime.aggregator.checks`), and a site's model chain applies no server step to
it (:mod:`fedfair.runtime.collaborator.chain`). Both ask these functions, so a sum one side voids the other
voids too, and a verified sum's size is bounded at every site as at the aggregator.

A sum is read a slice at a time (:class:`DecodedSum`): a site that decodes a large sum by slice never holds it
whole, and the aggregator's whole sum is read as views.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import numpy as np

NORM_SLACK = 1e-6
"""Relative room for float rounding in the influence checks: an honest update scaled onto the
update_norm ball in float32 may come out a few ulps long."""

_SLICE = 1 << 17
"""Values read at a time (1 MiB of float64, which the cache holds while each bound reads it): never a temporary of a
model's size. Against 8 MiB slices, one pass for both checks cost a site 10.7 ms at d = 10^7 decoded by slice, not
13.3 (the two checks' own passes: 16.2). The aggregator's checks and a site's read the same slices, so their float
sums agree to the bit."""


@dataclass(frozen=True)
class DecodedSum:
    """A decoded training sum: `read(a, b)` gives its values [a, b) (float64), `length` of them.

    `total_weight` is the decoded sum of the weights, `error_bound` the encoding's bound on every coordinate's
    error (and the total weight's), `count` the number of inputs summed.
    """

    read: Callable[[int, int], np.ndarray]
    length: int
    total_weight: float
    error_bound: float
    count: int

    @classmethod
    def of(cls, values: np.ndarray, total_weight: float, error_bound: float, count: int) -> DecodedSum:
        """A sum held whole, read as views of `values`."""
        return cls(lambda start, stop: values[start:stop], values.size, total_weight, error_bound, count)

    def slices(self, stop: int | None = None) -> Iterator[np.ndarray]:
        """The values [0, `stop`) (default: all), a slice at a time."""
        end = self.length if stop is None else min(stop, self.length)
        for start in range(0, end, _SLICE):
            yield self.read(start, min(start + _SLICE, end))


@dataclass(frozen=True)
class Extent:
    """What the bounds read of a decoded sum: its extremes' size and the squares of its first values, summed."""

    largest: float
    """The greatest absolute value (NaN where any value is NaN; 0 for an empty sum)."""
    squares: float
    """The sum of the squares of the values [0, steps) (:func:`extent`), a slice's einsum at a time."""


def extent(decoded: DecodedSum, steps: int, extremes: bool = True) -> Extent:
    """One pass over `decoded`: its :class:`Extent`, the squares over its first `steps` values.

    Each slice is read (a site's decoded by slice: decoded) once for both measures; without `extremes`, only the
    first `steps` values are read and :attr:`Extent.largest` is 0.
    """
    largest, squares = 0.0, 0.0
    for start, values in zip(range(0, decoded.length, _SLICE), decoded.slices(None if extremes else steps)):
        if extremes and values.size:
            # The extremes, NaN propagating through both: no temporary of the slice's size.
            low, high = float(values.min()), float(values.max())
            largest = max(largest, high, -low) if math.isfinite(low) and math.isfinite(high) else math.nan
        squared = values[: max(steps - start, 0)]
        # einsum's own loop, not np.dot's BLAS: with a site per thread (sites as threads, the aggregator's own) BLAS
        # workers spin against each other; at d = 10^6 a site's dot cost 17 ms of its thread's CPU, einsum's 0.5 ms.
        squares += float(np.einsum("i,i->", squared, squared))
    return Extent(largest, squares)


def sum_breach(
    decoded: DecodedSum,
    clip: float | None,
    agreed: float,
    update_norm: float,
    parameters: int,
    contributors: Collection[str],
) -> str | None:
    """:func:`encoding_breach`, then :func:`influence_breach`, of `decoded`, from one pass over it (:func:`extent`).

    What a site's model chain asks of a verified sum: decoded by slice, it is decoded once for both bounds.
    """
    measured = extent(decoded, parameters + 1)
    return encoding_breach(decoded, clip, measured) or influence_breach(
        decoded, agreed, update_norm, parameters, contributors, measured
    )


def encoding_breach(decoded: DecodedSum, clip: float | None, measured: Extent | None = None) -> str | None:
    """Why `decoded` cannot be a sum of honestly encoded updates (the round is void), or None when it can.

    The total weight must be positive and every value finite; under secure aggregation (`clip`, the encoding's
    range per unit of weight) every value must lie in the box clip x W, up to the rounding of `count` inputs. A
    plain sum (clip None) was checked upload by upload against the same box, so only the first two apply (a box
    check of the float sum could trip only on the rounding of honest updates that sit on the bound). `measured`
    is :func:`extent`'s of `decoded` where the caller read it already.
    """
    total = decoded.total_weight
    if not (math.isfinite(total) and total > 0.0):
        return f"the decoded total weight {total} is not positive; the round is void"
    largest = (measured or extent(decoded, 0)).largest
    if not math.isfinite(largest):
        return "the decoded update contains NaN or Inf; the round is void"
    if clip is None:
        return None
    limit = clip * total + decoded.error_bound * (1.0 + clip) * max(decoded.count, 1)
    if largest > limit:
        return "the decoded update lies outside the clipping range; a contributor broke the encoding"
    return None


def influence_breach(
    decoded: DecodedSum,
    agreed: float,
    update_norm: float,
    parameters: int,
    contributors: Collection[str],
    measured: Extent | None = None,
) -> str | None:
    """Why `decoded` breaks the plan's [influence] (the round is void), or None when it keeps it.

    The decoded total weight must be the `agreed` total of the `contributors` (to the encoding's rounding), or
    someone sent a weight of its own; the mean step (the first `parameters` + 1 values, delta theta and delta c,
    over `agreed`) must be at most `update_norm` long (plus rounding), as a mean of updates that are. `measured`
    is :func:`extent`'s of `decoded` (over those values) where the caller read it already.
    """
    count = max(decoded.count, 1)
    if abs(decoded.total_weight - agreed) > decoded.error_bound * count + NORM_SLACK * agreed:
        return (
            f"the decoded total weight {decoded.total_weight:.9g} is not the {agreed:.9g} the plan's [influence] "
            f"agrees for the contributors {', '.join(sorted(contributors))}; a contributor sent a weight of its own, the "
            "round is void"
        )
    steps = parameters + 1
    length = math.sqrt((measured or extent(decoded, steps, extremes=False)).squares)
    rounding = decoded.error_bound * count * math.sqrt(min(steps, decoded.length))
    if length > (update_norm * (1.0 + NORM_SLACK)) * agreed + rounding:
        return (
            f"the decoded mean update is {length / agreed:.6g} long, beyond the plan's [influence] update_norm = "
            f"{update_norm:g}; a contributor did not bound its update, the round is void"
        )
    return None
