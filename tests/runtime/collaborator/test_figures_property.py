"""Property: a kept bundle carries no evaluation figure its site did not verify, whatever the aggregator changed.

The aggregator writes each evaluation's record into the bundle's metrics; a site that verified the evaluation's
sums makes the same figures itself (runtime/evaluation_figures.py) and holds the bundle to them
(collaborator/figures.py). Whatever is changed in the metrics (any figure, nested or not, by an ulp, to NaN, to
another type; a figure removed or added; a record's status or round), the site either refuses the bundle or
keeps, of each evaluation, exactly the record it verified or none of its figures. The comparison is exact: both
sides compute the figures with the same functions from the same decoded sum, so an honest record is equal to the
site's, and nothing else passes for it (a number compares by value, so 3 and 3.0 are the same figure).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from fedfair.runtime.collaborator.figures import NOTES, EvaluationFigures
from fedfair.runtime.plan.aggregator_plan import load_shared_settings, shared_settings
from tests.runtime.collaborator.test_figures import evaluated
from tests.runtime.test_plan import NO_NOISE, aggregator_plan

ROUNDS = (2, 4)
"""The evaluated rounds of the plan (every 2 of 4)."""

Metrics = list[dict[str, Any]]
Place = tuple[int, tuple[str | int, ...]]
"""Where a figure is: the metrics entry's index, then the keys and indices inside its evaluation record."""


class Verified:
    """A site that verified every evaluation of a plan, and the bundle metrics an honest aggregator writes."""

    def __init__(self, privacy: dict[str, Any]) -> None:
        plan = aggregator_plan(privacy=privacy, evaluation={"every": 2}, training={"rounds": 4})
        self.site = EvaluationFigures("site-a", load_shared_settings(shared_settings(plan)), None, 2)
        self.metrics: Metrics = [
            {"round": number, "status": "applied", "evaluation": evaluated(plan, self.site, number)}
            for number in ROUNDS
        ]
        assert self.site.check(self.metrics).metrics == self.metrics  # the premise: an honest bundle is kept


def places(metrics: Metrics) -> list[Place]:
    """Every figure of every record of `metrics`: each leaf of the nested records, with its place."""
    found: list[Place] = []

    def walk(index: int, value: Any, at: tuple[str | int, ...]) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(index, inner, (*at, key))
        elif isinstance(value, list):
            for position, inner in enumerate(value):
                walk(index, inner, (*at, position))
        else:
            found.append((index, at))

    for index, entry in enumerate(metrics):
        walk(index, entry["evaluation"], ())
    return found


@pytest.fixture(scope="module", params=[NO_NOISE, {}], ids=["exact", "noised"])
def federation(request: pytest.FixtureRequest) -> Verified:
    return Verified(request.param)


Change = Callable[[Metrics, list[Place]], None]


def changed_leaf(pick: int, new: Callable[[Any], Any]) -> Change:
    """The figure at place `pick` (of all the records' leaves) replaced by `new(old)`."""

    def change(metrics: Metrics, paths: list[Place]) -> None:
        index, at = paths[pick % len(paths)]
        holder = metrics[index]["evaluation"]
        for step in at[:-1]:
            holder = holder[step]
        if at:
            holder[at[-1]] = new(holder[at[-1]])

    return change


def ulps(count: int) -> Callable[[Any], Any]:
    """A number moved `count` float64 ulps (up or down); anything else made a number."""

    def new(old: Any) -> Any:
        value = float(old) if isinstance(old, (int, float)) and not isinstance(old, bool) else 0.0
        for _ in range(abs(count)):
            value = float(np.nextafter(value, math.copysign(math.inf, count)))
        return value

    return new


def removed(pick: int) -> Change:
    """The figure at place `pick` removed from its record (a key, or a list's item)."""

    def change(metrics: Metrics, paths: list[Place]) -> None:
        index, at = paths[pick % len(paths)]
        holder = metrics[index]["evaluation"]
        for step in at[:-1]:
            holder = holder[step]
        del holder[at[-1]]  # type: ignore[arg-type]

    return change


def added(index: int, key: str, value: Any) -> Change:
    """A figure `key` = `value` added to the evaluation record of entry `index`."""

    def change(metrics: Metrics, paths: list[Place]) -> None:
        metrics[index % len(metrics)]["evaluation"][key] = value

    return change


def restated(index: int, status: str) -> Change:
    """The evaluation record of entry `index` given another status, its figures left in it."""

    def change(metrics: Metrics, paths: list[Place]) -> None:
        metrics[index % len(metrics)]["evaluation"]["status"] = status

    return change


def swapped() -> Change:
    """The two evaluations' records exchanged: each a true record, of the other round."""

    def change(metrics: Metrics, paths: list[Place]) -> None:
        metrics[0]["evaluation"], metrics[1]["evaluation"] = metrics[1]["evaluation"], metrics[0]["evaluation"]

    return change


ANY = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**6), 10**6),
    st.text(max_size=8),
    st.booleans(),
    st.none(),
)
PLACE = st.integers(0, 10**6)
CHANGES = st.one_of(
    st.builds(changed_leaf, PLACE, st.builds(ulps, st.integers(1, 4) | st.integers(-4, -1))),
    st.builds(changed_leaf, PLACE, ANY.map(lambda value: lambda old: value)),
    st.builds(changed_leaf, PLACE, st.sampled_from([math.nan, math.inf, -math.inf]).map(lambda v: lambda old: v)),
    st.builds(changed_leaf, PLACE, st.just(lambda old: json.dumps(old))),  # the same figure as a string
    st.builds(removed, PLACE),
    st.builds(added, st.integers(0, 1), st.sampled_from(["best_risk", "worst_risk", "figure", "accuracy"]), ANY),
    st.builds(restated, st.integers(0, 1), st.sampled_from(["skipped", "aborted", "Done", "done ", "verified"])),
    st.just(swapped()),
)


def normal(metrics: Metrics) -> Any:
    """The metrics as JSON reads them back: what a bundle carries, compared exactly (NaN unequal to itself)."""
    return json.loads(json.dumps(metrics))


def verified_or_none(federation: Verified, kept: Metrics) -> list[str]:
    """Each kept evaluation record that is neither one the site verified for its round nor free of figures."""
    ours = {entry["round"]: entry["evaluation"] for entry in federation.metrics}
    wrong = []
    for entry in kept:
        record = entry.get("evaluation")
        if not isinstance(record, dict):
            continue
        if record == {"status": "done", **{k: v for k, v in ours[entry["round"]].items() if k != "status"}}:
            continue
        figures = set(record) - {*NOTES, "reason"}
        if figures:
            wrong.append(f"round {entry['round']}: {sorted(figures)} kept in a record it did not verify: {record}")
    return wrong


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(CHANGES, min_size=1, max_size=3))
def test_any_change_to_a_figure_is_refused_or_kept_out_of_the_bundle(
    federation: Verified, changes: list[Change]
) -> None:
    metrics = copy.deepcopy(federation.metrics)
    for change in changes:
        change(metrics, places(metrics))  # each change to the metrics as the ones before left them
    stated = normal(metrics)
    assume(stated != normal(federation.metrics))
    checked = federation.site.check(stated)
    if checked.forged is not None:
        assert checked.metrics == [] and "evaluation: round" in checked.forged
        return
    assert verified_or_none(federation, checked.metrics) == []
    # A record left out says why, and only where a figure was changed.
    assert set(checked.left_out) <= set(ROUNDS)


def test_the_property_sees_a_kept_forged_figure(federation: Verified) -> None:
    """The property's own check can fail: the forged 0.05 kept as it was stated is named."""
    forged = copy.deepcopy(federation.metrics)
    forged[1]["evaluation"]["worst_risk"] = 0.05
    assert verified_or_none(federation, forged) != []
    assert verified_or_none(federation, federation.metrics) == []


def test_what_the_property_found_is_refused_naming_the_round(federation: Verified) -> None:
    """Before: a record marked other than done was kept with its figures, and a figure added as null crashed the
    check (IndexError) instead of refusing the bundle."""
    restamped = copy.deepcopy(federation.metrics)
    restamped[0]["evaluation"].update(status="skipped", worst_risk=0.05)
    checked = federation.site.check(restamped)
    assert checked.forged is not None and checked.metrics == []
    assert 'round 2\'s record is "skipped", not done, yet carries' in checked.forged and "worst_risk" in checked.forged
    nulled = copy.deepcopy(federation.metrics)
    nulled[1]["evaluation"]["figure"] = None
    checked = federation.site.check(nulled)
    assert checked.forged is not None and "round 4's figure is null in the bundle, but absent" in checked.forged
    honest_skip = [{"round": 2, "evaluation": {"status": "skipped", "reason": "too few collaborators connected"}}]
    assert federation.site.check(honest_skip).metrics == honest_skip
