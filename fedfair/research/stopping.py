"""The round budget tuned like a step size: each method stops where its own validation worst-rho risk was lowest.

A stopping run trains a method's chosen point on the validation split up to a ceiling and judges, every
`CHECK_EVERY` rounds, the output a run stopped at that round would give (`checkpoints`: not the state's own
running average, which a longer run starts later). Its stop round is the checkpoint of lowest validation
worst-rho risk (`stop_round`); where that is the ceiling itself, the edge rule of `fedfair.research.tuning`
applies to the rounds as to any knob: the ceiling rises to the next rung of `CEILINGS` (`choose_stops`). The
test runs then train exactly the stop round's rounds on the test seeds. Why: docs/paper.md, "Stopped by
validation".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from fedfair.core.errors import ConfigError
from fedfair.core.server import ServerState
from fedfair.research.tuning import diverged

CHECK_EVERY = 10
"""Rounds between a stopping run's validation checkpoints: the resolution of every stop round."""

CEILINGS = (1000, 2000, 4000)
"""The ladder of round ceilings: a stop round at a rung's ceiling raises it to the next (the edge rule)."""

Trace = Sequence[tuple[int, float]]
"""(round, validation worst-rho risk) pairs of a stopping run's checkpoints, in round order."""

Key = TypeVar("Key", bound=Hashable)


def stop_round(trace: Trace) -> int | None:
    """The checkpoint round of lowest validation risk (ties: the earliest; a diverged one never wins).

    None when the trace is empty or every checkpoint diverged (`tuning.diverged`).
    """
    finite = [(risk, round_number) for round_number, risk in trace if not diverged(risk)]
    return min(finite)[1] if finite else None


@dataclass(frozen=True)
class Stop:
    """Where one point's validation says to stop: the round, its validation risk, the ceiling it ran to, and why."""

    round: int | None
    """The stop round (None: every checkpoint diverged)."""
    risk: float
    """The validation worst-rho risk at `round` (NaN where it is None)."""
    ceiling: int
    """The last ceiling the point was trained to: the test runs' `max_rounds`."""
    limits: tuple[str, ...] = ()
    """Why the stop round is not strictly inside the ceiling (empty: it is)."""


def choose_stops(
    traces_to: Callable[[int, list[Key]], Sequence[Trace]], keys: Sequence[Key], ceilings: Sequence[int] = CEILINGS
) -> dict[Key, Stop]:
    """The stop round of each point in `keys`, every point at one rung of `ceilings` trained together.

    `traces_to(ceiling, pending)` gives the checkpoints to `ceiling` of each pending point, in order (one call a
    rung, so that a pool trains them at once). A stop round equal to its ceiling is a choice at the edge of the
    range tried, no choice: the point goes on to the next rung, until the ladder's top, which is then named in
    `Stop.limits`. A run that diverges before its ceiling stops inside it (its checkpoints end where it failed).

    Raises:
        ConfigError: `ceilings` is empty or not ascending.
    """
    if not ceilings or any(low >= high for low, high in zip(ceilings, ceilings[1:], strict=False)):
        raise ConfigError(f"the ceilings must be a non-empty ascending ladder of rounds, got {tuple(ceilings)}")
    stops: dict[Key, Stop] = {}
    pending = list(keys)
    for ceiling in ceilings:
        if not pending:
            break
        at_edge: list[Key] = []
        for key, trace in zip(pending, traces_to(ceiling, pending), strict=True):
            best = stop_round(trace)
            if best is None:
                stops[key] = Stop(None, math.nan, ceiling, (f"every checkpoint to round {ceiling} diverged",))
            else:
                stops[key] = Stop(best, dict(trace)[best], ceiling)
                if best >= ceiling:
                    at_edge.append(key)
        pending = at_edge
    for key in pending:  # still falling at the ladder's top
        top = f"rounds {stops[key].ceiling} is its ladder's end: the curve was still falling there"
        stops[key] = dataclasses.replace(stops[key], limits=(top,))
    return {key: stops[key] for key in keys}


def checkpoints(
    average_from: float, every: int, rounds: int, emit: Callable[[int, torch.Tensor], None]
) -> Callable[[ServerState], None]:
    """A round callback handing `emit` (t, the output a run of t rounds gives) every `every` rounds up to `rounds`.

    A T-round run outputs the mean of theta^s over s = int(average_from T) + 1, ..., T (`core.server.apply`),
    which depends on T: a longer run's running average (from its own half) is not it. The callback keeps the
    running sum of theta^s from s = 2 (in float64) and its value at each s = int(average_from t) a later
    checkpoint t needs, so that it holds about t / (2 `every`) sums at a time, never every iterate. At round
    t the state holds theta^{t+1}; theta^1, the start, is never needed while `average_from` * `every` >= 1.

    Raises:
        ConfigError: `every` < 1, or `average_from` * `every` < 1 (a checkpoint would need the start model).
    """
    if every < 1 or average_from * every < 1:
        raise ConfigError(
            f"checkpoints every {every} rounds at average_from {average_from:g} would average the start model in: "
            "check every 1 / average_from rounds or more (e.g. every 10 at average_from 0.5)"
        )
    starts = {int(average_from * due) for due in range(every, rounds + 1, every)}
    running: torch.Tensor | None = None  # sum of theta^s, s = 2, ..., round (None: still 0)
    kept: dict[int, torch.Tensor | None] = {}

    def record(state: ServerState) -> None:
        nonlocal running
        now = state.round
        if now in starts:
            kept[now] = None if running is None else running.clone()
        if now % every == 0 and now <= rounds:
            start = int(average_from * now)
            before = kept.pop(start)
            assert running is not None  # now >= every > start >= 1: theta^2 .. theta^now are in
            total = running if before is None else running - before
            emit(now, total / (now - start))
        theta = state.theta.detach().to("cpu", torch.float64)
        running = theta.clone() if running is None else running.add_(theta)

    return record


def lowest_until(trace: Trace, rounds: int) -> float:
    """The lowest validation risk of `trace`'s checkpoints up to round `rounds` (NaN: none, or all diverged)."""
    finite = [risk for round_number, risk in trace if round_number <= rounds and not diverged(risk)]
    return min(finite) if finite else math.nan


def outrun(candidate: Trace, incumbent: Trace, rounds: int, margin: float) -> bool:
    """Whether `candidate`, trained `rounds` rounds, is clearly worse than `incumbent` at the same round.

    Clearly worse: every checkpoint of `candidate` to `rounds` diverged, or its lowest risk there exceeds the
    incumbent's lowest over the same rounds by more than `margin`. A pruned candidate's recorded risk is its
    lowest so far, at least its stopped risk, and above the incumbent's stopped risk (at most the incumbent's
    lowest so far): it never becomes the choice. The guess is only that `margin` covers what `candidate` would
    gain after `rounds` beyond what the incumbent gains (a slow starter, e.g. a smaller step, may gain more).

    Raises:
        ConfigError: `margin` is negative or `incumbent` has no finite checkpoint up to `rounds`.
    """
    if margin < 0:
        raise ConfigError(f"the pruning margin is a risk difference >= 0, got {margin:g}")
    reference = lowest_until(incumbent, rounds)
    if math.isnan(reference):
        raise ConfigError(f"the incumbent has no finite checkpoint up to round {rounds}: nothing to prune against")
    mine = lowest_until(candidate, rounds)
    return math.isnan(mine) or mine > reference + margin
