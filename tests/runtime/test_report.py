"""`fedfair report OUTPUT_DIR`: the page of an aggregator's run, from its round log and events.

The fast tests write the output folder with the aggregator's own writers
(`append_round_log`, `EventLog`) and records with the fields `RoundLoop` gives them, over a
run with every cell of the contribution matrix: a late site, a dropout, an aborted round
with an exclusion, a left-out site, a re-admission. One slow test runs a real federation,
whose aggregator writes the report itself at the end. The page is checked as text, through
the figures it drew (their series against the JSON lines, as the `reproduce` figures are), and
rendered in headless Chromium where it is installed (`.ci/run` installs it).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pytest
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure

from fedfair import cli
from fedfair.core.errors import ConfigError
from fedfair.fairness.references import BASE_RATE, UNIFORM, uniform_report
from fedfair.runtime.local.workspace import toml_text
from fedfair.runtime.report import figures as report_figures
from fedfair.runtime.output_folder import COMPARISON_NAME
from fedfair.runtime.report import page as report
from fedfair.runtime.report.data import read_run
from fedfair.runtime.aggregator.checkpoint import append_round_log, read_round_log
from fedfair.runtime.observe.events import EventLog, read_events
from tests.runtime.harness import new_workspace, thread_federation

NAMES = ["site-a", "site-b", "site-c"]
STAGES = ("STAGE_ADVERTISE_KEYS", "STAGE_SHARE_KEYS", "STAGE_MASKED_INPUT", "STAGE_CONSISTENCY", "STAGE_UNMASK")
EXCLUSION = "signed two different survivor sets"


def evaluation(round_number: int, worst: float, mean: float) -> dict[str, Any]:
    """A finished evaluation as `RoundLoop.evaluate` records it (the report's fields from secure sums)."""
    return {
        "status": "done", "round": round_number, "collaborators": 3, "rho": 0.3, "samples": 16281,
        "mean_risk": mean, "worst_risk": worst, "best_risk": mean - 0.02, "disparity": (worst - mean) / 0.7,
        "worst_minus_best": worst - mean + 0.02, "accuracy": 0.7, "mean_error": 0.3, "worst_error": 1.0,
        "best_error": 0.0, "error_disparity": 1.0, "error_worst_minus_best": 1.0, "worst_risk_gap": 1e-6,
        "best_risk_gap": 1e-6, "mean_error_bound": 1e-10,
    }  # fmt: skip


COMPOSITION: dict[str, Any] = {
    "threshold": 0.5736, "min_category_count": 10, "worst_rows": 561, "rows": 1504, "suppressed": 3,
    "columns": {
        "race": [
            {"level": "Amer-Indian-Eskimo", "worst_share": None, "overall_share": None, "worst_rows": None, "rows": None},
            {"level": "Black", "worst_share": None, "overall_share": 0.1011, "worst_rows": None, "rows": 152},
            {"level": "White", "worst_share": 0.6471, "overall_share": 0.8650, "worst_rows": 363, "rows": 1301},
        ],
        "sex": [
            {"level": "Female", "worst_share": 0.1426, "overall_share": 0.3132, "worst_rows": 80, "rows": 471},
            {"level": "Male", "worst_share": 0.8574, "overall_share": 0.6868, "worst_rows": 481, "rows": 1033},
        ],
    },
}  # fmt: skip
"""A final evaluation's composition as `composition_from_sums` reports it: suppressed counts are None."""


def applied(
    round_number: int, participants: list[str], contributors: list[str], dropped: dict[str, list[str]], c: float
) -> dict[str, Any]:
    """An applied training round as `RoundLoop.train` records it."""
    return {
        "round": round_number, "participants": participants, "model_sha256": "0" * 64, "secure_aggregation": True,
        "status": "applied", "contributors": contributors, "dropped": dropped, "total_weight": 325.0,
        "mean_update_error_bound": 1e-7, "c": c, "c_average": c + 0.1, "received_bytes": 8721,
        "stage_seconds": {stage: 0.01 * (index + 1) * round_number for index, stage in enumerate(STAGES)},
        "seconds": 0.2 * round_number, "cpu_seconds": 0.05,
    }  # fmt: skip


def write_run(folder: Path) -> list[dict[str, Any]]:
    """Five rounds: site-c late (1) then dropped (2); round 3 aborted, excluding site-b; site-b left out
    in round 4, re-admitted after it, back in 5. Evaluations at 2, 4 and 5; site-a shares its epsilon."""
    records = [
        applied(1, NAMES, NAMES, {"STAGE_UNMASK": ["site-c"]}, 9.8),
        {**applied(2, NAMES, NAMES[:2], {"STAGE_MASKED_INPUT": ["site-c"]}, 9.7), "evaluation": evaluation(2, 0.71, 0.69)},
        {
            "round": 3, "participants": NAMES, "model_sha256": "0" * 64, "secure_aggregation": True,
            "status": "aborted", "reason": "too few survivors", "seconds": 0.4, "excluded": {"site-b": EXCLUSION},
        },
        {**applied(4, ["site-a", "site-c"], ["site-a", "site-c"], {}, 9.6), "evaluation": evaluation(4, 0.70, 0.68),
         "readmitted": ["site-b"]},
        {**applied(5, NAMES, NAMES, {}, 9.5), "evaluation": {**evaluation(5, 0.69, 0.66), "composition": COMPOSITION}},
    ]  # fmt: skip
    events = EventLog(folder)
    events.emit("start", federation_id="fed-test", pid=1, resume=False, first_round=1, rounds=5, collaborators=NAMES)
    for record in records:
        append_round_log(folder, record)
        epsilon = {"site-a": 0.5 * record["round"]}
        events.emit(
            "round",
            round=record["round"],
            status=record["status"],
            participants=record["participants"],
            contributors=record.get("contributors", []),
            seconds={},
            bytes=0,
            objective=None,
            epsilon=epsilon,
        )
    events.emit("status", round=4, name="site-c", status="budget_spent", epsilon=None)
    events.emit("finish", rounds=5, output=str(folder))
    return records


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    output = tmp_path / "output"
    write_run(output)
    return output


def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """Every figure the report draws from now on (the sections pass each through `svg`)."""
    figures: list[Figure] = []
    render = report_figures.svg

    def keep(figure: Figure) -> str:
        figures.append(figure)
        return render(figure)

    monkeypatch.setattr(report_figures, "svg", keep)
    return figures


def lines(figures: list[Figure]) -> dict[str, Any]:
    return {
        line.get_gid(): line
        for figure in figures
        for axis in figure.axes
        for line in axis.get_lines()
        if line.get_gid()
    }


def cells(page: str) -> dict[tuple[int, str], str]:
    """(round, collaborator) -> the state class of its cell in the page's contribution matrix."""
    found = {}
    for round_number, row in re.findall(r'<tr data-round="(\d+)">(.*?)</tr>', page):
        for state, name in re.findall(r'<td class="(\w+)" data-name="([^"]+)"', row):
            found[(int(round_number), name)] = state
    return found


def assert_self_contained(page: str) -> None:
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", page, re.IGNORECASE)
    assert "<script" not in page and "<link" not in page and "<iframe" not in page


# ---------------------------------------------------------------- the page


def test_the_page_is_self_contained_and_has_every_section(folder: Path) -> None:
    path = report.write_report(folder)
    assert path == folder / report.REPORT_NAME
    page = path.read_text()
    assert_self_contained(page)
    for section in ("risks", "composition", "threshold", "contributions", "privacy", "stages"):
        assert f'<section id="{section}">' in page
    assert page.count("<svg") == 4  # risks, threshold, epsilon, stage times
    assert "fed-test" in page and "5 rounds recorded of 5 planned (4 applied, 1 aborted)" in page
    # Exact sums: the final figures with their certified bracket, and no class-prior baseline (no label counts).
    assert "Final evaluation (round 5): worst-group risk 0.6900 (exact sums" in page


def test_the_matrix_lists_every_collaborator_and_marks_dropouts_and_exclusions(folder: Path) -> None:
    found = cells(report.write_report(folder).read_text())
    assert {name for _, name in found} == set(NAMES)
    assert {round_number for round_number, _ in found} == {1, 2, 3, 4, 5}
    assert found[1, "site-c"] == "late" and found[1, "site-a"] == "contributed"
    assert found[2, "site-c"] == "dropped"
    assert found[3, "site-b"] == "excluded" and found[3, "site-a"] == "aborted"
    assert found[4, "site-b"] == "out"
    assert found[5, "site-b"] == "contributed"  # re-admitted after round 4
    page = (folder / report.REPORT_NAME).read_text()
    assert f'data-name="site-b" title="excluded: {EXCLUSION}"' in page
    assert 'data-name="site-c" title="missed stages: upload"' in page


def test_plotted_values_are_the_logs_values(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = drawn(monkeypatch)
    report.write_report(folder)
    records = read_round_log(folder)
    series = lines(figures)
    evaluated = [record["evaluation"] for record in records if "evaluation" in record]
    assert list(series["risk:worst"].get_xdata()) == [item["round"] for item in evaluated]
    assert list(series["risk:worst"].get_ydata()) == [item["worst_risk"] for item in evaluated]
    assert list(series["risk:mean"].get_ydata()) == [item["mean_risk"] for item in evaluated]
    assert "risk:prior" not in series  # exact sums count no labels: no class-prior baseline
    (interval,) = [
        found for figure in figures for found in figure.axes[0].collections if found.get_gid() == "risk:interval"
    ]
    # Each worst-group risk's bar spans its certified bracket: [worst - gap, worst] for exact sums.
    expected = [
        [[item["round"], item["worst_risk"] - item["worst_risk_gap"]], [item["round"], item["worst_risk"]]]
        for item in evaluated
    ]
    assert isinstance(interval, LineCollection) and np.allclose(interval.get_segments(), expected)
    # An exact mean (a rounding bound of 1e-10) has no bar.
    assert not [found for figure in figures for found in figure.axes[0].collections if "mean" in str(found.get_gid())]
    done = [record for record in records if record["status"] == "applied"]
    assert list(series["threshold:c"].get_xdata()) == [record["round"] for record in done]
    assert list(series["threshold:c"].get_ydata()) == [record["c"] for record in done]
    assert list(series["threshold:c_average"].get_ydata()) == [record["c_average"] for record in done]
    assert list(series["epsilon:site-a"].get_ydata()) == [0.5 * number for number in range(1, 6)]
    (stages,) = [figure for figure in figures if figure.axes[0].containers]
    bars = {container.get_label(): container for container in stages.axes[0].containers}
    unmask = [record["stage_seconds"]["STAGE_UNMASK"] for record in done]
    assert [patch.get_height() for patch in bars["unmasking the sum"]] == pytest.approx(unmask, rel=1e-12)


def test_the_worst_groups_composition_is_tabulated_with_suppressed_counts_said_never_shown(folder: Path) -> None:
    page = report.write_report(folder).read_text()
    tables = dict(re.findall(r'<table class="composition" data-column="(\w+)">(.*?)</table>', page))
    assert set(tables) == {"race", "sex"}
    assert "<tr><th>White</th><td>64.7%</td><td>363</td><td>86.5%</td><td>1,301</td></tr>" in tables["race"]
    assert (
        '<tr><th>Black</th><td class="suppressed">suppressed</td><td class="suppressed"></td><td>10.1%</td>'
        "<td>152</td></tr>"
    ) in tables["race"]
    assert tables["race"].count(">suppressed<") == 3 and ">suppressed<" not in tables["sex"]
    assert "Round 5's evaluation" in page and "c-bar = 0.5736 (the worst group, 561 of 1,504 rows)" in page
    quiet = folder.parent / "quiet"
    append_round_log(quiet, {**applied(1, NAMES, NAMES, {}, 9.8), "evaluation": evaluation(1, 0.7, 0.6)})
    assert (
        "No composition: the plan's [evaluation] composition names no column" in report.write_report(quiet).read_text()
    )


def test_a_noised_composition_and_evaluation_state_their_noise_and_no_site_suppression(tmp_path: Path) -> None:
    noised = {"noise_std": 12.8, "confidence": 0.95, "count_error_bound": 46.2, "share_error_bound": 0.0912}
    worst = {
        **evaluation(1, 0.9, 0.3), "noise_std": 4.96, "loss_cap": 3.0, "worst_risk_low": 0.7, "worst_risk_high": 1.1,
        "above_cap": 5.0, "above_cap_bound": 40.0, "report_epsilon": 1.0, "error_rate_bound": 0.02,
    }  # fmt: skip
    append_round_log(
        tmp_path,
        {
            **applied(1, NAMES, NAMES, {}, 9.8),
            "evaluation": {**worst, "composition": COMPOSITION | noised | {"epsilon": 1.0}},
        },
    )
    page = report.write_report(tmp_path).read_text()
    assert (
        "The counts are noised (epsilon 1): every count shown is within 46 rows and every share within 9.1 points of the true one, all at once with "
        "probability 95%"
    ) in page
    assert "withheld at each site" not in page and "rows per bucket" not in page
    assert "noise of standard deviation up to 4.96 per coordinate of the answers' sum" in page
    # Only the answers were noised: the page must not let a reader take the model for a DP-trained one.
    assert "No training sum carried noise: this noise protects the evaluation answers" in page
    trained = tmp_path / "trained"
    append_round_log(trained, {**applied(1, NAMES, NAMES, {}, 9.8), "mean_update_noise_std": 0.01, "evaluation": worst})
    page = report.write_report(trained).read_text()
    assert "1 training round decoded with Skellam noise" in page and "No training sum carried noise" not in page


def test_a_noised_mean_is_drawn_with_its_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    figures = drawn(monkeypatch)
    noised = {
        "noise_std": 4.96, "loss_cap": 3.0, "above_cap": 5.0, "above_cap_bound": 40.0, "report_epsilon": 1.0,
        "error_rate_bound": 0.02, "worst_risk_low": 0.7, "worst_risk_high": 1.1,
    }  # fmt: skip
    for round_number, mean in ((1, 0.4), (2, 0.3)):
        result = {**evaluation(round_number, 0.9, mean), **noised, "mean_error_bound": 0.05 * round_number}
        append_round_log(tmp_path, {**applied(round_number, NAMES, NAMES, {}, 9.8), "evaluation": result})
    report.write_report(tmp_path)
    (bars,) = [
        found for figure in figures for found in figure.axes[0].collections if found.get_gid() == "risk:mean_interval"
    ]
    assert isinstance(bars, LineCollection)
    assert np.allclose(bars.get_segments(), [[[1, 0.35], [1, 0.45]], [[2, 0.2], [2, 0.4]]])


def test_an_unresolved_worst_group_risk_is_a_grey_point_and_no_mean_is_drawn_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = drawn(monkeypatch)
    noised = {"noise_std": 4.96, "loss_cap": 3.0, "report_epsilon": 0.2, "error_rate_bound": 0.02}
    records = {
        # (worst, low, high, mean): round 1's interval spans most of [0, 3], round 2's mean lies above its worst
        1: (1.4, 0.1, 2.7, 0.5),
        2: (0.6, 0.45, 0.75, 0.7),
        3: (0.8, 0.7, 0.9, 0.3),
    }
    for number, (worst, low, high, mean) in records.items():
        result = {
            **evaluation(number, worst, mean), **noised, "worst_risk_low": low, "worst_risk_high": high,
            "mean_error_bound": 0.1,
        }  # fmt: skip
        append_round_log(tmp_path, {**applied(number, NAMES, NAMES, {}, 9.8), "evaluation": result})
    page = report.write_report(tmp_path).read_text()
    series = lines(figures)
    # Progress is drawn through the resolved points only; the unresolved one is grey, with its grey bar.
    assert list(series["risk:worst"].get_xdata()) == [2, 3] and list(series["risk:unresolved"].get_xdata()) == [1]
    assert series["risk:unresolved"].get_color() == "grey" and series["risk:unresolved"].get_linestyle() == "None"
    (grey,) = [
        found
        for figure in figures
        for found in figure.axes[0].collections
        if found.get_gid() == "risk:unresolved_interval"
    ]
    assert isinstance(grey, LineCollection) and np.allclose(grey.get_segments(), [[[1, 0.1], [1, 2.7]]])
    # No true mean lies above its worst group: round 2's noised mean is drawn at the worst group's value.
    assert list(series["risk:mean"].get_ydata()) == [0.5, 0.6, 0.3]
    # The page leads with the last evaluation's headline.
    assert "<p class=headline>Final evaluation (round 3): worst-group risk 0.80 (95% interval 0.70 to 0.90)" in page


def test_privacy_lists_shared_epsilons_and_spent_budgets_or_says_there_is_no_dp(folder: Path) -> None:
    page = report.write_report(folder).read_text()
    assert "<tr><td>site-a</td><td>2.5</td><td>5</td><td></td></tr>" in page
    assert "<tr><td>site-c</td><td>not shared</td><td></td><td>round 4</td></tr>" in page
    quiet = folder.parent / "quiet"
    append_round_log(quiet, applied(1, NAMES, NAMES, {}, 9.8))
    assert "No DP in this run" in report.write_report(quiet).read_text()


def test_the_report_command_writes_where_asked_and_help_loads_nothing_heavy(folder: Path, tmp_path: Path) -> None:
    assert cli.main(["report", str(folder), "--out", str(tmp_path / "elsewhere.html")]) == 0
    assert (tmp_path / "elsewhere.html").exists() and not (folder / report.REPORT_NAME).exists()
    # -X importtime lists every module the interpreter imported, one per line, the name last.
    command = [sys.executable, "-X", "importtime", "-m", "fedfair.cli", "report", "--help"]
    completed = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    assert "OUTPUT_DIR" in completed.stdout  # the report module's parser: it was loaded
    loaded = {
        line.rsplit("|", 1)[-1].strip() for line in completed.stderr.splitlines() if line.startswith("import time:")
    }
    assert not loaded & {"torch", "grpc", "pandas", "matplotlib"}


# ---------------------------------------------------------------- bad input, nothing half-written


def test_a_missing_round_log_is_one_line_naming_the_file_and_the_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error
    assert f"{tmp_path / 'rounds.jsonl'} does not exist" in error and "output folder" in error
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("line", "said"),
    [('{"round": 6, "stat', "line 6 is not a round record"), ("[1, 2]", "line 6 is not a round record"),
     ('{"status": "applied"}', "record 6 has no integer round")],
)  # fmt: skip
def test_a_corrupt_round_log_is_refused_and_the_old_report_kept(folder: Path, line: str, said: str) -> None:
    earlier = report.write_report(folder).read_bytes()
    with (folder / "rounds.jsonl").open("a") as stream:
        stream.write(line + "\n")
    with pytest.raises(ConfigError, match=said) as caught:
        report.write_report(folder)
    assert "rounds.jsonl" in str(caught.value) and "--resume" in str(caught.value)
    assert (folder / report.REPORT_NAME).read_bytes() == earlier
    assert not [path for path in folder.iterdir() if path.name.startswith(".report")]


def test_a_failure_to_draw_writes_nothing_and_refresh_only_warns(
    folder: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(figure: Figure) -> str:
        raise RuntimeError("no fonts")

    monkeypatch.setattr(report_figures, "svg", broken)
    with caplog.at_level("WARNING"):
        assert report.refresh_report(folder) is None
    assert "the run report was not written" in caplog.text and "no fonts" in caplog.text
    assert not [path for path in folder.iterdir() if "report" in path.name]


# ---------------------------------------------------------------- in a browser


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")
    return found


def browse(page: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on `page` (no network to reach: the page must need none)."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *flags, page.as_uri()]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)


def vertices(dom: str, gid: str) -> np.ndarray:
    """The (x, y) points, in SVG units, of the line whose group has the id `gid` in the rendered DOM."""
    match = re.search(rf'<g id="{re.escape(gid)}">\s*<path d="([^"]+)"', dom)
    assert match is not None, f"{gid} not in the rendered page"
    numbers = [float(value) for value in re.findall(r"-?\d+(?:\.\d+)?", match.group(1))]
    return np.asarray(numbers).reshape(-1, 2)


@pytest.mark.slow
def test_the_page_renders_in_chromium_with_the_logs_values(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chromium()
    figures = drawn(monkeypatch)
    page = report.write_report(folder)
    shot = tmp_path / "report.png"
    browse(page, "--window-size=1100,3200", f"--screenshot={shot}")
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (3200, 1100)
    colours = {tuple(pixel) for pixel in (pixels[::4, ::4] * 255).round().astype(int).reshape(-1, 3)}
    assert len(colours) > 50  # text, four figures, the matrix's colours: not a blank page
    red = np.array([0xD6, 0x27, 0x28]) / 255  # tab:red, the worst-group risk line
    assert (np.abs(pixels - red).max(axis=-1) < 0.02).sum() > 50
    # The rendered page's line, mapped back through its axes, is the log's values.
    dom = browse(page, "--dump-dom").stdout
    records = read_round_log(folder)
    evaluated = [record["evaluation"] for record in records if "evaluation" in record]
    series = lines(figures)
    for gid, key in (("risk:worst", "worst_risk"), ("risk:mean", "mean_risk")):
        figure = series[gid].figure
        # SVG units are points, y downwards; the figure's display units are pixels at its dpi, y upwards.
        points = vertices(dom, gid)
        display = np.column_stack([points[:, 0], figure.bbox.height * 72 / figure.dpi - points[:, 1]]) * figure.dpi / 72
        values = series[gid].axes.transData.inverted().transform(display)
        np.testing.assert_allclose(values[:, 0], [item["round"] for item in evaluated], atol=1e-4)
        np.testing.assert_allclose(values[:, 1], [item[key] for item in evaluated], atol=1e-4)


# ---------------------------------------------------------------- a real run


@pytest.mark.slow
def test_the_aggregator_writes_the_report_at_the_end_of_a_real_run(tmp_path: Path) -> None:
    """Three secure rounds, evaluated each under noised answers, with DP at site-b, which shares its epsilon (a site
    with its own DP-SGD refuses a secure plan whose answers decode exact)."""
    workspace = new_workspace(
        tmp_path,
        NAMES,
        training={"rounds": 3},
        evaluation={"every": 1},
        aggregator={"report": True},
        privacy={"report_epsilon": 1.0},
    )
    config = workspace.configs["site-b"]
    config.write_text(config.read_text() + toml_text({"privacy": {"enabled": True, "share_epsilon": True}}))
    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    page = (workspace.output / report.REPORT_NAME).read_text()
    assert_self_contained(page)
    found = cells(page)
    assert {name for _, name in found} == set(NAMES) and {number for number, _ in found} == {1, 2, 3}
    for record in read_round_log(workspace.output):
        for name in NAMES:
            expected = ("contributed", "late") if name in record["contributors"] else ("dropped",)
            assert found[record["round"], name] in expected, (record, name)
    # Noised answers: the final figures with their 95% interval (the exact sums' page: the tests above).
    final = read_round_log(workspace.output)[-1]["evaluation"]
    assert final["report_epsilon"] == 1.0
    assert "Final evaluation (round 3): worst-group risk " in page and "(95% interval " in page
    assert 'id="risk:interval"' in page
    shared = [event["epsilon"] for event in read_events(workspace.output) if event["event"] == "round"]
    assert set(shared[-1]) == {"site-b"}
    assert f"<tr><td>site-b</td><td>{shared[-1]['site-b']:.4g}</td><td>3</td>" in page


def test_a_long_runs_table_is_collapsed_below_its_legend(tmp_path: Path) -> None:
    short = report.write_report(write_folder(tmp_path / "short", 5)).read_text()
    assert "<details>" not in short.split('id="contributions"')[1].split("</section>")[0]
    page = report.write_report(write_folder(tmp_path / "long", report.OPEN_ROWS + 10)).read_text()
    section = page.split('id="contributions"')[1].split("</section>")[0]
    collapsed = f"<details><summary>Each of the {report.OPEN_ROWS + 10} rounds"
    assert section.index("<ul class=note>") < section.index(collapsed)
    assert section.count("<tr data-round=") == report.OPEN_ROWS + 10  # collapsed, not cut


def write_folder(output: Path, rounds: int) -> Path:
    for number in range(1, rounds + 1):
        append_round_log(output, applied(number, NAMES, NAMES, {}, 9.0))
    return output


def test_a_launch_comparison_is_the_reports_first_table(tmp_path: Path) -> None:
    # comparison.json as fedfair launch writes it: each model's exact report on the same held-out rows.
    folder = tmp_path / "output"
    write_run(folder)
    assert 'id="comparison"' not in report.render(read_run(folder))  # a deployed federation has none
    ours = {
        "worst_risk": 0.7691,
        "mean_risk": 0.41,
        "disparity": 0.12,
        "accuracy": 0.83,
        "worst_error": 0.3,
        "rows": 8140,
    }
    theirs = {**ours, "worst_risk": 0.9389, "disparity": 0.31}
    constants = {UNIFORM: uniform_report(2, 0.3).to_dict() | {"rows": 8140}, BASE_RATE: {**ours, "worst_risk": 1.1969}}
    exact = {"FedSRCVaR": ours, "FedAvg": theirs} | constants
    comparison = {"rho": 0.3, "exact": exact, "private": {}}
    (folder / COMPARISON_NAME).write_text(json.dumps(comparison))
    page = report.render(read_run(folder))
    section = page.split('<section id="comparison">')[1].split("</section>")[0]
    assert page.index('<section id="comparison">') < page.index('<section id="risks">')
    assert "same 8,140 held-out rows" in section and "worst-off 30%" in section
    # Both trained models above h̄'s ln 2: the section says so first.
    assert section.index("is above the uniform classifier h̄'s 0.6931") < section.index("<table")
    rows = re.findall(r"<tr><td>([^<]+)</td>((?:<td>[^<]+</td>)+)</tr>", section)
    assert [name for name, _ in rows] == ["FedSRCVaR", "FedAvg", UNIFORM, BASE_RATE]
    assert re.findall(r"<td>([^<]+)</td>", rows[1][1])[:2] == ["0.9389", "0.4100"]
    # The same rows as points, each drawn where its figures say, h̄'s worst-group risk the dashed line.
    for name in exact:
        assert f'id="tradeoff:{name}"' in section, name
    drawn = report_figures.trade_off({name: (r["mean_risk"], r["worst_risk"]) for name, r in exact.items()}, UNIFORM)
    lines = {line.get_gid(): line for line in drawn.axes[0].get_lines()}
    assert list(lines[f"tradeoff:{UNIFORM}"].get_xydata()[0]) == pytest.approx([math.log(2), math.log(2)])
    assert list(lines["tradeoff:FedAvg"].get_xydata()[0]) == pytest.approx([0.41, 0.9389])
    assert lines["tradeoff:uniform"].get_ydata()[0] == pytest.approx(math.log(2))
    # One trained model below h̄: no such sentence.
    comparison["exact"] = exact | {"FedSRCVaR": {**ours, "worst_risk": 0.65}}
    (folder / COMPARISON_NAME).write_text(json.dumps(comparison))
    assert "is above the uniform classifier" not in report.render(read_run(folder))
    (folder / COMPARISON_NAME).write_text("{")
    with pytest.raises(ConfigError, match="comparison.json cannot be read"):
        read_run(folder)
