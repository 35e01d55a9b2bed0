"""`fedfair launch`: its workspace (and the CA key in it) never outlives the run unless asked, and it shows progress.

`--no-keep` (the last line says the workspace is removed, and it is) is checked by tests/test_packaging.py, whose
launch from the installed wheel runs with it: one federation for both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from fedfair.core.errors import ConfigError
from fedfair.datasets import load_dataset, partition
from fedfair.cli.status import describe
from fedfair.fairness.references import BASE_RATE, UNIFORM
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.builtin import (
    AUDITOR,
    DEFAULT_ROUNDS,
    SPLITS,
    check_sites,
    evaluation_every,
    rehearsal_ledgers,
    round_timeout,
    site_data,
)
from fedfair.runtime.local.launch import launch_folder, launch_workspace, remove_ca_key, run_launch
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.new_federation import default_max_colluding
from fedfair.runtime.observe.status import federation_state
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.template_base import Federation
from fedfair.runtime.plan.templates import render_plan
from tests.datasets.helpers import assert_exact_cover
from tests.federations import adult_raw_table
from tests.runtime.harness import eventually

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def temporary_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary folders of this test go under tmp_path, so that what is left behind can be seen."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_the_temporary_workspace_is_removed_when_the_run_fails(temporary_root: Path) -> None:
    with pytest.raises(KeyboardInterrupt), launch_folder(None, keep=False) as root:
        (root / "certs").mkdir()
        (root / "certs" / "ca.key").write_text("secret")
        raise KeyboardInterrupt
    assert list(temporary_root.iterdir()) == []


def test_by_default_the_workspace_is_kept_once_the_run_finishes_and_removed_if_it_does_not(
    temporary_root: Path,
) -> None:
    with launch_folder(None, keep=None) as finished:
        (finished / "report.html").write_text("kept")
    assert (finished / "report.html").exists()
    with pytest.raises(KeyboardInterrupt), launch_folder(None, keep=None) as stopped:
        raise KeyboardInterrupt
    assert not stopped.exists()


def test_keep_and_workdir_leave_the_workspace_where_the_user_asked(temporary_root: Path) -> None:
    with launch_folder(None, keep=True) as kept:
        (kept / "output").mkdir()
    assert (kept / "output").is_dir() and kept.parent == temporary_root
    chosen = temporary_root / "mine"
    with launch_folder(str(chosen), keep=False) as root:
        root.mkdir()
    assert root == chosen and chosen.is_dir()


def test_the_ca_key_is_deleted_once_the_certificates_are_issued(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path, ["site-a", "site-b"])
    remove_ca_key(workspace.certs)
    assert not (workspace.certs / "ca.key").exists()
    assert (workspace.certs / "ca.crt").exists() and (workspace.certs / "site-a.key").exists()


@pytest.mark.parametrize(
    ("dataset", "sites", "refusal"),
    [
        ("adult", 51, "adult runs 2 to 5 institutions .*2 to 5, or --dataset census-income for more"),
        ("adult", 1, r"adult runs 2 to 5 institutions .*pass --collaborators 2 to 5$"),
        ("census-income", 81, "census-income runs 2 to 80 institutions .*pass --collaborators 2 to 80$"),
        ("mnist", 3, "--dataset mnist: launch runs adult or census-income; pick one of them"),
    ],
)
def test_launch_refuses_a_split_it_cannot_make_and_names_the_fix(dataset: str, sites: int, refusal: str) -> None:
    with pytest.raises(ConfigError, match=refusal):
        check_sites(dataset, sites)


def test_51_sites_of_census_income_are_a_partition_with_every_site_holding_rows() -> None:
    data = site_data("census-income", 51)
    assert len(data) == 51 and [entry["index"] for entry in data.values()] == list(range(51))
    assert {(entry["dataset"], entry["partition"]) for entry in data.values()} == {("census-income", "iid")}
    census = load_dataset("census-income")
    sites = partition(census, SPLITS["census-income"].partition, 51)
    assert_exact_cover(census, sites)
    sizes = [len(site.train_index) for site in sites]
    assert min(sizes) >= 3_900 and max(sizes) - min(sizes) <= 1
    assert min(len(site.test_index) for site in sites) >= 1_950


def test_a_large_launch_gives_every_stage_longer() -> None:
    assert round_timeout(3) == round_timeout(5) == 120.0 and round_timeout(51) == 212.0


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _launch(tmp_path: Path, *flags: str) -> subprocess.Popen[str]:
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "fedfair.cli", "launch", "--collaborators", "2", "--no-fedavg", *flags]
    # Started as a non-interactive shell's background job starts it: with SIGINT ignored, which a
    # Python process keeps unless it sets its own handler; Ctrl-C (kill -INT) must still stop it.
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ignore_sigint,
    )


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` now (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text() if entry.name.isdigit() else ""
        except OSError:
            continue  # it exited meanwhile
        if stat:
            children.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Whether `pid` is a process that still runs (a zombie awaiting its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_launch_leaves_no_folder_no_ca_key_and_no_process(tmp_path: Path, stop: signal.Signals) -> None:
    process = _launch(tmp_path, "--rounds", "1000")
    assert process.stdout is not None
    first = process.stdout.readline()  # printed once the workspace is written
    if "workspace" not in first:  # it ended before: what it said is the diagnosis
        process.kill()
        pytest.fail(f"launch printed {first!r} first; its stderr: {process.communicate(timeout=60)[1][-3000:]}")
    # Its parties: the aggregator and two sites (forked by its forkserver, or started on their own).
    assert eventually(lambda: len(_descendants(process.pid)) >= 3, 120), _descendants(process.pid)
    parties = _descendants(process.pid)
    process.send_signal(stop)
    _, errors = process.communicate(timeout=60)
    left = {pid for pid in parties if _alive(pid)}
    assert not left, f"processes of the launch still run after it exited: {left}"
    assert process.returncode == 128 + stop  # 130 after Ctrl-C, 143 after SIGTERM, as docs/operations.md says
    assert f"stopped by {'Ctrl-C (SIGINT)' if stop == signal.SIGINT else 'SIGTERM'}; stopped every process" in errors
    assert not list(tmp_path.glob("fedfair-launch-*"))


def _arguments(*flags: str) -> argparse.Namespace:
    from fedfair.cli import build_parser, modules_for

    return build_parser(modules_for(["launch"])).parse_args(["launch", *flags])


def test_launch_without_flags_builds_the_demos_workspace(tmp_path: Path) -> None:
    """`make demo` is `fedfair launch` with every default: its workspace must build from them alone."""
    workspace, holding = launch_workspace(_arguments(), tmp_path)
    plan = load_aggregator_plan(workspace.plan)
    assert holding == "adult split by race" and list(workspace.configs) == ["site-a", "site-b", "site-c"]
    assert plan.training.rounds == DEFAULT_ROUNDS and plan.evaluation.every == DEFAULT_ROUNDS // 10
    # Algorithm 1's weights: each site by its training rows (its table less the quarter its collaborator holds out).
    tables = {name: len(pd.read_csv(tmp_path / "tables" / f"{name}.csv")) for name in workspace.configs}
    assert plan.influence.weights == "declared" and sum(tables.values()) == 32_561
    assert plan.influence.sizes == {name: rows - round(0.25 * rows) for name, rows in tables.items()}
    # Each site trains on a GPU where it has one, as init's collaborator config does.
    assert {tomllib.loads(path.read_text())["collaborator"]["device"] for path in workspace.configs.values()} == {
        "auto"
    }


def test_launch_csv_without_rounds_takes_inits_plan(tmp_path: Path) -> None:
    table = adult_raw_table().iloc[:1200]
    paths = []
    for index, name in enumerate(["north", "south"]):
        paths.append(tmp_path / f"{name}.csv")
        table.iloc[index * 600 : (index + 1) * 600].to_csv(paths[-1], index=False)
    workspace, holding = launch_workspace(_arguments("--csv", *map(str, paths), "--label", "income"), tmp_path / "w")
    init = tomllib.loads(render_plan(Federation("x", ("north", "south"))))
    assert load_aggregator_plan(workspace.plan).training.rounds == init["training"]["rounds"]
    assert holding == "their own tables under init's plan"


def test_launch_puts_its_drift_correction_in_the_plan(tmp_path: Path) -> None:
    """`--drift-correction scaffold` reaches the plan every site trains under (the runtime's drift-corrected
    federations are tests/runtime/test_drift_correction.py's); without it the plan has no such key."""
    workspace, _ = launch_workspace(_arguments("--drift-correction", "scaffold", "--rounds", "4"), tmp_path / "on")
    assert 'drift_correction = "scaffold"' in workspace.plan.read_text()
    assert load_aggregator_plan(workspace.plan).training.local.drift_correction == "scaffold"
    workspace, _ = launch_workspace(_arguments("--rounds", "4"), tmp_path / "off")
    assert "drift_correction" not in workspace.plan.read_text()


def test_the_launch_evaluates_ten_times_unless_told() -> None:
    assert [evaluation_every(rounds, None) for rounds in (300, 50, 4)] == [30, 5, 1]
    assert evaluation_every(300, 0) == 0 and evaluation_every(300, 7) == 7


@pytest.mark.slow
def test_the_demo_plans_what_init_plans_and_reports_the_worst_off_groups_composition(tmp_path: Path) -> None:
    """`make demo`'s federation: init's [privacy] and collusion bound, the sites' own Adult tables under a
    [schema] (noised statistics charged before round 1), an evaluation every round here (ten in 300 rounds),
    and a report saying by race and sex who is in the worst-off group; the console one progress bar, then the
    comparison and the private estimate, with each process's lines in its log in the workspace it names.

    Piped, as here, the console shows round progress line by line (no carriage return) and stays quiet, and the
    finished run keeps its folder (without --keep: by default), less the CA key. One launch checks it all."""
    began = time.monotonic()
    process = _launch(tmp_path, "--collaborators", "3", "--rounds", "3")
    output, errors = process.communicate(timeout=600)
    waited = time.monotonic() - began
    assert process.returncode == 0, errors[-2000:]
    (kept,) = tmp_path.glob("fedfair-launch-*")
    assert f"fedfair launch: workspace {kept}" in output
    assert "\r" not in errors
    assert re.search(r"^federation: 3/3 rounds \(100%\), done in ", errors, re.MULTILINE)
    report = kept / "aggregator" / "output" / "report.html"
    assert (
        re.search(rf"^Finished in \d+ s\. Report: {re.escape(str(report))}$", output, re.MULTILINE) and report.exists()
    )
    assert (kept / "aggregator" / "output" / "final_model.json").exists()
    assert not (kept / "certs" / "ca.key").exists()
    # A quiet console that ends with the comparison: the processes' lines are in their log files.
    lines = (output + errors).splitlines()
    assert len(lines) <= 30 and not any(line.startswith("[") for line in lines), lines
    # None over 120 characters, progress lines included, but those that name this test's long temporary folder.
    wide = [line for line in lines if len(line) > 120 and str(tmp_path) not in line]
    assert not wide, wide
    # "Finished in" is the wall time the operator waited, counted from the process's start (imports included, 9 s
    # of a 91 s `make demo` on a loaded machine): all of it but the fork before and the interpreter's exit after it.
    (finished,) = re.findall(r"^Finished in (\d+) s\.", output, re.MULTILINE)
    assert waited - 5.0 <= int(finished) <= waited + 1.0, (finished, waited)
    assert output.rstrip().splitlines()[-2].startswith("Secure aggregation was ON")
    assert "[aggregator]" in (kept / "logs" / "aggregator.log").read_text()
    assert "Secure aggregation was ON" in output and "What the federation saw, its private estimate" in output
    assert "joined federation" in (kept / "logs" / "site-c.log").read_text()
    assert "finished: 3 of 3 rounds applied, 0 aborted" in (kept / "logs" / "aggregator.log").read_text()
    # Under init's privacy the estimate is one form whatever the noise drew: a value with its 95% interval, or
    # "not resolved at this budget" and what would resolve it; never a bound of another kind.
    headline = output[output.index("What the federation saw") :].splitlines()[1]
    found = re.match(r"worst-group risk (\S+) \(95% interval (\S+) to (\S+)\)", headline)
    if found is None:
        assert headline.startswith("worst-group risk not resolved at this budget: "), headline
    else:
        estimate, low, high = map(float, found.groups())
        assert 0 <= low <= estimate <= high < math.inf
    assert "at least" not in output
    plan = tomllib.loads((kept / "aggregator" / "plan.toml").read_text())
    names = ["site-a", "site-b", "site-c"]
    init = tomllib.loads(render_plan(Federation("x", tuple(names), max_colluding=default_max_colluding(3))))
    assert plan["privacy"] == init["privacy"] and plan["privacy"]["report_epsilon"] == 1.0
    assert plan["secure_aggregation"]["max_colluding"] == init["secure_aggregation"]["max_colluding"] == 1
    assert plan["evaluation"] == {"every": 1, "composition": ["race", "sex"]}
    assert "init's privacy: answers and statistics noised (epsilon 1 final, 0.2 earlier)" in output
    opening = output[: output.index("\n\n")].splitlines()
    assert opening[0].startswith("fedfair launch: workspace ") and all(len(line) <= 120 for line in opening[1:])
    output_folder = kept / "aggregator" / "output"
    evaluations = [record["evaluation"] for record in read_round_log(output_folder) if "evaluation" in record]
    assert [item["round"] for item in evaluations] == [1, 2, 3] and all(item["noise_std"] > 0 for item in evaluations)
    composition = json.loads((output_folder / "final_model.json").read_text())["evaluation"]["composition"]
    assert set(composition["columns"]) == {"race", "sex"}
    page = (output_folder / "report.html").read_text()
    assert 'data-column="race"' in page and 'data-column="sex"' in page and "<th>White</th>" in page
    for name in names:  # each site charged its statistics first, then each fresh answer (a model asked again
        # gets the same bits, at no cost: the averaged model can stay the same from one round to the next)
        ledger = open_ledger(load_collaborator_config(kept / name / "collaborator.toml")).releases()
        assert (ledger[0]["kind"], ledger[0]["round"]) == ("statistics", 0)
        assert {entry["kind"] for entry in ledger[1:]} == {"evaluate"} and ledger[-1]["round"] == 3


@pytest.mark.slow
def test_the_exact_comparison_reads_the_rows_and_model_the_federation_evaluated(tmp_path: Path) -> None:
    """Like for like: with exact sums, the federation's own worst-group risk (certified within its gap) is the
    exact figure `launch` prints for FedSRCVaR, on as many held-out rows; FedAvg's row is judged on those rows."""
    from fedfair.research.launch_baseline import exact_comparison
    from fedfair.runtime.local.workspace import Workspace

    root = tmp_path / "run"
    flags = ["--collaborators", "2", "--rounds", "3", "--no-secure-aggregation", "--workdir", str(root)]
    done = subprocess.run(
        [sys.executable, "-m", "fedfair.cli", "launch", *flags], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    plan = load_aggregator_plan(root / "aggregator" / "plan.toml")
    configs = {name: root / name / "collaborator.toml" for name in plan.collaborators}
    workspace = Workspace(
        root, root / "certs", root / "aggregator" / "plan.toml", configs, root / "aggregator" / "output", ""
    )
    exact = exact_comparison(workspace, plan)
    own = json.loads((workspace.output / "final_model.json").read_text())["evaluation"]
    ours = exact["FedSRCVaR"]
    assert ours["rows"] == exact["FedAvg"]["rows"] == exact[UNIFORM]["rows"] == own["samples"]
    # The constants on the same rows: h̄ at ln 2 on every row; the base rate right on the majority, below ln 2 on
    # the mean (Adult's label entropy, about 0.55) and above it on the worst 30%, the minority's -ln share.
    assert exact[UNIFORM]["worst_risk"] == exact[UNIFORM]["mean_risk"] == pytest.approx(math.log(2.0), abs=1e-12)
    base = exact[BASE_RATE]
    assert 0.5 < base["accuracy"] < 0.9 and base["mean_risk"] < math.log(2.0) < base["worst_risk"]
    assert own["worst_risk"] - own["worst_risk_gap"] - 1e-9 <= ours["worst_risk"] <= own["worst_risk"] + 1e-9
    assert ours["mean_risk"] == pytest.approx(own["mean_risk"], abs=1e-6) and ours["accuracy"] == own["accuracy"]
    printed = next(line for line in done.stdout.splitlines() if line.strip().startswith("FedSRCVaR"))
    assert printed.split()[1] == f"{ours['worst_risk']:.4f}"


def test_a_built_in_rehearsal_charges_ledgers_in_its_own_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every launch of a built-in split has the same site names and rows: in the user's ledger folder each demo
    would add to the last one's spend until the budget refused one. A folder the operator names is kept."""
    monkeypatch.delenv("FEDFAIR_LEDGER_DIR")
    rehearsal_ledgers(tmp_path)
    assert os.environ["FEDFAIR_LEDGER_DIR"] == str(tmp_path / "ledgers")
    monkeypatch.setenv("FEDFAIR_LEDGER_DIR", "/somewhere/named")
    rehearsal_ledgers(tmp_path)
    assert os.environ["FEDFAIR_LEDGER_DIR"] == "/somewhere/named"


def test_launch_input_bound_plans_the_mode_with_its_auditor(tmp_path: Path) -> None:
    """`--input-bound`: the plan declares the two-verifier mode naming the rehearsal's auditor, at fractional bits
    whose largest site's bound fits the proof's field (init's 20 do not: a batch of a few hundred rows), and
    the auditor's config loads against the manifest that pins it; with plain sums, or own tables, it is refused."""
    from fedfair.runtime.auditor.config import check_auditor_identity, load_auditor_config

    workspace, _ = launch_workspace(_arguments("--input-bound", "--rounds", "4"), tmp_path / "bounded")
    plan = load_aggregator_plan(workspace.plan)
    secure = plan.secure_aggregation
    assert (secure.input_bound, secure.auditor) == ("two_verifiers", AUDITOR) and secure.fractional_bits < 20
    assert workspace.auditor is not None
    check_auditor_identity(load_auditor_config(workspace.auditor))
    for flags, said in (
        (("--no-secure-aggregation",), "drop --no-secure-aggregation"),
        (("--csv", "a.csv"), "drop --csv .* --csv SAMPLE --label COLUMN --auditor NAME` writes"),
    ):
        with pytest.raises(ConfigError, match=said):
            run_launch(_arguments("--input-bound", *flags, *(("--label", "y") if "--csv" in flags else ())))


def test_launch_input_bound_names_the_fixes_that_fit_the_field(tmp_path: Path) -> None:
    """launch's update_norm is 2 lr tau and a site's weight is its rows a batch, at least 1: at --lr 10^6 (2 x 10^6
    x 5 = 10^7 > the field's 3,355,442 at 0 fractional bits) no batch fraction fits, so only --lr or --local-steps
    are named; at --lr 10^4 (update_norm 10^5) a weight of at most 33.55 would, so --batch-fraction is named too."""
    for flags in ((), ("--batch-fraction", "0.0001")):
        with pytest.raises(ConfigError) as refused:
            launch_workspace(_arguments("--input-bound", "--lr", "1000000", *flags), tmp_path / "w")
        said = str(refused.value)
        assert "update_norm 2 lr tau = 2 x 1e+06 x 5 = 1e+07" in said, said
        assert "lower --lr or --local-steps until 2 lr tau x" in said and "<= 3,355,442" in said, said
        assert "--batch-fraction" not in said, said
    with pytest.raises(ConfigError, match=r"or --batch-fraction until the largest site's weight is at most 33\.55"):
        launch_workspace(_arguments("--input-bound", "--lr", "10000"), tmp_path / "x")


ROUND_ONE_SLACK = 10.0
"""Seconds round 1 may take beyond 3 x the median round. One round is one sample of the machine's load, the median
of 19 is not: with 1 s, a burst elsewhere (another worker's federation starting, mypy) that tripled round 1's 0.98 s
while the median stayed at 0.38 s would fail it (3 x 0.38 + 1 = 2.1 s). Ten seconds still fails the compilation's
return to round 1 (26 s before issue 94)."""


@pytest.mark.slow
def test_launch_input_bound_runs_every_round_bounded_with_an_auditor_process(tmp_path: Path) -> None:
    """`fedfair launch --input-bound --rounds 20` (issue 94): every round a bounded sum of every site, applied, its
    verdict record's digest in the round log; the auditor's own process verified all 20; the console says the
    bound was on and who verified it. Round 1 costs at most 3 times the median of rounds 2-20 plus ROUND_ONE_SLACK:
    what is left of a first round is the largest site's first training on its encoded table (0.68 s of round 1's
    0.98 s against a median of 0.38 s on a busy 2-core machine); its compilation (26 s before issue 94) is before it."""
    process = _launch(tmp_path, "--collaborators", "3", "--rounds", "20", "--input-bound")
    output, errors = process.communicate(timeout=600)
    assert process.returncode == 0, errors[-2000:]
    (kept,) = tmp_path.glob("fedfair-launch-*")
    log = read_round_log(kept / "aggregator" / "output")
    assert [record["round"] for record in log] == list(range(1, 21)), log
    assert all(record["status"] == "applied" and len(record["contributors"]) == 3 for record in log), log
    assert all(len(record["verdict_record_sha256"]) == 64 for record in log), log
    assert "the auditor verified 20 round(s)" in (kept / "logs" / f"{AUDITOR}.log").read_text()
    assert f"input bound on: every site proves each update within its bound to the aggregator and {AUDITOR}" in output
    assert (
        f"Input bound ON: every training update was proven within its bound to the aggregator and the auditor {AUDITOR}."
        in output
    )
    seconds = [record["seconds"] for record in log]
    assert seconds[0] <= 3 * statistics.median(seconds[1:]) + ROUND_ONE_SLACK, seconds
    # The status and the report say it too, naming the auditor.
    said = f"input bound on: every training update proven within its bound to the aggregator and the auditor {AUDITOR}"
    assert said in describe(federation_state(kept / "aggregator" / "output"))
    assert said in (kept / "aggregator" / "output" / "report.html").read_text()
