"""round_bench, which drives the real runtime and which no other test runs, still runs: at its
smallest size, as a subprocess, as `make bench` would run it. Its figures are not asserted (speed
lives in the benchmarks' JSON), only that it finishes and reports finite ratios, so a change to
the runtime cannot break it silently until the next time someone measures."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize(("processes", "pairs"), [(False, 2), (True, 1)], ids=["threads-2-pairs", "processes"])
def test_round_bench_runs_a_plain_and_a_secure_round_through_the_runtime(
    tmp_path: Path, processes: bool, pairs: int
) -> None:
    out = tmp_path / "round.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "round_bench.py"), "--rounds", "1", "--pairs", str(pairs)]
    command += ["--dimensions", "1000", "--parties", "3", "--json", str(out)] + ["--processes"] * processes
    subprocess.run(command, check=True, timeout=300, capture_output=True)
    results = json.loads(out.read_text())["results"]
    assert [(result["processes"], result["runs"]) for result in results] == [(processes, pairs)] * 2
    plain, secure = results
    # Every pair's measured round is pooled: one round per federation here.
    assert len(plain["round_seconds_all"]) == len(secure["round_seconds_all"]) == pairs
    assert math.isfinite(secure["ratio_to_plain"]) and secure["ratio_to_plain"] > 0
    assert math.isfinite(secure["party_ratio_to_plain"]) and secure["party_ratio_to_plain"] > 0
    assert len(secure["pair_ratios"]) == pairs
    assert all(math.isfinite(ratio["whole_round"]) and ratio["whole_round"] > 0 for ratio in secure["pair_ratios"])


def test_a_party_critical_path_counts_overlapping_intervals_once() -> None:
    """round_bench's per-party time is the union of its threads' busy intervals (job and handlers)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from round_bench import covered
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    @given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20)), max_size=12))
    def matches_the_covered_cells(spans: list[tuple[int, int]]) -> None:
        intervals = [(float(start), float(start + length)) for start, length in spans]
        cells = {cell for start, length in spans for cell in range(start, start + length)}
        assert covered(intervals) == len(cells)

    matches_the_covered_cells()
    assert covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0
