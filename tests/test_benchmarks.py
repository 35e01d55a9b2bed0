"""round_bench, which drives the real runtime and which no other test runs, still runs: at its
smallest size, as a subprocess, as `make bench` would run it. Its figures are not asserted (speed
lives in the benchmarks' JSON), only that it finishes and reports finite ratios, so a change to
the runtime cannot break it silently until the next time someone measures. And every benchmark
module imports against the current library (the page they feed is tests/test_benchmarks_report.py's).

`make test` runs round_bench with its parties in threads (its default); the runs that start a federation's
processes again (round_bench --processes, federation_bench's launched federation: 20 to 25 CPU-seconds each)
are marked `study`, which `make test-studies` runs: the runtime's processes have their own tests. So is
eval_error's quick run (its designs' training and 20 noises: about 10 CPU-seconds)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedfair.fairness import tail

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("processes", "pairs"),
    [pytest.param(False, 2, id="threads-2-pairs"), pytest.param(True, 1, id="processes", marks=pytest.mark.study)],
)
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
    assert math.isfinite(secure["party_cpu_ratio_to_plain"]) and secure["party_cpu_ratio_to_plain"] > 0
    assert math.isfinite(secure["federation_cpu_ratio_to_plain"]) and secure["federation_cpu_ratio_to_plain"] > 0
    for result in results:
        assert result["peak_rss_mb"] > 0 and result["process_cpu_seconds"] > 0
        # The aggregator's own CPU and a party's memory are measurable only with the parties as processes.
        assert (result["aggregator_cpu_seconds"] is not None) is processes
        assert (result["party_peak_rss_mb"] is not None) is processes
        # The whole federation's CPU a round: with threads the process's; with processes the aggregator's and every
        # party process's, summed.
        if not processes:
            assert result["federation_cpu_seconds"] == result["process_cpu_seconds"]
        else:
            parties = len(result["party_process_cpu_seconds_each"])
            assert parties == 3 and min(result["party_process_cpu_seconds_each"]) > 0
            assert result["federation_cpu_seconds"] >= result["aggregator_cpu_seconds"] + parties * min(
                result["party_process_cpu_seconds_each"]
            )
        # A party's round beyond its start-up, in model copies: its peak is never below its start-up.
        assert (result["party_model_copies"] is not None) is processes
        if processes:
            assert 0 < result["party_startup_rss_mb"] <= result["party_peak_rss_mb"]
            assert result["party_model_copies"] >= 0


@pytest.mark.parametrize("dimension", [1000, 10**7, 2**24 + 2, 10**8])
def test_round_bench_builds_a_model_of_exactly_d_parameters_within_the_plans_limits(dimension: int) -> None:
    """Past the plan's limit on features (2^24), d = 10^8 is a logistic regression over k classes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from round_bench import logistic_shape
    finally:
        sys.path.pop(0)
    from fedfair.core.models import output_units
    from fedfair.runtime.plan.limits import MAX_FEATURES, MAX_PARAMETERS

    shape = logistic_shape(dimension)
    outputs = output_units(shape.get("classes", 2))
    assert (shape["features"] + 1) * outputs == dimension
    assert shape["features"] <= MAX_FEATURES and shape["features"] * outputs <= MAX_PARAMETERS
    with pytest.raises(ValueError, match="no logistic regression"):
        logistic_shape(MAX_PARAMETERS + 3)


def test_a_party_critical_path_counts_overlapping_intervals_once() -> None:
    """round_bench's per-party time is the union of its threads' busy intervals (job and handlers)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from round_bench_parties import covered
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    @given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 20)), max_size=12))
    def matches_the_covered_cells(spans: list[tuple[int, int]]) -> None:
        intervals = [(float(start), float(start + length)) for start, length in spans]
        cells = {cell for start, length in spans for cell in range(start, start + length)}
        assert covered(intervals) == len(cells)

    matches_the_covered_cells()
    assert covered([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)]) == 4.0


def test_the_extra_slope_tells_n_log_n_from_n_squared() -> None:
    """round_bench's growth figure: the log-log slope of secure minus plain over n >= 10, per d."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from round_bench import extra_slopes
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    sizes = (3, 10, 20, 50, 100)
    squared = [{"dimension": 1, "parties": n, "extra_round_seconds": 1e-3 * n * n} for n in sizes]
    linear = [{"dimension": 2, "parties": n, "extra_round_seconds": 5.0 + 0.0 * n} for n in sizes]
    slopes = extra_slopes(squared + linear)
    assert slopes["d=1"] == pytest.approx(2.0, abs=1e-9)
    assert slopes["d=2"] == pytest.approx(0.0, abs=1e-9)
    assert extra_slopes([{"dimension": 1, "parties": 3, "extra_round_seconds": 1.0}]) == {}


def bench_module(name: str) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_federation_bench_reads_proc_memory_and_tells_the_parties_apart() -> None:
    bench = bench_module("federation_bench")
    rollup = "55d0-7ff [rollup]\nRss:   2048 kB\nPss:     1024 kB\nPrivate_Clean:  0 kB\nPrivate_Dirty: 512 kB\n"
    assert bench.read_kib(rollup, {"Rss", "Pss", "Private_Dirty"}) == {"Rss": 2048, "Pss": 1024, "Private_Dirty": 512}
    site = ["python", "-m", "fedfair.cli", "collaborator", "start", "--config", "/w/site-7/collaborator.toml"]
    assert bench.classify(site) == ("collaborator", "site-7")
    assert bench.classify(["python", "-m", "fedfair.cli", "aggregator", "start", "--plan", "p"]) == ("aggregator",) * 2
    assert bench.spread([3.0, 1.0, 2.0]) == {"median": 2.0, "max": 3.0} and bench.spread([]) == {}
    # The sampler finds this process's children (the launcher starts every party directly).
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "aggregator"])
    try:
        assert child.pid in bench.children_of(os.getpid())
        # A child first seen between fork and exec (classified "other") is classified again.
        sampler = bench.Sampler(os.getpid(), every=3600.0)
        sampler.stop()
        sampler.processes[child.pid] = bench.ProcessPeaks("other", "python")
        sampler.sample()
        assert [peaks.name for peaks in sampler.of_role("aggregator")] == ["aggregator"]
        peaks = bench.ProcessPeaks("collaborator", "site-1")
        assert peaks.sample(child.pid) > 0 and peaks.rss_mb >= peaks.pss_mb > 0 and peaks.hwm_mb >= peaks.rss_mb
    finally:
        child.kill()
        child.wait()
    assert bench.ProcessPeaks("collaborator", "gone").sample(child.pid) == 0.0


BURN = """
import os, signal, sys, time
if sys.argv[1:] == ["worker"]:
    while time.process_time() < 1.0:  # one CPU second, then idle long enough for the party to sample it
        pass
    time.sleep(1.5)
else:  # started as Ray's raylet starts a ClientApp actor: titled so, by a parent that ignores SIGCHLD
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    os.posix_spawn(sys.executable, ["ray::ClientAppActor", __file__, "worker"], os.environ)
    try:
        os.wait()  # returns when every child is gone: the kernel reaped them, dropping their CPU
    except ChildProcessError:
        pass
"""


def test_flower_bench_party_counts_cpu_the_kernel_drops_and_tells_the_client_app_actors_apart(tmp_path: Path) -> None:
    script = tmp_path / "burn.py"
    script.write_text(BURN)
    report = tmp_path / "party.cpu.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "flower_bench.py"), "party", str(report), "--"]
        + [sys.executable, str(script)],
        check=True,
        timeout=120,
    )
    counted = json.loads(report.read_text())
    assert counted["exit"] == 0
    # The worker's second and its interpreter's start (tens of ms): the sample after its burn sees all of it, since
    # it then idles for three sampling periods; /proc counts whole clock ticks (10 ms), rounding down.
    assert 0.98 <= counted["client_app_actor_cpu_seconds"] < 1.3
    # getrusage never sees the worker (its parent ignored SIGCHLD): the sampled second is added back, once.
    assert counted["dropped_by_kernel_cpu_seconds"] == counted["client_app_actor_cpu_seconds"]
    # The rest is the parent interpreter's start: under a second.
    assert 0 < counted["cpu_seconds"] - counted["client_app_actor_cpu_seconds"] < 1.0


@pytest.mark.slow
@pytest.mark.study
def test_federation_bench_runs_a_small_launched_federation_to_its_end(tmp_path: Path) -> None:
    out = tmp_path / "federation.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "federation_bench.py"), "--dataset", "adult"]
    # 3 rounds: with 2, the final output model is the one evaluated after round 1 (nothing averaged yet), and
    # its final evaluation, which adds composition counts, gets no second answer on one model.
    command += ["--collaborators", "2", "--rounds", "3", "--sample-seconds", "0.2", "--json", str(out)]
    subprocess.run(command, check=True, timeout=300, capture_output=True)
    result = json.loads(out.read_text())
    assert result["finished"] and result["rounds_completed"] == 3 and len(result["round_seconds"]) == 3
    assert result["collaborators_seen"] == 2 and result["collaborator"]["pss"]["max"] > 0
    assert result["aggregator"]["rss_mb"] > 0 and result["federation_pss_peak_mb"] > 0


BENCHMARK_MODULES = sorted(
    [path.stem for path in (ROOT / "benchmarks").glob("*.py")]
    + [f"attacks.{path.stem}" for path in (ROOT / "benchmarks" / "attacks").glob("*.py") if path.stem != "__init__"]
)


def test_every_benchmark_module_imports_against_the_current_library() -> None:
    """Benchmarks are outside mypy's files: a renamed library name must fail here, not at the next `make bench`."""
    code = (
        "import importlib, sys; sys.path.insert(0, sys.argv[1]); "
        "[importlib.import_module(name) for name in sys.argv[2:]]"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "benchmarks"), *BENCHMARK_MODULES],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]


@pytest.mark.study
def test_eval_error_quick_measures_every_design_against_the_exact_value(tmp_path: Path) -> None:
    """benchmarks/eval_error.py --quick, as a subprocess: the chosen design beats the two it replaced and its
    stated interval is of the size the goal asks for at 2,000 rows and epsilon 1 (20 noises: coverage loosely)."""
    out = tmp_path / "eval_error.json"
    # One torch thread, as the suite's processes run (tests/conftest.py): its full-batch training on 2 threads,
    # beside the suite's other worker, spun 28 CPU-s where one thread takes 8.
    completed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "eval_error.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    document = json.loads(out.read_text())
    rows = {(row["design"], row["rows"]): row for row in document["rows"]}
    assert {design for design, _ in rows} == {"tree", "c-bar", "layers10", "layers30", "layers60"}
    chosen, tree, c_bar = rows["layers30", 2000], rows["tree", 2000], rows["c-bar", 2000]
    assert chosen["rmse"] < tree["rmse"] / 5 and chosen["mean_half_width"] < tree["mean_half_width"] / 5
    # Reading at c-bar widened its interval by the convexity gap; the least F over the layers has none to add.
    assert chosen["mean_half_width"] < c_bar["mean_half_width"] and chosen["at_least"] == 0.0
    # The half-width is the noise's as predicted (1.96 sd below and about 2.73 above, at c = 0), plus the grid's
    # bracket (a few thousandths, reached 2.5 times each side) and the low end's slopes (tests/fairness/test_tail.py).
    assert 0.5 * chosen["expected_half_width"] < chosen["mean_half_width"]
    assert chosen["mean_half_width"] <= chosen["expected_half_width"] * math.sqrt(1.0 + 4.0 / tail.LAYERS) + 0.01
    assert chosen["mean_half_width"] <= 0.06 and chosen["coverage"] >= 0.8
    # Every loss shape, at 20 noises each: answered, and no interval of width 0.
    assert all(row["answered"] > 0.9 and row["width_zero"] == 0.0 for row in document["shapes"]["rows"])


def test_make_bench_reruns_every_result_on_the_page_with_its_own_command(tmp_path: Path) -> None:
    """Every committed result file names a benchmark script that exists and is rerun writing to itself, so no
    figure on docs/benchmarks.md is a one-off that `make bench` leaves stale."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import rerun

    planned = {item.name: item.argv for item in rerun.reruns()}
    committed = sorted(path.stem for path in (ROOT / "benchmarks" / "results").glob("*.json"))
    assert sorted(planned) == committed
    for name, argv in planned.items():
        assert argv[0] == sys.executable and (ROOT / argv[1]).is_file(), argv
        assert argv[argv.index("--json") + 1] == f"benchmarks/results/{name}.json", argv
    # A file that records no runnable command is refused by name, not skipped.
    stray = tmp_path / "stray.json"
    stray.write_text(json.dumps({"provenance": {"command": "python /tmp/elsewhere.py"}}))
    with pytest.raises(ValueError, match="stray.json records"):
        rerun.rerun_of(stray)
    listed = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "rerun.py"), "--list", "--only", "startup_bench"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert listed.stdout.strip().endswith("benchmarks/startup_bench.py --json benchmarks/results/startup_bench.json")


@pytest.mark.slow
def test_round_compare_times_every_party_step_in_both_trees_and_their_ratio(tmp_path: Path) -> None:
    """`make bench-round`'s comparison, this tree against itself as the reference: each step timed in both."""
    out = tmp_path / "compare.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "round_compare.py"), "--reference-tree", str(ROOT)]
    command += ["--runs", "1", "--sizes", "1000:3", "--json", str(out)]
    finished = subprocess.run(command, check=True, timeout=600, capture_output=True, text=True)
    (result,) = json.loads(out.read_text())["results"]
    assert (result["dimension"], result["parties"]) == (1000, 3)
    assert math.isfinite(result["secure_party_cpu_ratio"]) and result["secure_party_cpu_ratio"] > 0
    assert len(result["secure_party_cpu_ratios"]) == 1
    # Every stage's client step ran and was timed, in both trees, at the training sum's length.
    for step in ("encode", "ADVERTISE", "SHARE", "CHECK", "MASK", "CONSISTENCY", "UNMASK", "VERIFY_CLAIM (tag)"):
        spent = result["steps"][step]
        assert spent["head"] > 0 and spent["reference"] > 0, step
    for tree in ("head", "reference"):
        assert all(
            peak > 0 for peak in result[tree]["secure_peak_rss_mb_each"] + result[tree]["plain_peak_rss_mb_each"]
        )
    # One traced run of each tree (the default --memory-runs): a tree against itself meets the live peak's goal,
    # which no host's reclaiming moves, where the resident peaks of two runs differ by up to 10%.
    for tree in ("head", "reference"):
        assert len(result[tree]["secure_live_peak_mb_each"]) == len(result[tree]["plain_live_peak_mb_each"]) == 1
    for setting, ratio in result["live_peak_ratio"].items():
        assert abs(ratio - 1.0) <= result["live_peak_goal"] - 1.0, (setting, ratio)
    assert "secure party CPU" in finished.stderr and "MASK" in finished.stderr and "live peak MB" in finished.stderr


def test_round_bench_processes_refuses_a_federation_the_machines_memory_cannot_hold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """50 party processes at d = 10^6 took ~22 GB and ran a 24 GB host out of memory: the estimate (450 MiB and
    four float32 model copies a party, the aggregator's 600 MiB + 30 MiB a party + 12 copies) is above that, and a
    machine whose MemAvailable is below it is refused before any federation starts, naming need, availability and
    fixes. Threads, or --force, are not held to it."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import round_bench
        from round_bench_parties import available_memory, memory_refusal, processes_memory_need
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    need = processes_memory_need(10**6, 50)
    assert 22e9 < need < 1.25 * 22e9  # conservative against the measured run, not wildly so
    assert memory_refusal(10**6, 50, need) is None and memory_refusal(10**6, 50, None) is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24576000 kB\nMemFree:  1000 kB\nMemAvailable:   12582912 kB\n")
    available = available_memory(meminfo)
    assert available == 12 * 2**30
    said = memory_refusal(10**6, 50, available)
    assert said is not None
    assert f"needs about {need / 2**30:.1f} GiB" in said and "has 12.0 GiB available (MemAvailable" in said, said
    assert "(--parties)" in said and "leave out --processes" in said and "--force" in said, said
    # The fewest parties it names do fit; one more does not.
    fitting = int(said.split("run at most ")[1].split()[0])
    assert processes_memory_need(10**6, fitting) <= available < processes_memory_need(10**6, fitting + 1)
    assert available_memory(tmp_path / "absent") is None

    # round_bench itself refuses before starting anything where this machine lacks what it asks for.
    huge = 10**8
    if (available_memory() or 0) < processes_memory_need(huge, 100):
        with pytest.raises(SystemExit) as exited:
            round_bench.main(["--processes", "--dimensions", str(huge), "--parties", "100"])
        assert exited.value.code == 2
        assert "--processes at d = 100,000,000, n = 100 needs about" in capsys.readouterr().err
