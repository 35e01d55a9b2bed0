"""The server step of Algorithm 1: weighted mean, projection of c, iterate averaging."""

from __future__ import annotations

import math

import pytest
import torch

from fedfair.core import server
from fedfair.core.local import Update


def test_apply_moves_to_the_weighted_mean_of_client_iterates() -> None:
    state = server.init(torch.tensor([1.0, -2.0], dtype=torch.float64), bound=5.0, c=2.0)
    updates = [
        Update(delta=torch.tensor([1.0, 0.0], dtype=torch.float64), delta_c=0.5, weight=3.0),
        Update(delta=torch.tensor([0.0, 4.0], dtype=torch.float64), delta_c=-1.5, weight=1.0),
    ]
    new = server.apply(state, server.Aggregate.of(updates), bound=5.0)
    torch.testing.assert_close(new.theta, torch.tensor([1.75, -1.0], dtype=torch.float64), rtol=0, atol=1e-15)
    assert new.c == pytest.approx(2.0 + (3 * 0.5 - 1.5) / 4.0, abs=1e-15)
    assert new.round == 1


@pytest.mark.parametrize(("step_c", "expected"), [(10.0, 5.0), (-10.0, 0.0)])
def test_threshold_is_projected_onto_zero_bound(step_c: float, expected: float) -> None:
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=5.0, c=2.0)
    aggregate = server.Aggregate.from_vector(torch.tensor([0.0, step_c], dtype=torch.float64), 1.0)
    assert server.apply(state, aggregate, bound=5.0).c == expected


def test_c_starts_at_the_bound() -> None:
    assert server.init(torch.zeros(3), bound=7.5).c == 7.5


def test_running_average_equals_mean_of_suffix_iterates() -> None:
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=10.0, c=1.0)
    generator = torch.Generator().manual_seed(0)
    thetas, cs = [], []
    for _ in range(12):
        vector = torch.randn(3, generator=generator, dtype=torch.float64)
        state = server.apply(state, server.Aggregate.from_vector(vector, 1.0), bound=10.0, average_from=4)
        thetas.append(state.theta)
        cs.append(state.c)
    torch.testing.assert_close(state.theta_average, torch.stack(thetas[4:]).mean(0), rtol=0, atol=1e-14)
    assert state.c_average == pytest.approx(sum(cs[4:]) / 8, abs=1e-14)
    assert state.averaged_rounds == 8


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_aggregate_is_refused_and_state_kept(bad: float) -> None:
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=1.0)
    aggregate = server.Aggregate.from_vector(torch.tensor([bad, 0.0, 0.0], dtype=torch.float64), 1.0)
    with pytest.raises(server.AggregateError, match="NaN or Inf"):
        server.apply(state, aggregate, bound=1.0)
    assert state.round == 0 and bool((state.theta == 0).all())


def test_zero_weight_and_empty_round_are_refused() -> None:
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=1.0)
    with pytest.raises(server.AggregateError, match="total weight"):
        server.apply(state, server.Aggregate.from_vector(torch.zeros(2, dtype=torch.float64), 0.0), bound=1.0)
    with pytest.raises(server.AggregateError, match="no collaborator"):
        server.Aggregate.of([])
