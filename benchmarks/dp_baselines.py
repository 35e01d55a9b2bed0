"""Which runs train each baseline under the same distributed DP, and which axes its search moves (`dp_stretch`).

A baseline FedSRCVaR holds as a limit case is trained as FedSRCVaR's runs at that limit; TERM, PropFair and
Delta-FL are trained as their own DP methods and searched over their own axes. Either way the local steps are held
at 1, since distributed DP sums one clipped local step a round.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fedfair.research import tuning
from fedfair.research.study import Point, Study, ladder_point

NESTED_BASELINES = {
    "fedavg": {tuning.MOMENTUM.name: 0.0, tuning.EPSILON.name: 1.0, tuning.GAMMA.name: tuning.GAMMA.start[0]},
    "fedavgm": {tuning.EPSILON.name: 1.0, tuning.GAMMA.name: tuning.GAMMA.start[0]},
}
"""The baselines FedSRCVaR holds as limit cases (`tuning.NESTED`), each as the values it fixes on FedSRCVaR's axes:
at epsilon 1 FedSRCVaR is FedAvgM (gamma then weighs nothing), at momentum 0 too FedAvg. Under the same
distributed DP each is trained as FedSRCVaR's runs at that limit: the same clipping, noise and secure sum."""


OWN_SEARCH_BASELINES = ("term", "propfair", "deltafl")
"""The baselines trained under the same distributed DP as their own method (`fedfair.research.term_dp`), each
chosen by its own search over its axes but the local steps (held at 1)."""


PLAIN_SERVER_STEP = {tuning.MOMENTUM.name: 0.0}
"""`--plain-server-step`: a baseline's search with the momentum held at 0, its paper's plain averaging step and the
choice under DP of FedAvg and TERM on Adult, for a search the machine cannot afford whole (half the start points)."""

HELD_LIMIT = "{} held at {:g} to fit the machine: the search did not move it"
"""The limit a search states for each axis it held (`baseline_under_dp`'s `held`)."""


@dataclasses.dataclass(frozen=True)
class BaselineSearch:
    """How a baseline is trained and searched under DP: the method whose runs train it, the axes its search moves,
    the values it fixes on that method's other axes (a limit case's), and the method's axes but the local steps."""

    method: str
    free: tuple[tuning.Axis, ...]
    fixed: dict[str, float]
    axes: tuple[tuning.Axis, ...]

    def point_of(self, coordinates: tuning.Coordinates) -> Point:
        """The run's point at `coordinates` of the free axes."""
        values = dict(zip((axis.name for axis in self.free), coordinates, strict=True)) | self.fixed
        return ladder_point(self.method, self.axes, tuple(values[axis.name] for axis in self.axes))


def baseline_search(study: Study, baseline: str, held: Mapping[str, float] | None = None) -> BaselineSearch:
    """`baseline`'s search under DP: FedSRCVaR's runs at its limit (`NESTED_BASELINES`, the axes left free) or its
    own runs over its own axes (`OWN_SEARCH_BASELINES`), the local steps held at 1 either way, and the axes `held`
    (a search cut to fit the machine: `PLAIN_SERVER_STEP`) at their values."""
    method = "fedsrcvar" if baseline in NESTED_BASELINES else baseline
    fixed = {**NESTED_BASELINES.get(baseline, {}), **(held or {})}
    axes = tuple(axis for axis in study.search(method).axes if axis is not tuning.LOCAL_STEPS)
    return BaselineSearch(method, tuple(axis for axis in axes if axis.name not in fixed), fixed, axes)
