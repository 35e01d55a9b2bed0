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

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize("processes", [False, True], ids=["threads", "processes"])
def test_round_bench_runs_a_plain_and_a_secure_round_through_the_runtime(tmp_path: Path, processes: bool) -> None:
    out = tmp_path / "round.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "round_bench.py"), "--rounds", "1"]
    command += ["--dimensions", "1000", "--parties", "3", "--json", str(out)] + ["--processes"] * processes
    subprocess.run(command, check=True, timeout=300, capture_output=True)
    results = json.loads(out.read_text())["results"]
    assert [result["processes"] for result in results] == [processes, processes]
    (secure,) = [result for result in results if "ratio_to_plain" in result]
    assert math.isfinite(secure["ratio_to_plain"]) and secure["ratio_to_plain"] > 0
    assert math.isfinite(secure["party_ratio_to_plain"]) and secure["party_ratio_to_plain"] > 0
