"""round_compare --paired (benchmarks/round_paired.py): two trees' secure rounds in lock-step, round by round.

The lock-step run is real (two round_bench processes, each a federation over loopback mutual TLS, taking turns on
pipes); its CPU figures are not asserted against a speed (that lives in the results JSON), only the properties the
paired measure rests on: the trees' rounds never overlap and run in ABBA order, every party is accounted in every
round, and a round's party CPU is part of its process's."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def round_paired() -> Iterator[ModuleType]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import round_paired

        yield round_paired
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_median_interval_is_the_sign_tests_order_statistics_at_their_exact_coverage(
    round_paired: ModuleType,
) -> None:
    values = [1.0 + 0.01 * index for index in (7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 6, 4)]
    interval = round_paired.median_interval(values)
    # 12 pairs: the 3rd and 10th ratios, covering 1 - 2 P(B <= 2), B ~ Binomial(12, 1/2) = 1 - 2 * 79 / 4096.
    assert (interval["low"], interval["high"]) == (1.02, 1.09)
    assert interval["coverage"] == pytest.approx(1 - 2 * (1 + 12 + 66) / 4096)
    # 10 pairs: the 2nd and 9th (97.9%); the 3rd and 8th would cover only 89.1%.
    assert round_paired.median_interval(values[:10]) == {
        "low": 1.01,
        "high": 1.10,
        "coverage": pytest.approx(1 - 2 * 11 / 1024),
    }
    # Too few pairs for 95%: the whole range, and the coverage it has (1 - 2 / 32).
    assert round_paired.median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == {
        "low": 1.0,
        "high": 5.0,
        "coverage": pytest.approx(0.9375),
    }


def test_the_trees_take_turns_abba(round_paired: ModuleType) -> None:
    orders = [round_paired.first_then_second(["head", "reference"], number) for number in range(1, 5)]
    assert orders == [["head", "reference"], ["reference", "head"], ["head", "reference"], ["reference", "head"]]


@pytest.mark.slow
def test_two_trees_in_lock_step_never_overlap_and_account_every_party_in_every_round(
    round_paired: ModuleType,
) -> None:
    """This tree against itself at the smallest size: 1 warm-up, 3 measured and 1 last round each."""
    rounds, parties = 3, 3
    documents = round_paired.lock_step(1000, parties, {"head": ROOT, "reference": ROOT}, rounds)
    spans = []
    for name, document in documents.items():
        accounts = document["rounds"]["secure"]
        assert sorted(map(int, accounts)) == list(range(1, rounds + 3)), name
        for number, account in accounts.items():
            assert len(account["parties"]) == parties, (name, number)
            party_cpu = sum(party["cpu_seconds"] for party in account["parties"].values())
            # Every party is a thread of this process, and its work on the round lies inside the round's turn.
            assert 0 < party_cpu <= account["process"]["cpu_seconds"], (name, number)
            assert all(
                party["user_seconds"] > 0 and party["minor_faults"] >= 0 for party in account["parties"].values()
            )
            spans.append((*account["process"]["span"], name, int(number)))
    spans.sort()
    # One tree's round at a time: each ends before the next begins, in ABBA order.
    assert all(earlier[1] <= later[0] for earlier, later in zip(spans, spans[1:]))
    assert [(name, number) for *_, name, number in spans] == [
        (name, number)
        for number in range(1, rounds + 3)
        for name in round_paired.first_then_second(["head", "reference"], number)
    ]
    # Two runs' worth of pairs: the same documents twice, the second as if the reference had started.
    result = round_paired.compared([documents, dict(reversed(documents.items()))], rounds)
    assert result["first_in_pair"] == ["reference", "head", "reference", "head", "reference", "head"]
    for ratio in round_paired.RATIOS:
        each = result[f"secure_{ratio}_ratios"]
        assert len(each) == 2 * rounds and all(math.isfinite(value) and value > 0 for value in each), ratio
        assert each[:rounds] == each[rounds:], ratio  # pairs are head over reference whichever started
        interval = result[f"secure_{ratio}_ratio_interval"]
        assert interval["low"] <= result[f"secure_{ratio}_ratio"] <= interval["high"]
        assert result[f"secure_{ratio}_ratio_each_run"] == [result[f"secure_{ratio}_ratio"]] * 2, ratio
    assert result["steps"]["MASK"]["head"] > 0 and result["steps"]["MASK"]["reference"] > 0
