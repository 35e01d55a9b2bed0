"""The tuning protocol of `fedfair reproduce --profile tuned`: one set of ladders for all, and the edge rule.

Every knob is an `Axis`: an ascending ladder of values, the values the search starts from, and what each end
is (a stated limit: epsilon 1 is ERM, momentum 0 the plain step). The shared knobs (step, local steps, server
momentum) are the same axes for every method, in absolute units, whatever the method's curvature. A `Search`
starts from the product of the starting values and applies the edge rule: while the choice (lowest
validation worst-group risk) has an untried ladder neighbour on some axis, it tries those and chooses again,
until every neighbour was tried (the choice sits on no edge), a neighbour lies past a ladder end (a bound),
or the method's extension runs are spent; a diverged neighbour counts as tried. `limits` states which. A method
that holds another as a limit case (`NESTED`) is also seeded with that method's choice. Why: docs/paper.md, "The tuning protocol".

Every ladder is as fine as the step's (`WIDEST_GAP`), so no knob is chosen for want of a rung.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from fedfair.core.errors import ConfigError
from fedfair.research.fronts import DIVERGED_RISK

WIDEST_GAP = 10 / 3
"""The largest ratio of adjacent positive rungs any ladder may have: the step ladder's 0.3 to 1, the 1-3 series'.

A knob whose ladder lies in [0, 1] (epsilon, momentum, the client level) obeys it on both w and 1 - w, since it
acts through both (epsilon weighs the mean by w and the tail by 1 - w; momentum remembers 1 / (1 - beta)
rounds); a zero on either scale is the knob's limit case, one rung from the nearest positive value. Why: issue 78,
where epsilon's {0.2, 1} gap hid 0.5 (docs/paper.md, "The tuning protocol")."""

Coordinates = tuple[float, ...]
"""One point of a search: a value per axis, in the order of the search's axes."""


@dataclass(frozen=True)
class Axis:
    """One knob: the values the protocol may try (ascending), those it starts from, and what its ends are."""

    name: str
    ladder: tuple[float, ...]
    start: tuple[float, ...]
    below: str
    """What the ladder's lowest value is, said where a choice stops there (e.g. "the plain server step")."""
    above: str
    """What the ladder's highest value is."""

    def __post_init__(self) -> None:
        """Refuse a ladder that is empty or not strictly ascending, and a start off the ladder."""
        if not self.ladder or any(low >= high for low, high in itertools.pairwise(self.ladder)):
            raise ConfigError(f"axis {self.name}: the ladder must be strictly ascending, got {self.ladder}")
        if not self.start or not set(self.start) <= set(self.ladder):
            raise ConfigError(f"axis {self.name}: the start {self.start} must be values of the ladder {self.ladder}")

    def neighbours(self, value: float) -> tuple[float | None, float | None]:
        """The ladder's values next below and next above `value` (None past an end)."""
        index = self.ladder.index(value)
        below = self.ladder[index - 1] if index > 0 else None
        above = self.ladder[index + 1] if index + 1 < len(self.ladder) else None
        return below, above

    def widest_gap(self) -> float:
        """The largest ratio of adjacent positive rungs, on w and, for a ladder inside [0, 1], on 1 - w too.

        `WIDEST_GAP` bounds it for every ladder of the protocol; a zero rung on a scale (a limit case) is left out.
        """
        scales = [self.ladder]
        if 0.0 <= self.ladder[0] and self.ladder[-1] <= 1.0:
            scales.append(tuple(sorted(1.0 - value for value in self.ladder)))
        ratios = [
            high / low for scale in scales for low, high in itertools.pairwise(value for value in scale if value > 0.0)
        ]
        return max(ratios, default=1.0)

    def describe(self) -> str:
        """The ladder and its start in words, for the tables, e.g. ``{0, 0.7, 0.9, 0.97} from {0, 0.9}``."""
        return (
            f"{{{', '.join(f'{value:g}' for value in self.ladder)}}} from {{{', '.join(f'{v:g}' for v in self.start)}}}"
        )


class Step(NamedTuple):
    """One rung from a choice along one axis, down or up: a neighbour the edge rule looks at."""

    axis: Axis
    position: int
    """The axis's place among the search's axes (and in its coordinates)."""
    end: str
    """What the ladder's end that way is (`Axis.below` or `Axis.above`)."""
    point: Coordinates | None
    """The choice with its value on `axis` one rung along; None past the ladder's end."""


def diverged(risk: float) -> bool:
    """Whether a validation worst-group risk says the run diverged (not finite, or above `DIVERGED_RISK`)."""
    return not math.isfinite(risk) or risk > DIVERGED_RISK


@dataclass
class Search:
    """One method's search at one rho under the edge rule: what was tried, what it chose, why it stopped.

    `extension_runs` bounds the runs tried after the starting grid (the same for every method).
    """

    axes: tuple[Axis, ...]
    extension_runs: int
    tried: dict[Coordinates, float] = field(default_factory=dict)
    """Every point tried, in the order tried, with its validation worst-group risk (NaN: diverged)."""
    rounds: int = 0
    """How many times the search extended its grid."""
    round_of: dict[Coordinates, int] = field(default_factory=dict)
    """The round each point was tried in: 0 the starting grid, k the k-th extension."""
    seeds: dict[Coordinates, str] = field(default_factory=dict)
    """Points added to the start after it, each with where it came from (`seed`)."""

    def start(self) -> list[Coordinates]:
        """The starting grid: the product of the axes' starting values (the last axis varying fastest)."""
        return [tuple(values) for values in itertools.product(*(axis.start for axis in self.axes))]

    @property
    def budget(self) -> int:
        """The validation runs the search may use: its starting grid, its seeds and its extension runs."""
        return len(self.start()) + len(self.seeds) + self.extension_runs

    def seed(self, point: Coordinates, origin: str) -> bool:
        """Add `point` (from `origin`, e.g. "FedAvgM's choice") to what the search tries; False if tried already.

        A seed is tried before any further neighbour and adds one run to the budget, so that it never takes
        an extension run from the method.

        Raises:
            ConfigError: `point` is off this search's ladders.
        """
        for axis, value in zip(self.axes, point, strict=True):
            if value not in axis.ladder:
                raise ConfigError(f"seed {point} from {origin}: {axis.name} {value:g} is not on its ladder")
        if point in self.tried or point in self.seeds:
            return False
        self.seeds[point] = origin
        return True

    def choice(self) -> Coordinates:
        """The tried point with the lowest validation risk (ties: the first tried; a diverged one never wins).

        Raises:
            ConfigError: nothing was tried yet.
        """
        if not self.tried:
            raise ConfigError("the search has tried nothing yet: record its starting grid first")
        finite = [(risk, index) for index, risk in enumerate(self.tried.values()) if not diverged(risk)]
        best = min(finite)[1] if finite else 0
        return list(self.tried)[best]

    def wanted(self) -> list[Coordinates]:
        """The points to try next: the starting grid, then the untried ladder neighbours of the choice.

        Empty when the search is done: every neighbour tried or past an end, every point diverged, or the
        extension runs spent (the last are cut to what is left of them).
        """
        if not self.tried:
            return self.start()
        seeds = [point for point in self.seeds if point not in self.tried]
        if all(diverged(risk) for risk in self.tried.values()):
            return seeds
        left = self.budget - len(self.tried) - len(seeds)
        neighbours = [point for point in self._untried_neighbours() if point not in seeds]
        return seeds + neighbours[: max(left, 0)]

    def _untried_neighbours(self) -> list[Coordinates]:
        wanted: list[Coordinates] = []
        for step in self._steps(self.choice()):
            if step.point is not None and step.point not in self.tried and step.point not in wanted:
                wanted.append(step.point)
        return wanted

    def _steps(self, chosen: Coordinates) -> Iterator[Step]:
        """One rung from `chosen` down, then up, each axis in turn: the edge rule's neighbours of a choice."""
        for index, axis in enumerate(self.axes):
            for neighbour, end in zip(axis.neighbours(chosen[index]), (axis.below, axis.above), strict=True):
                point = None if neighbour is None else (*chosen[:index], neighbour, *chosen[index + 1 :])
                yield Step(axis, index, end, point)

    def record(self, risks: Mapping[Coordinates, float]) -> None:
        """Keep the validation risks of points tried (a point tried before is refused: the budget counts runs)."""
        again = [point for point in risks if point in self.tried]
        if again:
            raise ConfigError(f"points {again} were tried already")
        if self.tried:
            self.rounds += 1
        self.tried.update(risks)
        self.round_of.update(dict.fromkeys(risks, self.rounds))

    @property
    def settled(self) -> bool:
        """Whether every ladder neighbour of the choice on every axis was tried (or lies past an end)."""
        return bool(self.tried) and not self._untried_neighbours()

    def limits(self) -> list[str]:
        """Why the choice is not strictly inside finite neighbours on every axis, one clause each (empty: it is).

        A clause names an end of an axis's ladder the choice sits on (and what that end is), a neighbour that
        diverged, the search stopped with its extension runs spent, or every point diverged.
        """
        if all(diverged(risk) for risk in self.tried.values()):
            return [f"every one of its {len(self.tried)} points diverged"]
        chosen = self.choice()
        clauses: list[str] = []
        for step in self._steps(chosen):
            if step.point is None:
                clauses.append(f"{step.axis.name} {chosen[step.position]:g} is its ladder's end ({step.end})")
            elif step.point in self.tried and diverged(self.tried[step.point]):
                clauses.append(f"{step.axis.name} {step.point[step.position]:g} diverged")
        if not self.settled:
            clauses.append(f"unsettled: its {self.extension_runs} extension runs were spent")
        return clauses


def settle(searches: Sequence[Search], evaluate: Callable[[list[tuple[int, Coordinates]]], Sequence[float]]) -> None:
    """Run every search to its end, each round's wanted points of all searches evaluated together.

    `evaluate` takes (search index, point) pairs and returns each one's validation worst-group risk, in order;
    one call per round lets a pool train the points of every search at once.
    """
    while True:
        asked = [(index, point) for index, search in enumerate(searches) for point in search.wanted()]
        if not asked:
            return
        risks = evaluate(asked)
        for index, search in enumerate(searches):
            found = {point: risk for (owner, point), risk in zip(asked, risks, strict=True) if owner == index}
            if found:
                search.record(found)


# ---------------------------------------------------------------- the ladders

STEP = Axis(
    "step",
    (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0),
    (1e-3, 0.01, 0.1),
    below="the ladder's floor: 200 rounds at 1e-05 barely move any model from its start",
    above="the ladder's cap: plain SGD at 3 diverges on every dataset's model",
)
"""The step s every method takes, absolute: `--lr` and `--threshold-lr` are s, times min(1, 2.5 (1 - beta)) under
server momentum beta (the same effective-step rule for every method). The ladder is the 1-3 series."""
LOCAL_STEPS = Axis(
    "local steps",
    (1.0, 3.0, 8.0, 15.0),
    (1.0, 3.0),
    below="one local step a round",
    above="15 local steps, the full profile's most",
)
MOMENTUM = Axis(
    "server momentum",
    (0.0, 0.7, 0.9, 0.97),
    (0.0, 0.9),
    below="the plain server step",
    above="0.97, the top of the range Hsu et al. found useful below 0.99",
)
EPSILON = Axis(
    "epsilon",
    (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
    (0.01, 1.0),
    below="epsilon 0 is CVaR alone",
    above="epsilon 1 is ERM",
)
GAMMA = Axis(
    "gamma",
    (0.001, 0.003, 0.01, 0.03, 0.1),
    (0.01,),
    below="the ladder's floor, 0.001",
    above="the ladder's cap, 0.1 (twice the default)",
)
TILT = Axis(
    "tilt",
    (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0),
    (1.0, 100.0),
    below="the ladder's floor: t 0.1 is near FedAvg",
    above="the ladder's cap: at t 1000 the tilted risk is within ln(n) / 1000 of the largest loss",
)
CEILING = Axis(
    "ceiling",
    (1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 100.0),
    (3.0, 10.0),
    below="the ladder's floor: M 1 is near the losses of a model at its start",
    above="the ladder's cap: at M 100 every client weighs about alike, FedAvg",
)
LEVEL = Axis(
    "client level",
    (0.1, 0.2, 0.3, 0.5, 0.7, 1.0),
    (0.1, 0.5),
    below="the ladder's floor: at 0.1 the tail is the worst client alone on 3 to 10 sites",
    above="level 1 is FedAvg",
)
ADVERSARY = Axis(
    "adversary step",
    (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0),
    (0.1, 1.0, 10.0),
    below="the ladder's floor, 0.01",
    above="the ladder's cap, 100",
)
EXTENSION_RUNS = 24
"""The runs each method's search may add to its starting grid, the same for every method and rho."""


OWN_AXES: dict[str, tuple[Axis, ...]] = {
    "fedsrcvar": (EPSILON, GAMMA),
    "term": (TILT,),
    "propfair": (CEILING,),
    "deltafl": (LEVEL,),
    "bpf": (ADVERSARY,),
    "fedminmax": (ADVERSARY,),
}
"""Each method's own knobs; a method not named here is tuned over the shared knobs alone (AFL's mixture step,
q-FedAvg's q and the central yardsticks' settings stay at their defaults)."""


def axes_of(method: str, local_steps: bool, momentum: bool) -> tuple[Axis, ...]:
    """`method`'s axes: the step, the local steps and the momentum where it takes them, then its own knobs."""
    shared = (STEP, *((LOCAL_STEPS,) if local_steps else ()), *((MOMENTUM,) if momentum else ()))
    return (*shared, *OWN_AXES.get(method, ()))


class Nesting(NamedTuple):
    """A method holds `inner` as a limit case: `inner`'s point, with `limit`'s values on the axes `inner` lacks."""

    inner: str
    limit: Mapping[str, float]


NESTED: dict[str, tuple[Nesting, ...]] = {
    "fedavgm": (Nesting("fedavg", {MOMENTUM.name: 0.0}),),
    "fedsrcvar": (
        Nesting("fedavg", {MOMENTUM.name: 0.0, EPSILON.name: 1.0, GAMMA.name: GAMMA.start[0]}),
        Nesting("fedavgm", {EPSILON.name: 1.0, GAMMA.name: GAMMA.start[0]}),
    ),
    "deltafl": (
        Nesting("fedavg", {MOMENTUM.name: 0.0, LEVEL.name: 1.0}),
        Nesting("fedavgm", {LEVEL.name: 1.0}),
    ),
}
"""Which methods each method holds at an end of its own ladders: FedAvgM at momentum 0 is FedAvg, FedSRCVaR at
epsilon 1 is FedAvgM (gamma then weighs nothing), Delta-FL at level 1 is FedAvgM (to rounding). Why: a search
that can reach its inner method's choice must not lose to it on validation for want of trying it."""


def nested_point(axes: Sequence[Axis], inner_axes: Sequence[Axis], inner: Coordinates, nesting: Nesting) -> Coordinates:
    """The point on `axes` that is `inner` (a point on `inner_axes`) with `nesting.limit` on the axes it lacks.

    Raises:
        ConfigError: an axis of `axes` is neither among `inner_axes` nor in the limit.
    """
    values = dict(zip((axis.name for axis in inner_axes), inner, strict=True)) | dict(nesting.limit)
    missing = [axis.name for axis in axes if axis.name not in values]
    if missing:
        raise ConfigError(f"the nesting of {nesting.inner} names no value for the axes {missing}")
    return tuple(values[axis.name] for axis in axes)
