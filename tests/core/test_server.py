"""The server step of Algorithm 1: weighted mean, projection of c, iterate averaging."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from fedfair.core import server
from fedfair.core.errors import AggregateError, ConfigError
from fedfair.core.update import Update


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


def test_running_average_is_the_mean_of_the_pairs_rounds_start_from_after_average_from() -> None:
    """average_from = 4 over 12 rounds averages theta^5, ..., theta^12: the pairs rounds 5 to 12 are broadcast."""
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=10.0, c=1.0)
    generator = torch.Generator().manual_seed(0)
    thetas, cs = [], []
    for _ in range(12):
        thetas.append(state.theta)
        cs.append(state.c)
        vector = torch.randn(3, generator=generator, dtype=torch.float64)
        state = server.apply(state, server.Aggregate.from_vector(vector, 1.0), bound=10.0, average_from=4)
    torch.testing.assert_close(state.theta_average, torch.stack(thetas[4:]).mean(0), rtol=0, atol=1e-14)
    assert state.c_average == pytest.approx(sum(cs[4:]) / 8, abs=1e-14)
    assert state.averaged_rounds == 8


def test_average_from_zero_is_the_papers_output_initial_model_in_last_iterate_out() -> None:
    """Algorithm 1 outputs (1/T) sum_{t=1..T} theta^t, theta^1 the initial model, by hand for T = 3.

    Steps of +3, +6, +9 from theta^1 = 0 give theta^2..4 = 3, 9, 18: the average is (0 + 3 + 9) / 3 = 4,
    not the (3 + 9 + 18) / 3 = 10 of the iterates after each step; c likewise, from c^1 = B = 10.
    """
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=10.0)
    for step, step_c in ((3.0, -1.0), (6.0, -2.0), (9.0, -4.0)):
        vector = torch.tensor([step, step_c], dtype=torch.float64)
        state = server.apply(state, server.Aggregate.from_vector(vector, 1.0), bound=10.0, average_from=0)
    assert state.theta.item() == 18.0 and state.c == 3.0
    assert state.theta_average.item() == pytest.approx(4.0, abs=1e-15)
    assert state.c_average == pytest.approx((10.0 + 9.0 + 7.0) / 3, abs=1e-15)
    assert state.averaged_rounds == 3


def test_before_averaging_starts_the_average_is_the_current_pair() -> None:
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=10.0)
    aggregate = server.Aggregate.from_vector(torch.tensor([2.0, -1.0], dtype=torch.float64), 1.0)
    state = server.apply(state, aggregate, bound=10.0, average_from=1)
    assert state.averaged_rounds == 0
    assert state.theta_average.item() == state.theta.item() == 2.0 and state.c_average == state.c == 9.0


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_non_finite_aggregate_is_refused_and_state_kept(bad: float) -> None:
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=1.0)
    aggregate = server.Aggregate.from_vector(torch.tensor([bad, 0.0, 0.0], dtype=torch.float64), 1.0)
    with pytest.raises(AggregateError, match="NaN or Inf"):
        server.apply(state, aggregate, bound=1.0)
    assert state.round == 0 and bool((state.theta == 0).all())


def test_zero_weight_and_empty_round_are_refused() -> None:
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=1.0)
    with pytest.raises(AggregateError, match="total weight"):
        server.apply(state, server.Aggregate.from_vector(torch.zeros(2, dtype=torch.float64), 0.0), bound=1.0)
    with pytest.raises(AggregateError, match="no collaborator"):
        server.Aggregate.of([])


# ------------------------------------------------- drift correction: the server's control variate


def corrected_updates() -> list[Update]:
    return [
        Update(
            delta=torch.tensor([1.0, 0.0], dtype=torch.float64),
            delta_c=0.5,
            weight=3.0,
            control=torch.tensor([0.25, -1.0, 2.0], dtype=torch.float64),
        ),
        Update(
            delta=torch.tensor([0.0, 4.0], dtype=torch.float64),
            delta_c=-1.5,
            weight=1.0,
            control=torch.tensor([1.0, 3.0, -2.0], dtype=torch.float64),
        ),
    ]


def test_drift_correction_starts_the_control_variate_at_zero_beside_theta_and_c() -> None:
    state = server.init(torch.zeros(4), bound=1.0, drift_correction=True)
    assert state.control is not None and state.control.dtype == torch.float64
    assert torch.equal(state.control, torch.zeros(5, dtype=torch.float64))
    assert server.init(torch.zeros(4), bound=1.0).control is None


def test_control_variates_travel_in_the_same_summed_vector_and_split_back() -> None:
    updates = corrected_updates()
    vector = updates[0].weighted_vector()
    assert vector.shape == (6,)
    split = server.Aggregate.from_vector(vector, 3.0, with_control=True)
    torch.testing.assert_close(split.weighted_delta, torch.tensor([3.0, 0.0], dtype=torch.float64))
    assert split.weighted_delta_c == 1.5 and split.weighted_control is not None
    torch.testing.assert_close(split.weighted_control, torch.tensor([0.75, -3.0, 6.0], dtype=torch.float64))
    summed = server.Aggregate.of(updates)
    assert summed.weighted_control is not None
    torch.testing.assert_close(summed.weighted_control, torch.tensor([1.75, 0.0, 4.0], dtype=torch.float64))
    with pytest.raises(AggregateError, match=r"2 \(d \+ 1\) entries, got 3"):
        server.Aggregate.from_vector(torch.zeros(3, dtype=torch.float64), 1.0, with_control=True)


def test_apply_sets_the_control_variate_to_the_weighted_mean_of_those_sent() -> None:
    state = server.init(torch.tensor([1.0, -2.0], dtype=torch.float64), bound=5.0, c=2.0, drift_correction=True)
    new = server.apply(state, server.Aggregate.of(corrected_updates()), bound=5.0)
    assert new.control is not None
    mean = torch.tensor([1.75, 0.0, 4.0], dtype=torch.float64) / 4.0
    torch.testing.assert_close(new.control, mean, rtol=0, atol=0)
    # The mean of what was sent, not a running sum: the same round applied again gives the same variate.
    again = server.apply(new, server.Aggregate.of(corrected_updates()), bound=5.0)
    assert again.control is not None
    torch.testing.assert_close(again.control, mean, rtol=0, atol=0)
    torch.testing.assert_close(new.theta, torch.tensor([1.75, -1.0], dtype=torch.float64), rtol=0, atol=1e-15)
    assert state.control is not None and not state.control.any(), "apply must leave the old state as it was"


def test_a_non_finite_control_variate_is_refused() -> None:
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=1.0, drift_correction=True)
    vector = torch.tensor([0.1, 0.2, 0.3, 0.0, math.nan, 0.0], dtype=torch.float64)
    with pytest.raises(AggregateError, match="control variate contains NaN or Inf"):
        server.apply(state, server.Aggregate.from_vector(vector, 1.0, with_control=True), bound=1.0)


def test_an_aggregate_whose_drift_correction_does_not_match_the_server_is_refused() -> None:
    corrected, plain = corrected_updates(), [replace(update, control=None) for update in corrected_updates()]
    with_control = server.init(torch.zeros(2, dtype=torch.float64), bound=5.0, drift_correction=True)
    without = server.init(torch.zeros(2, dtype=torch.float64), bound=5.0)
    with pytest.raises(AggregateError, match="the aggregate carries no control variates"):
        server.apply(with_control, server.Aggregate.of(plain), bound=5.0)
    with pytest.raises(AggregateError, match="the server does not correct drift"):
        server.apply(without, server.Aggregate.of(corrected), bound=5.0)
    with pytest.raises(AggregateError, match="same drift_correction"):
        server.Aggregate.of([corrected[0], plain[1]])
    longer = server.init(torch.zeros(4, dtype=torch.float64), bound=5.0, drift_correction=True)
    vector = torch.zeros(8, dtype=torch.float64)
    with pytest.raises(AggregateError, match="control part has 4 entries, the server's control variate 5"):
        server.apply(longer, server.Aggregate.from_vector(vector, 1.0, with_control=True), bound=5.0)


def test_momentum_moves_by_the_geometric_sum_of_past_mean_updates() -> None:
    """A constant mean update u with beta = 0.5: the moves are u, 1.5 u, 1.75 u (v = beta v + u), c's too
    while it stays inside [0, B]."""
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=10.0, c=5.0)
    aggregate = server.Aggregate.from_vector(torch.tensor([2.0, -4.0, -0.4], dtype=torch.float64), 2.0)
    moves = []
    for _ in range(3):
        new = server.apply(state, aggregate, bound=10.0, momentum=0.5)
        moves.append((new.theta - state.theta, new.c - state.c))
        state = new
    for (move, move_c), factor in zip(moves, (1.0, 1.5, 1.75), strict=True):
        torch.testing.assert_close(move, factor * torch.tensor([1.0, -2.0], dtype=torch.float64), rtol=0, atol=1e-14)
        assert move_c == pytest.approx(-0.2 * factor, abs=1e-14)


def test_momentum_zero_is_algorithm_ones_step_bit_for_bit() -> None:
    state = server.init(torch.tensor([0.3, -0.7], dtype=torch.float64), bound=3.0, c=1.0)
    aggregate = server.Aggregate.from_vector(torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64), 3.0)
    plain, with_zero = (
        server.apply(state, aggregate, bound=3.0),
        server.apply(state, aggregate, bound=3.0, momentum=0.0),
    )
    assert torch.equal(plain.theta, with_zero.theta) and plain.c == with_zero.c
    assert with_zero.velocity is None


def test_momentum_of_c_stops_at_the_box() -> None:
    """c pushed up against B keeps no speed: the first step down after it is the plain step, not one slowed by
    the pushes the projection cancelled."""
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=1.0, c=1.0)
    up = server.Aggregate.from_vector(torch.tensor([0.0, 0.5], dtype=torch.float64), 1.0)
    for _ in range(5):
        state = server.apply(state, up, bound=1.0, momentum=0.9)
    assert state.c == 1.0 and state.velocity is not None and state.velocity[-1].item() == 0.0
    down = server.Aggregate.from_vector(torch.tensor([0.0, -0.25], dtype=torch.float64), 1.0)
    assert server.apply(state, down, bound=1.0, momentum=0.9).c == pytest.approx(0.75, abs=1e-15)


def test_adam_moves_theta_by_its_closed_form_and_c_by_the_plain_step() -> None:
    """A constant mean update u: after t rounds m = (1 - b1^t) u and v = (1 - b2^t) u^2 (no bias correction,
    as Reddi et al. publish it), so theta moves by lr (1 - b1^t) u / (sqrt(1 - b2^t) |u| + tau) per
    coordinate, whatever u's scale up to tau; c moves by its plain mean update."""
    adam = server.Adam(lr=0.01, beta1=0.9, beta2=0.99, tau=1e-3)
    state = server.init(torch.zeros(2, dtype=torch.float64), bound=10.0, c=5.0)
    u = torch.tensor([2.0, -0.004], dtype=torch.float64)
    aggregate = server.Aggregate.from_vector(torch.cat([2.0 * u, torch.tensor([-0.6], dtype=torch.float64)]), 2.0)
    for t in (1, 2, 3):
        new = server.apply(state, aggregate, bound=10.0, adam=adam)
        first, second = (1 - 0.9**t) * u, (1 - 0.99**t) * u.square()
        torch.testing.assert_close(new.theta - state.theta, 0.01 * first / (second.sqrt() + 1e-3), rtol=1e-12, atol=0)
        assert new.c - state.c == pytest.approx(-0.3, abs=1e-14)
        state = new
    # The large coordinate's move barely depends on its size: it is below lr (1 - b1^t) / sqrt(1 - b2^t) by a
    # relative tau / (sqrt(1 - b2^t) |u|), at most tau / (sqrt(1 - b2) |u|) = 0.005.
    sign_step = sum(0.01 * (1 - 0.9**t) / math.sqrt(1 - 0.99**t) for t in (1, 2, 3))
    assert sign_step * (1 - 0.005) < state.theta[0].item() < sign_step


def test_adam_projects_c_and_keeps_its_moments_in_the_state() -> None:
    adam = server.Adam(lr=0.1)
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=1.0, c=0.9)
    new = server.apply(
        state, server.Aggregate.from_vector(torch.tensor([1.0, 0.5], dtype=torch.float64), 1.0), bound=1.0, adam=adam
    )
    assert new.c == 1.0 and new.velocity is not None and new.second_moment is not None
    assert new.velocity[-1].item() == pytest.approx(0.1, abs=1e-15)  # c's entry: the move it made after projection
    torch.testing.assert_close(new.second_moment, torch.tensor([0.01], dtype=torch.float64), rtol=0, atol=1e-15)


def test_adam_and_momentum_together_or_a_bad_adam_are_refused() -> None:
    state = server.init(torch.zeros(1, dtype=torch.float64), bound=1.0)
    aggregate = server.Aggregate.from_vector(torch.tensor([1.0, 0.0], dtype=torch.float64), 1.0)
    with pytest.raises(ConfigError, match="not both"):
        server.apply(state, aggregate, bound=1.0, momentum=0.9, adam=server.Adam(lr=0.01))
    for bad in ({"lr": 0.0}, {"lr": 0.01, "beta2": 1.0}, {"lr": 0.01, "tau": 0.0}):
        with pytest.raises(ConfigError):
            server.Adam(**bad)


def test_apply_is_the_step_and_average_formulas_bit_for_bit_and_leaves_its_inputs_alone() -> None:
    """theta + sum(w d) / sum(w) and a + (x - a) / k, evaluated whole, match apply (which forms them in place)."""
    generator = torch.Generator().manual_seed(11)
    state = server.init(torch.randn(1000, generator=generator, dtype=torch.float64), bound=3.0)
    for _ in range(4):
        weighted = torch.randn(1000, generator=generator, dtype=torch.float64)
        before, average = state.theta.clone(), state.theta_average.clone()
        moved = server.apply(state, server.Aggregate(weighted, 0.1, 3.7), bound=3.0)
        assert torch.equal(moved.theta, before + weighted / 3.7)
        count = moved.averaged_rounds
        expected = before.clone() if count == 1 else average + (before - average) / count
        assert torch.equal(moved.theta_average, expected)
        assert torch.equal(state.theta, before) and torch.equal(state.theta_average, average)
        state = moved


def _states_equal(one: server.ServerState, other: server.ServerState) -> bool:
    def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
        return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))

    return (
        (one.round, one.c, one.c_average, one.averaged_rounds)
        == (other.round, other.c, other.c_average, other.averaged_rounds)
        and same(one.theta, other.theta)
        and same(one.theta_average, other.theta_average)
        and same(one.velocity, other.velocity)
        and same(one.second_moment, other.second_moment)
        and same(one.control, other.control)
    )


@pytest.mark.parametrize("average_from", [0, 2])
@pytest.mark.parametrize(
    ("momentum", "adam", "drift"),
    [(0.0, None, False), (0.9, None, False), (0.9, None, True), (0.0, server.Adam(lr=0.05), False)],
)
def test_a_consumed_state_gives_the_same_step_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, momentum: float, adam: server.Adam | None, drift: bool, average_from: int
) -> None:
    """`consume` (the aggregator's: the step formed in the old state's tensors, 7 coordinates a slice here) gives
    the very state the pure step does, round after round, whatever the momentum, FedAdam, drift correction and
    averaging start."""
    monkeypatch.setattr(server, "_SLICE", 7)
    generator = torch.Generator().manual_seed(5)
    start = torch.randn(50, generator=generator, dtype=torch.float64)
    pure = server.init(start, bound=3.0, drift_correction=drift)
    consumed = server.init(start.clone(), bound=3.0, drift_correction=drift)
    for _ in range(6):
        delta = torch.randn(50, generator=generator, dtype=torch.float64)
        control = torch.randn(51, generator=generator, dtype=torch.float64) if drift else None
        aggregate = server.Aggregate(delta, float(torch.randn(1, generator=generator)), 2.5, control)
        options = {"bound": 3.0, "average_from": average_from, "momentum": momentum, "adam": adam}
        pure = server.apply(pure, aggregate, **options)  # type: ignore[arg-type]
        consumed = server.apply(consumed, aggregate, consume=True, **options)  # type: ignore[arg-type]
        assert _states_equal(pure, consumed)


def test_a_refused_aggregate_leaves_a_consumed_state_as_it_was() -> None:
    """Every refusal comes before `consume` writes: the aggregator keeps its model when a round is void."""
    state = server.init(torch.arange(5.0, dtype=torch.float64), bound=3.0)
    state = server.apply(state, server.Aggregate(torch.ones(5, dtype=torch.float64), 0.1, 1.0), bound=3.0, momentum=0.9)
    kept = replace(state, theta=state.theta.clone(), theta_average=state.theta_average.clone())
    assert state.velocity is not None
    velocity = state.velocity.clone()
    bad = torch.ones(5, dtype=torch.float64)
    bad[2] = math.nan
    with pytest.raises(AggregateError):
        server.apply(state, server.Aggregate(bad, 0.1, 1.0), bound=3.0, momentum=0.9, consume=True)
    assert torch.equal(state.theta, kept.theta) and torch.equal(state.theta_average, kept.theta_average)
    assert torch.equal(state.velocity, velocity)
