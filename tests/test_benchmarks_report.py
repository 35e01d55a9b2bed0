"""benchmarks/report.py's start-up section: every `--help` as a row a person reads, against the 0.5 s
target, and `make demo`'s line count in a sentence (issue 43's acceptance figures)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def report_module() -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return report


def test_the_startup_section_is_a_table_of_commands_with_the_target_and_the_demo_lines(tmp_path: Path) -> None:
    document = {
        "repeats": 5,
        "help_seconds": {
            "fedfair": {"wall": 0.2014, "cpu": 0.0788},
            "aggregator start": {"wall": 0.61, "cpu": 0.17},
        },
        "heavy_modules": {"fedfair": [], "aggregator start": ["grpc"]},
        "demo": {"lines": 22, "seconds": 53.3, "exit_status": 0},
        "provenance": {
            "command": "python benchmarks/startup_bench.py --json benchmarks/results/startup_bench.json",
            "date": "2026-11-25",
            "machine": {"cpus": 2, "processor": "x86_64", "platform": "Linux", "python": "3.11.7", "torch": "2.13.0"},
        },
    }
    (tmp_path / "startup_bench.json").write_text(json.dumps(document))
    page = report_module().render(tmp_path)
    assert "the median of 5 interleaved runs (target: 0.5 s each" in page
    assert "| `fedfair --help` | 0.20 | 0.08 | yes | none |" in page
    assert "| `fedfair aggregator start --help` | 0.61 | 0.17 | no (CPU 0.17 s) | grpc |" in page
    assert "`make demo` (`fedfair launch --keep`) printed **22 lines** in 53.3 s (target: under 60 lines)" in page
    assert "help_seconds." not in page and "entries (in the JSON)" not in page  # no raw dotted keys


def test_the_committed_startup_figures_meet_their_targets() -> None:
    """The recorded figures (benchmarks/results/startup_bench.json) are the acceptance of issue 43: no
    `--help` imports a heavy module, each costs well under 0.5 s of CPU, and the demo prints under 60 lines."""
    document = json.loads((ROOT / "benchmarks" / "results" / "startup_bench.json").read_text())
    assert {"fedfair", "aggregator start", "collaborator start"} <= set(document["help_seconds"])
    assert all(imported == [] for imported in document["heavy_modules"].values()), document["heavy_modules"]
    assert all(seconds["cpu"] <= 0.5 for seconds in document["help_seconds"].values()), document["help_seconds"]
    assert document["demo"]["exit_status"] == 0 and document["demo"]["lines"] < 60
