"""The attack rows' process budgets stretch with the machine's load, within bounds (issue 79)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from attacks.patience import MOST_STRETCH, patient, stretch  # noqa: E402 -- benchmarks/ is not a package


@pytest.mark.parametrize(
    ("load", "cpus", "factor"),
    [(0.0, 2, 1.0), (1.9, 2, 1.0), (2.0, 2, 1.0), (5.0, 2, 2.5), (8.0, 2, MOST_STRETCH), (80.0, 2, MOST_STRETCH)],
)
def test_a_budget_stretches_by_the_load_per_cpu_within_bounds(load: float, cpus: int, factor: float) -> None:
    assert stretch(load, cpus) == factor


def test_the_budget_now_is_the_idle_budget_stretched_by_the_load_now() -> None:
    cpus = len(os.sched_getaffinity(0))
    before = os.getloadavg()[0]
    budget = patient(180.0)
    after = os.getloadavg()[0]
    low, high = sorted(min(MOST_STRETCH, max(1.0, load / cpus)) for load in (before, after))
    assert 180.0 * low <= budget <= 180.0 * high  # the load may move between the reads
