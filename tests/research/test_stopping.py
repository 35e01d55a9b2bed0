"""The stopping rule: the stop round is the argmin of the validation curve, and a stop at the ceiling raises it."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import pytest
import torch

from fedfair.core.errors import ConfigError
from fedfair.core.server import ServerState
from fedfair.research import stopping
from fedfair.research.stopping import CEILINGS, Stop, Trace, choose_stops, stop_round


def curve(best: int, ceiling: int, every: int = 10) -> stopping.Trace:
    """A validation U-curve on the checkpoints to `ceiling`, lowest at round `best` (0.5 there)."""
    return [
        (round_number, 0.5 + ((round_number - best) / 1000) ** 2) for round_number in range(every, ceiling + 1, every)
    ]


def choose_stop(trace_to: Callable[[int], Trace], ceilings: Sequence[int] = CEILINGS) -> Stop:
    """One point's stop: `choose_stops` of it alone."""
    return choose_stops(lambda ceiling, keys: [trace_to(ceiling) for _ in keys], ["point"], ceilings)["point"]


def test_the_stop_round_is_the_argmin_and_ties_and_divergence_are_ruled() -> None:
    assert stop_round(curve(370, 1000)) == 370
    assert stop_round([(10, 0.6), (20, 0.5), (30, 0.5), (40, 0.7)]) == 20  # a tie: the earliest
    assert stop_round([(10, 0.6), (20, math.nan), (30, 0.55), (40, math.inf)]) == 30  # diverged never wins
    assert stop_round([(10, math.nan)]) is None and stop_round([]) is None


def test_a_stop_inside_the_first_ceiling_trains_no_further() -> None:
    asked: list[int] = []

    def trace_to(ceiling: int) -> stopping.Trace:
        asked.append(ceiling)
        return curve(370, ceiling)

    assert choose_stop(trace_to) == Stop(370, 0.5, 1000)
    assert asked == [1000]


def test_a_stop_at_the_ceiling_raises_it_by_the_edge_rule_until_inside() -> None:
    asked: list[int] = []

    def trace_to(ceiling: int) -> stopping.Trace:
        asked.append(ceiling)
        return curve(1500, ceiling)  # still falling at 1,000 rounds

    assert choose_stop(trace_to) == Stop(1500, 0.5, 2000)
    assert asked == [1000, 2000]


def test_every_point_of_a_rung_is_trained_together_and_only_those_at_its_edge_go_on() -> None:
    # One call a rung, so a pool trains its points at once: a search whose points hit a ceiling one after another
    # left all but one worker idle.
    bests = {"inside": 370, "later": 1500, "latest": 2500, "falling": 9000, "lost": 0}
    asked: list[tuple[int, list[str]]] = []

    def traces_to(ceiling: int, pending: list[str]) -> list[stopping.Trace]:
        asked.append((ceiling, list(pending)))
        return [[(10, math.nan)] if key == "lost" else curve(bests[key], ceiling) for key in pending]

    stops = choose_stops(traces_to, list(bests))
    assert asked == [
        (1000, ["inside", "later", "latest", "falling", "lost"]),
        (2000, ["later", "latest", "falling"]),
        (4000, ["latest", "falling"]),
    ]
    assert list(stops) == list(bests)
    assert stops["inside"] == Stop(370, 0.5, 1000) and stops["later"] == Stop(1500, 0.5, 2000)
    assert stops["latest"] == Stop(2500, 0.5, 4000)
    assert (stops["falling"].round, stops["falling"].ceiling) == (4000, 4000)
    assert stops["falling"].limits == ("rounds 4000 is its ladder's end: the curve was still falling there",)
    assert stops["lost"].round is None and stops["lost"].ceiling == 1000
    # Each point's stop is the one it gets alone.
    for key, best in bests.items():
        if key != "lost":
            assert choose_stop(lambda ceiling, best=best: curve(best, ceiling)) == stops[key], key


def test_a_curve_falling_at_the_top_of_the_ladder_says_so() -> None:
    stop = choose_stop(lambda ceiling: curve(250, ceiling), ceilings=(100, 200))
    assert (stop.round, stop.ceiling) == (200, 200)
    assert stop.limits == ("rounds 200 is its ladder's end: the curve was still falling there",)


def test_a_run_diverging_before_its_ceiling_stops_inside_it_and_one_diverged_throughout_says_so() -> None:
    early = [(10, 0.7), (20, 0.6), (30, math.nan)]  # the run failed at round 30 of its 1,000
    assert choose_stop(lambda ceiling: early) == Stop(20, 0.6, 1000)
    lost = choose_stop(lambda ceiling: [(10, math.nan)])
    assert lost.round is None and math.isnan(lost.risk) and lost.limits == ("every checkpoint to round 1000 diverged",)
    with pytest.raises(ConfigError, match="ascending ladder"):
        choose_stop(lambda ceiling: early, ceilings=(2000, 1000))


def test_each_checkpoint_is_the_suffix_mean_a_run_of_that_many_rounds_outputs() -> None:
    # Iterates theta^t = t (one coordinate): a run of T rounds averaged from int(0.5 T) outputs the mean of
    # int(0.5 T) + 1, ..., T, which is (int(0.5 T) + 1 + T) / 2.
    seen: dict[int, float] = {}
    record = stopping.checkpoints(0.5, 10, 50, lambda t, theta: seen.__setitem__(t, float(theta[0])))
    for finished in range(1, 51):  # after round t the state holds theta^{t+1}
        theta = torch.tensor([float(finished + 1)], dtype=torch.float64)
        record(ServerState(finished, theta, 0.0, theta, 0.0, 0))
    assert seen == {t: (t // 2 + 1 + t) / 2 for t in (10, 20, 30, 40, 50)}
    with pytest.raises(ConfigError, match="would average the start model in"):
        stopping.checkpoints(0.0, 10, 50, lambda t, theta: None)


def test_a_candidate_is_outrun_only_when_clearly_worse_at_the_same_round() -> None:
    # The incumbent's lowest to round 250 is its round-250 checkpoint, 0.5 + (250 / 1000)^2 = 0.5625 (its U-curve
    # bottoms at round 500); the lowest of a candidate shifted up by `lift` is 0.5625 + lift over the same rounds.
    incumbent = curve(500, 1000)
    assert stopping.lowest_until(incumbent, 250) == pytest.approx(0.5625)

    def lifted(lift: float) -> stopping.Trace:
        return [(round_number, risk + lift) for round_number, risk in curve(500, 250)]

    assert not stopping.outrun(lifted(0.09), incumbent, 250, margin=0.1)
    assert stopping.outrun(lifted(0.11), incumbent, 250, margin=0.1)
    # Judged to the same round: the incumbent's later, lower checkpoints do not count against the candidate.
    assert not stopping.outrun(lifted(0.0), incumbent, 250, margin=0.0)
    # A candidate diverged at every checkpoint so far is outrun; one that diverged only once is judged on the rest.
    assert stopping.outrun([(10, math.nan), (20, math.inf)], incumbent, 250, margin=0.1)
    assert not stopping.outrun([(10, math.nan), (20, 0.6)], incumbent, 250, margin=0.1)


def test_pruning_refuses_a_negative_margin_and_an_incumbent_without_a_finite_checkpoint() -> None:
    with pytest.raises(ConfigError, match="margin"):
        stopping.outrun(curve(500, 250), curve(500, 1000), 250, margin=-0.1)
    with pytest.raises(ConfigError, match="no finite checkpoint up to round 250"):
        stopping.outrun(curve(500, 250), [(10, math.nan), (300, 0.5)], 250, margin=0.1)
