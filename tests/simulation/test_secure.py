"""SecureSum: the masked aggregate is the plain Aggregate.of within the error bound it records, controls included."""

from __future__ import annotations

import math

import pytest
import torch

from fedfair.core.server import Aggregate
from fedfair.core.update import Update
from fedfair.secagg import EncodingConfig, Encoder
from fedfair.simulation.secure import SecureSum

ENCODING = EncodingConfig(clip=2.0, max_weight=50.0, fractional_bits=20, modulus_bits=32)


def updates(count: int, dimension: int, seed: int, control: bool) -> list[Update]:
    """Updates inside the clip range (|delta|, |delta_c|, |control| <= 2), of uneven weights."""
    generator = torch.Generator().manual_seed(seed)

    def within_clip(*shape: int) -> torch.Tensor:
        return (torch.rand(*shape, generator=generator, dtype=torch.float64) * 2 - 1) * ENCODING.clip

    return [
        Update(
            delta=within_clip(dimension),
            delta_c=float(within_clip(1)),
            weight=float(5 + 11 * index),
            control=within_clip(dimension + 1) if control else None,
        )
        for index in range(count)
    ]


def slack(plain: torch.Tensor, updates: list[Update]) -> torch.Tensor:
    """The float64 rounding of the plain sum itself: n additions, each off by at most half an ulp of the
    largest partial sum, bounded by n * 2^-53 * sum of |terms|, coordinate by coordinate."""
    magnitudes = torch.stack([update.weighted_vector().abs() for update in updates]).sum(dim=0)
    return len(updates) * 2.0**-53 * magnitudes[: plain.numel()]


def assert_close(secure: Aggregate, plain: Aggregate, bound: float, batch: list[Update]) -> None:
    vector = torch.cat([plain.weighted_delta, torch.tensor([plain.weighted_delta_c])])
    tolerance = bound + slack(vector, batch)
    masked = torch.cat([secure.weighted_delta, torch.tensor([secure.weighted_delta_c])])
    assert bool(((masked - vector).abs() <= tolerance).all())
    assert abs(secure.total_weight - plain.total_weight) <= bound  # small integers: exact in float64
    if plain.weighted_control is None:
        assert secure.weighted_control is None
    else:
        assert secure.weighted_control is not None
        half = vector.numel()
        control_slack = bound + slack(torch.cat([vector, plain.weighted_control]), batch)[half:]
        assert bool(((secure.weighted_control - plain.weighted_control).abs() <= control_slack).all())


@pytest.mark.parametrize("control", [False, True], ids=["plain", "drift-corrected"])
def test_the_secure_aggregate_is_the_plain_one_within_the_recorded_error_bound(control: bool) -> None:
    secure = SecureSum(ENCODING)
    batch = updates(4, 6, seed=1, control=control)
    aggregate = secure(batch)
    plain = Aggregate.of(batch)
    assert len(secure.error_bounds) == 1
    assert aggregate.weighted_delta.shape == plain.weighted_delta.shape
    assert_close(aggregate, plain, secure.error_bounds[0], batch)


def test_each_round_records_the_bound_its_decoded_sum_carries() -> None:
    """n summands of an f-bit encoding err by less than n * 2^-f (the encoder's bound, with no 64-bit conversion term
    at these sizes); every call is one more round and one more bound, for however many collaborators it has."""
    secure = SecureSum(ENCODING)
    for count, seed in ((3, 2), (5, 3), (3, 4)):
        batch = updates(count, 4, seed=seed, control=False)
        assert_close(secure(batch), Aggregate.of(batch), secure.error_bounds[-1], batch)
    assert secure.error_bounds == [math.ldexp(count, -ENCODING.fractional_bits) for count in (3, 5, 3)]
    assert secure.error_bounds == [Encoder(ENCODING, count).error_bound(count) for count in (3, 5, 3)]


def test_masking_does_not_bias_the_sum_beyond_the_bound_even_where_every_coordinate_sits_at_the_clip() -> None:
    batch = [
        Update(torch.full((3,), sign * ENCODING.clip, dtype=torch.float64), -sign * ENCODING.clip, weight)
        for sign, weight in ((1.0, 50.0), (1.0, 49.5), (-1.0, 0.25))
    ]
    secure = SecureSum(ENCODING)
    assert_close(secure(batch), Aggregate.of(batch), secure.error_bounds[0], batch)
