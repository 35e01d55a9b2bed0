"""What a collaborator contributes: the vector it submits, and the bound agreed weights put on it."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core import server
from fedfair.core.update import Update, bounded


def test_the_submitted_vector_is_the_weighted_update_then_the_weighted_control() -> None:
    update = Update(
        delta=torch.tensor([1.0, -2.0]),
        delta_c=0.5,
        weight=3.0,
        control=torch.tensor([4.0, 5.0, 6.0], dtype=torch.float64),
    )
    vector = update.weighted_vector()
    assert vector.dtype == torch.float64
    assert vector.tolist() == [3.0, -6.0, 1.5, 12.0, 15.0, 18.0]
    assert Update(delta=torch.tensor([1.0]), delta_c=2.0, weight=0.5).weighted_vector().tolist() == [0.5, 1.0]


def test_a_float32_submitted_vector_is_the_float64_one_rounded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Slices of 7 coordinates, so the fill crosses slice boundaries inside delta and inside the control.
    monkeypatch.setattr("fedfair.core.update._NORM_SLICE", 7)
    generator = torch.Generator().manual_seed(5)
    control = torch.randn(31, generator=generator, dtype=torch.float64)
    update = Update(delta=torch.randn(30, generator=generator), delta_c=-0.3, weight=123.456, control=control)
    wide = update.weighted_vector()
    narrow = update.weighted_vector(torch.float32)
    assert narrow.dtype == torch.float32 and wide.dtype == torch.float64
    expected = torch.cat([update.delta.double(), torch.tensor([-0.3], dtype=torch.float64), control]) * 123.456
    assert torch.equal(wide, expected)
    assert torch.equal(narrow, expected.to(torch.float32))


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=20),
    delta_c=st.floats(-1e3, 1e3, allow_nan=False),
    norm=st.floats(1e-3, 1e3),
    weight=st.floats(1.0, 1e4),
)
def test_a_bounded_update_lies_in_the_ball_points_the_same_way_and_carries_the_agreed_weight(
    values: list[float], delta_c: float, norm: float, weight: float
) -> None:
    update = Update(delta=torch.tensor(values, dtype=torch.float64), delta_c=delta_c, weight=123.0)
    length = math.sqrt(sum(value * value for value in values) + delta_c * delta_c)
    result = bounded(update, weight, norm)
    assert result.weight == weight
    result_length = math.sqrt(float(result.delta.square().sum()) + result.delta_c**2)
    assert result_length <= norm * (1 + 1e-12) + 1e-300
    if length <= norm:
        # Inside the ball: the very tensors, so federated = centralized stays exact.
        assert result.delta is update.delta and result.delta_c == update.delta_c
    else:
        assert result_length == pytest.approx(norm, rel=1e-12)
        scale = norm / length
        assert torch.allclose(result.delta, update.delta * scale, rtol=1e-12, atol=1e-300)
        assert result.delta_c == pytest.approx(delta_c * scale, rel=1e-12, abs=1e-300)


def test_a_bounded_update_moves_a_weighted_mean_by_at_most_its_share_of_the_bound() -> None:
    """w_k C / W: the most one site can move the mean, whatever it computed."""
    honest = [Update(delta=torch.full((4,), 0.01, dtype=torch.float64), delta_c=0.0, weight=1.0) for _ in range(3)]
    liar = Update(delta=torch.full((4,), -1e6, dtype=torch.float64), delta_c=1e6, weight=1e6)
    weights, norm = [30.0, 30.0, 30.0, 10.0], 2.0
    updates = [bounded(update, weight, norm) for update, weight in zip([*honest, liar], weights, strict=True)]
    mean = server.Aggregate.of(updates)
    without = server.Aggregate.of(updates[:3])
    moved = mean.weighted_delta / mean.total_weight - without.weighted_delta / mean.total_weight
    step_c = mean.weighted_delta_c / mean.total_weight - without.weighted_delta_c / mean.total_weight
    assert math.sqrt(float(moved.square().sum()) + step_c**2) <= 10.0 * norm / 100.0 + 1e-12


def test_a_non_finite_update_is_left_for_the_caller_to_refuse() -> None:
    update = Update(delta=torch.tensor([math.nan, 1.0]), delta_c=0.0, weight=5.0)
    result = bounded(update, 1.0, 1.0)
    assert result.weight == 1.0 and bool(torch.isnan(result.delta).any())


SPECIAL = st.sampled_from([math.nan, math.inf, -math.inf, 3e38, -3e38, 1e308, 0.0, 1.0])


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.floats(-1e3, 1e3) | SPECIAL, min_size=1, max_size=12),
    delta_c=st.floats(-1e3, 1e3) | SPECIAL,
    control=st.none() | st.lists(st.floats(-1e3, 1e3) | SPECIAL, min_size=1, max_size=12),
    weight=st.floats(0.0, 1e4) | st.sampled_from([math.nan, math.inf]),
    wide=st.booleans(),
)
def test_the_finiteness_read_from_the_parts_is_that_of_the_weighted_vector(
    values: list[float], delta_c: float, control: list[float] | None, weight: float, wide: bool
) -> None:
    """Past float32's range once weighted (3e38 times 10), a NaN, an infinity, or 0 * inf: as the vector has it."""
    dtype = torch.float64 if wide else torch.float32
    update = Update(
        delta=torch.tensor(values, dtype=dtype),
        delta_c=delta_c,
        weight=weight,
        control=None if control is None else torch.tensor(control, dtype=torch.float64),
    )
    for sent in (torch.float32, torch.float64):
        assert update.weighted_finite(sent) == bool(torch.isfinite(update.weighted_vector(sent)).all())


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 50), span=st.integers(1, 9), drift=st.booleans(), weight=st.floats(0.0, 1e4))
def test_the_weighted_pieces_are_the_vector_in_order_none_longer_than_asked(
    size: int, span: int, drift: bool, weight: float
) -> None:
    generator = torch.Generator().manual_seed(size)
    control = torch.randn(size + 1, generator=generator, dtype=torch.float64) if drift else None
    update = Update(delta=torch.randn(size, generator=generator), delta_c=0.25, weight=weight, control=control)
    for dtype in (torch.float32, torch.float64):
        pieces = list(update.weighted_pieces(dtype, span))
        assert all(0 < piece.numel() <= span and piece.dtype == dtype for piece in pieces)
        assert torch.equal(torch.cat(pieces), update.weighted_vector(dtype))
