"""The secure-aggregation demo (CLI command and example script) and a benchmark smoke test."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fedfair.cli import secagg_demo
from fedfair.secagg import demo

ROOT = Path(__file__).resolve().parents[2]


def load_script(relative: str) -> object:
    """A script as Python runs it: its own folder first on the path (benchmarks import their siblings)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(path.parent))
    return module


def test_demo_recovers_the_weighted_mean_through_two_dropouts() -> None:
    out = io.StringIO()
    report = demo.run_demo(parties=5, dimension=300, out=out)
    assert report["dropped_before_masking"] == [2]
    assert report["dropped_after_masking"] == [5]
    assert report["dropped"] == [2, 5]
    assert 0 <= report["max_abs_error"] <= report["error_bound"]
    assert set(report["timings"]) == {"encode", "advertise", "share", "check", "mask", "consistency", "unmask"}
    text = out.getvalue()
    assert "What the server receives" in text
    assert "derived bound" in text


def test_small_federations_drop_only_what_the_threshold_allows() -> None:
    report = demo.run_demo(parties=3, dimension=50, out=io.StringIO())
    assert report["dropped"] == [2]
    assert report["max_abs_error"] <= report["error_bound"]


def test_cli_command_writes_the_json(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="fedfair")
    secagg_demo.register_commands(parser.add_subparsers(dest="command", required=True))
    target = tmp_path / "out" / "demo.json"
    args = parser.parse_args(["secagg-demo", "-n", "4", "-d", "100", "--neighbours", "2", "--json", str(target)])
    assert args.handler(args) == 0
    report = json.loads(target.read_text())
    assert {"n", "d", "dropped", "max_abs_error", "error_bound", "timings"} <= set(report)
    assert (report["n"], report["d"]) == (4, 100)


def test_demo_tolerates_a_colluder_with_the_threshold_the_rule_gives() -> None:
    out = io.StringIO()
    report = demo.run_demo(parties=6, dimension=50, max_colluding=1, out=out)
    assert (report["threshold"], report["max_colluding"]) == (4, 1)
    assert report["dropped"] == [2, 6]
    assert report["max_abs_error"] <= report["error_bound"]
    assert "up to 1 colluding" in out.getvalue()


def test_example_script_reports_bad_input_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    script = load_script("examples/secagg_demo.py")
    assert script.main(["-n", "1"]) == 2  # type: ignore[attr-defined]
    error = capsys.readouterr().err.strip()
    assert error.startswith("secagg_demo: error:") and "at least 2" in error and "\n" not in error
    assert script.main(["-n", "4", "--fractional-bits", "40"]) == 2  # type: ignore[attr-defined]
    assert "fractional_bits" in capsys.readouterr().err


def test_example_script_under_a_python_without_fedfair_says_how_to_run_it() -> None:
    """-S -I: no site-packages and no PYTHONPATH, as a plain `python3` outside the venv sees it."""
    result = subprocess.run(
        [sys.executable, "-S", "-I", str(ROOT / "examples" / "secagg_demo.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("secagg_demo: error: this Python cannot import fedfair")
    assert "make setup" in line and ".venv/bin/python examples/secagg_demo.py" in line


def test_benchmark_cell_reports_the_promised_fields() -> None:
    bench = load_script("benchmarks/secagg_bench.py")
    record = bench.run_cell(4, 2000, 0.3, 32)  # type: ignore[attr-defined]
    for field in ("n", "d", "dropout", "client_mask_s", "server_unmask_s", "mask_vs_keystream", "expansion_vs_float32"):
        assert field in record
    assert set(record["stages"]) == {"advertise", "share", "check", "mask", "consistency", "unmask"}
    assert all(stage["clients_median_s"] >= 0 and stage["server_s"] >= 0 for stage in record["stages"].values())
    assert record["dropped"] == 1
    assert record["max_abs_error"] <= record["error_bound"]
    assert record["expansion_vs_float32"] > 1.0


def test_verify_benchmark_cell_reports_the_promised_fields() -> None:
    bench = load_script("benchmarks/verify_bench.py")
    record = bench.run_cell(3, 2000, 16, 1)  # type: ignore[attr-defined]
    for field in ("round_cpu_s", "verify_cpu_s", "verify_ratio", "digest_cpu_s", "dots_cpu_s", "copy_cpu_s"):
        assert record[field] >= 0
    # One tag message: the two 32-byte tags, a signature of at most 72 bytes, the header and the framing.
    assert 64 + 64 < record["extra_upload_bytes"] < 400
    assert record["extra_download_bytes"] >= 2 * 2001
