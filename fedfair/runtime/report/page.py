"""``fedfair report OUTPUT_DIR``: one self-contained HTML page of an aggregator's run.

This module imports neither torch nor matplotlib at load time, so ``fedfair report --help``
starts at once: the figures, the round log's and the bundle's modules are imported when a
report is drawn.

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import html
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedfair.core.files import atomic_write
from fedfair.fairness.references import UNIFORM
from fedfair.runtime.report import verdicts
from fedfair.runtime.report.data import (
    CELLS,
    Run,
    contribution_matrix,
    epsilon_series,
    input_bound_words,
    read_run,
    roster,
    stage_label,
)
from fedfair.runtime.output_folder import COMPARISON_COLUMNS, REPORT_NAME

logger = logging.getLogger("fedfair.report")

# ---------------------------------------------------------------- the page


def render(run: Run) -> str:
    """The report of `run` as one HTML document, with no reference outside itself."""
    start: Mapping[str, Any] = next((event for event in reversed(run.events) if event.get("event") == "start"), {})
    title = f"fedfair run report: {start.get('federation_id', run.folder.name)}"
    compared = _comparison_section(run)
    sections = (
        *((("comparison", "FedSRCVaR against FedAvg and two constants", compared),) if compared else ()),
        ("risks", "Worst-group and mean risk", _risks_section(run)),
        ("composition", "Who is in the worst-off group", _composition_section(run)),
        ("threshold", "Threshold c", _threshold_section(run)),
        ("contributions", "Who took part", _contributions_section(run)),
        ("privacy", "Differential privacy", _privacy_section(run)),
        ("stages", "Stage times", _stages_section(run)),
    )
    contents = "".join(f'<li><a href="#{key}">{heading}</a></li>' for key, heading, _ in sections)
    body = "".join(f'<section id="{key}"><h2>{heading}</h2>{content}</section>' for key, heading, content in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{_headline(run)}{_summary(run, start)}<ul class=contents>{contents}</ul>{body}"
        "</body></html>\n"
    )


STYLE = """
body{font-family:sans-serif;margin:1.5em auto;max-width:60em;color:#222}
h2{border-bottom:1px solid #ccc;margin-top:1.6em}
.note{color:#555;font-size:.9em}
.headline{font-size:1.15em}
.warnings{color:#7a4a00;margin-top:0}
table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:.15em .4em;text-align:center}
th.name{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap}
.matrix{overflow-x:auto}
.contributed{background:#c8e6c9}.late{background:#e6f4d7}.dropped{background:#ffcdd2;font-weight:bold}
.composition{display:inline-table;margin:0 1em 1em 0;vertical-align:top}.suppressed{color:#888;font-style:italic}
.excluded{background:#b71c1c;color:#fff}.aborted{background:#ffe0b2}.out{background:#e0e0e0}.absent{background:#fff}
svg{max-width:100%;height:auto}
"""


def _finished(run: Run) -> list[dict[str, Any]]:
    """The evaluation records of the rounds whose evaluation finished, in order."""
    return [record["evaluation"] for record in run.rounds if (record.get("evaluation") or {}).get("status") == "done"]


def _headline(run: Run) -> str:
    """The page's lead: the last finished evaluation's headline, then each of its warnings on one line."""
    done = _finished(run)
    if not done:
        return "<p class=headline>No evaluation has finished yet.</p>"
    final = done[-1]
    warnings = "".join(f"<li>{html.escape(line)}</li>" for line in verdicts.warning_lines(final))
    return (
        f"<p class=headline>Final evaluation (round {final['round']}): {html.escape(verdicts.headline(final))}</p>"
        + (f'<ul class="warnings">{warnings}</ul>' if warnings else "")
    )


def _comparison_section(run: Run) -> str:
    """The table `fedfair launch` leads its console with: each model's exact report on the same held-out rows.

    Empty when the folder has no comparison (a deployed federation, or a launch without its baseline).
    """
    comparison = run.comparison or {}
    exact = comparison.get("exact")
    if not exact:
        return ""
    rho = float(comparison["rho"])
    rows = int(next(iter(exact.values()))["rows"])
    header = (
        "<tr><th>model</th>"
        + "".join(f"<th>{html.escape(heading)}</th>" for _, heading in COMPARISON_COLUMNS)
        + "</tr>"
    )
    body = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        + "".join(f"<td>{float(report[key]):.4f}</td>" for key, _ in COMPARISON_COLUMNS)
        + "</tr>"
        for name, report in exact.items()
    )
    lead = (
        f"<p class=headline>Every trained model's worst-off {rho:.0%} risk is above the uniform classifier h̄'s "
        f"{float(exact[UNIFORM]['worst_risk']):.4f}: on this figure a model that learnt nothing (1/K to every class, "
        "for everyone) beats them all, and the ranking is of who comes closest to it.</p>"
        if verdicts.above_uniform(exact)
        else ""
    )
    return (
        lead + f'<p class="note">Each model evaluated exactly, on the same {rows:,} held-out rows (rho = {rho:g}: the '
        f"worst-off {rho:.0%}); lower risk is better. Below the trained models, the two constants every figure is read "
        "against: h̄, the uniform classifier (risk ln K on every row, its accuracy that of a random pick), and the base "
        "rate (each class at its share of the training rows, the majority's accuracy). Measured outside the "
        "federation, by fedfair launch; the federation's own estimate is the headline above.</p>"
        f'<table id="comparison-table">{header}{body}</table>' + _trade_off(exact)
    )


def _trade_off(exact: Mapping[str, Mapping[str, float]]) -> str:
    """The comparison's models on the plane of mean against worst-group risk, h̄ marked; empty without h̄'s row."""
    from fedfair.runtime.report.figures import svg, trade_off  # matplotlib: loaded only to draw

    if UNIFORM not in exact:
        return ""
    points = {name: (float(report["mean_risk"]), float(report["worst_risk"])) for name, report in exact.items()}
    return (
        "<p class=note>The same models as points: lower and further left is better on both. The trade-off the "
        "federation chose is where its model sits against FedAvg's (the mean risk's minimiser among them) and h̄'s "
        "dashed line: above it, a model that learnt nothing has the lower worst-group risk.</p>"
        + svg(trade_off(points, UNIFORM))
    )


def _summary(run: Run, start: Mapping[str, Any]) -> str:
    statuses = [record["status"] for record in run.rounds]
    secure = {bool(record.get("secure_aggregation")) for record in run.rounds}
    resumes = sum(1 for event in run.events if event.get("event") == "start" and event.get("resume"))
    planned = f" of {start['rounds']} planned" if "rounds" in start else ""
    excluded = {name: why for record in run.rounds for name, why in (record.get("excluded") or {}).items()}
    return (
        f'<p class="summary">Output folder <code>{html.escape(str(run.folder))}</code>: '
        f"{len(run.rounds)} rounds recorded{planned} ({statuses.count('applied')} applied, "
        f"{statuses.count('aborted')} aborted); secure aggregation {'on' if secure == {True} else 'off'}; "
        f"{html.escape(input_bound_words(start.get('auditor')))}; {resumes} resumed start(s).</p>"
        + "".join(
            f'<p class="summary">Excluded: {html.escape(name)} ({html.escape(str(why))}).</p>'
            for name, why in excluded.items()
        )
    )


def _risks_section(run: Run) -> str:
    from fedfair.runtime.report.figures import risks, svg  # matplotlib: loaded only to draw

    done = _finished(run)
    others = [
        f"round {record['round']}: evaluation {html.escape(str(record['evaluation'].get('status')))} "
        f"({html.escape(str(record['evaluation'].get('reason', '')))})"
        for record in run.rounds
        if (record.get("evaluation") or {}).get("status") not in (None, "done")
    ]
    note = (
        "<p class=note>The federated evaluation of the output model (theta-bar, c-bar) on the sites' held-out data, "
        "from secure sums, at each evaluated round. Bars: each worst-group risk's interval (95% for noised answers, "
        "the certified bracket for exact sums) and a noised mean's 95% interval; a noised figure is of the losses "
        "clipped at the loss cap, each loss above it counted as the cap. A grey point is a worst-group risk the "
        "noise did not resolve (its interval spans over half the range up to the cap): no progress is read from it. "
        "The dashed line is the class-prior classifier's worst-group risk (each class predicted at its share of the "
        "rows, from the noised label counts), drawn when the answers counted labels.</p>"
    )
    skipped = f"<p class=note>{'; '.join(others)}.</p>" if others else ""
    if not done:
        return f"<p>No round has a finished evaluation yet.</p>{skipped}"
    intervals = [verdicts.worst_interval(item) for item in done]
    figure = risks(
        [item["round"] for item in done],
        [item["worst_risk"] for item in done],
        # A noised mean above its worst group is noise (no true pair is in that order): drawn at the worst's value.
        [min(item["mean_risk"], item["worst_risk"]) if verdicts.noised(item) else item["mean_risk"] for item in done],
        [(item["worst_risk"] - low, high - item["worst_risk"]) for item, (low, high) in zip(done, intervals)],
        done[-1].get("prior_worst_risk"),
        [float(item["mean_error_bound"]) if verdicts.noised(item) else 0.0 for item in done],
        [verdicts.resolved(item) for item in done],
    )
    final = f"<p>Its figures in full: {html.escape(verdicts.describe(done[-1]))}.</p>"
    return svg(figure) + final + note + skipped


def _counted(share: float | None, count: int | None) -> str:
    """A share and its rows as two table cells; a suppressed count (None) is said, never shown."""
    if count is None or share is None:
        return '<td class="suppressed">suppressed</td><td class="suppressed"></td>'
    return f"<td>{100 * share:.1f}%</td><td>{count:,}</td>"


def _composition_section(run: Run) -> str:
    counted = [record["evaluation"] for record in run.rounds if "composition" in (record.get("evaluation") or {})]
    if not counted:
        return (
            "<p>No composition: the plan's [evaluation] composition names no column, or the final evaluation "
            "has not finished.</p>"
        )
    evaluation = counted[-1]
    composition = evaluation["composition"]
    minimum = composition["min_category_count"]
    tables = []
    for column, cells in composition["columns"].items():
        rows = "".join(
            f"<tr><th>{html.escape(str(cell['level']))}</th>{_counted(cell['worst_share'], cell['worst_rows'])}"
            f"{_counted(cell['overall_share'], cell['rows'])}</tr>"
            for cell in cells
        )
        tables.append(
            f'<table class="composition" data-column="{html.escape(column)}"><thead><tr><th>{html.escape(column)}</th>'
            "<th>worst group</th><th>rows</th><th>everyone</th><th>rows</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>"
        )
    worst, everyone = (
        f"{value:,}" if value is not None else f"fewer than {minimum}"
        for value in (composition["worst_rows"], composition["rows"])
    )
    return "".join(tables) + (
        f"<p class=note>Round {evaluation['round']}'s evaluation: the held-out rows whose loss is above c-bar = "
        f"{composition['threshold']:.4f} (the worst group, {worst} of {everyone} rows), by category, beside "
        f"every held-out row; from secure sums of each site's counts. {_composition_caveat(composition)}</p>"
    )


def _composition_caveat(composition: Mapping[str, Any]) -> str:
    """What the composition's counts are: exact but withheld below the rule, or noised, and then how far off."""
    minimum = composition["min_category_count"]
    if composition.get("noise_std") is None:
        return (
            f"A count below min_category_count = {minimum} is withheld at each site and in the sum, and shown as "
            "suppressed, so a column's shares can add up to less than 100%."
        )
    epsilon = composition.get("epsilon")
    return (
        f"The counts are noised{'' if epsilon is None else f' (epsilon {float(epsilon):g})'}: every count shown is within "
        f"{float(composition['count_error_bound']):.0f} rows and every share within "
        f"{100 * float(composition['share_error_bound']):.1f} points of the true one, all at once with probability "
        f"{float(composition['confidence']):.0%}. The sites sent their counts whole; a noised count below "
        f"min_category_count = {minimum} is shown as suppressed, whatever the truth."
    )


def _applied(run: Run) -> list[dict[str, Any]]:
    return [record for record in run.rounds if record["status"] == "applied"]


def _threshold_section(run: Run) -> str:
    from fedfair.runtime.report.figures import svg, thresholds  # matplotlib: loaded only to draw

    applied = [record for record in _applied(run) if "c" in record]
    if not applied:
        return "<p>No round has been applied yet.</p>"
    figure = thresholds(
        [record["round"] for record in applied],
        [record["c"] for record in applied],
        [record["c_average"] for record in applied],
    )
    return svg(figure) + (
        "<p class=note>c after each applied round, and c-bar, its running average, which the output model "
        "uses. Aborted rounds leave c unchanged and have no point.</p>"
    )


OPEN_ROWS = 30
"""A per-round table longer than this is collapsed (its legend shown above it)."""


def _contributions_section(run: Run) -> str:
    names = roster(run)
    header = "".join(f'<th class="name">{html.escape(name)}</th>' for name in names)
    rows = []
    for record, cells in contribution_matrix(run, names):
        marks = "".join(
            f'<td class="{cell.state}" data-name="{html.escape(name)}" title="{html.escape(cell.detail)}">'
            f"{CELLS[cell.state][0]}</td>"
            for name, cell in cells.items()
        )
        rows.append(
            f'<tr data-round="{record["round"]}"><th>{record["round"]}</th><td>{record["status"]}</td>{marks}</tr>'
        )
    legend = "".join(
        f'<li><span class="{state}">&nbsp;{mark}&nbsp;</span> {text}</li>' for state, (mark, text) in CELLS.items()
    )
    table = (
        f'<div class="matrix"><table><thead><tr><th>round</th><th>status</th>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
    if len(rows) > OPEN_ROWS:
        # A long run's table is opened on request: the legend and the page's other sections stay in view.
        table = f"<details><summary>Each of the {len(rows):,} rounds, site by site (open)</summary>{table}</details>"
    return f"<ul class=note>{legend}</ul>{table}"


def _noise_paragraph(run: Run) -> str:
    """What the plan's distributed noise put into the sums the aggregator decoded, or "" without any."""
    training = [r["mean_update_noise_std"] for r in run.rounds if r.get("mean_update_noise_std")]
    evaluations = [r["evaluation"]["noise_std"] for r in run.rounds if (r.get("evaluation") or {}).get("noise_std")]
    if not training and not evaluations:
        return ""
    parts = []
    if training:
        parts.append(
            f"{len(training)} training round{'s' if len(training) != 1 else ''} decoded with Skellam noise inside the "
            "secure sum (the mean update's "
            f"noise, standard deviation {max(training):.3g} per coordinate)"
        )
    if evaluations:
        parts.append(
            f"{len(evaluations)} evaluations decoded with noise of standard deviation up to {max(evaluations):.3g} "
            "per coordinate of the answers' sum, each coordinate a scaled sum (each risk above carries that noise in "
            "its 95% interval)"
        )
    unprotected = (
        ""
        if training
        else " No training sum carried noise: this noise protects the evaluation answers (and any statistics before "
        "round 1), not the model's weights; the plan's [privacy] mode = \"distributed\" noises training too, and a "
        "site's own DP-SGD is listed below when the site shares its epsilon."
    )
    return (
        f"<p>Distributed DP: {'; '.join(parts)}. Each site charged every noised input it sent to its own ledger, "
        "which the aggregator never sees: <code>fedfair collaborator ledger --config collaborator.toml</code> "
        f"shows it at the site.{unprotected}</p>"
    )


def _privacy_section(run: Run) -> str:
    from fedfair.runtime.report.figures import epsilons, svg  # matplotlib: loaded only to draw

    series = epsilon_series(run)
    spent = {
        event.get("name"): event.get("round")
        for event in run.events
        if event.get("event") == "status" and event.get("status") == "budget_spent"
    }
    noise = _noise_paragraph(run)
    if not series and not spent:
        return noise or (
            "<p>No DP in this run: no noise inside the secure sums, and no site reported a local epsilon "
            "(sites that train with their own DP-SGD keep it to themselves unless [privacy] share_epsilon).</p>"
        )
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{values[-1]:.4g}</td><td>{rounds[-1]}</td>"
        f"<td>{'round ' + str(spent[name]) if name in spent else ''}</td></tr>"
        for name, (rounds, values) in series.items()
    )
    rows += "".join(
        f"<tr><td>{html.escape(str(name))}</td><td>not shared</td><td></td><td>round {round_number}</td></tr>"
        for name, round_number in spent.items()
        if name not in series
    )
    drawn = svg(epsilons(series)) if series else ""
    return noise + (
        f"{drawn}<table><thead><tr><th>site</th><th>epsilon spent</th><th>as of round</th><th>budget spent</th></tr>"
        f"</thead><tbody>{rows}</tbody></table><p class=note>The cumulative epsilon each site chose to share "
        "([privacy] share_epsilon); sites that keep theirs private are not listed.</p>"
    )


def _stages_section(run: Run) -> str:
    from fedfair.runtime.report.figures import stage_times, svg  # matplotlib: loaded only to draw

    held = _held_up(run)
    timed = [record for record in run.rounds if record.get("stage_seconds")]
    if not timed:
        return "<p>No round has stage times (only applied rounds record them).</p>" + held
    stages = list(dict.fromkeys(stage for record in timed for stage in record["stage_seconds"]))
    figure = stage_times(
        [record["round"] for record in timed],
        {stage_label(stage): [record["stage_seconds"].get(stage, 0.0) for record in timed] for stage in stages},
    )
    return (
        svg(figure)
        + (
            "<p class=note>Seconds the aggregator spent in each stage of a round's training sum, stacked "
            "(the evaluation's stages are not included).</p>"
        )
        + held
    )


def _held_up(run: Run) -> str:
    """The sites that held rounds up (each round record's ``held_up_by``), the longest in all first."""
    waits: dict[str, list[float]] = {}
    for record in run.rounds:
        for name, seconds in (record.get("held_up_by") or {}).items():
            waits.setdefault(name, []).append(float(seconds))
    named = sorted(waits.items(), key=lambda item: -sum(item[1]))
    sites = ", ".join(f"{html.escape(name)} in {len(each)} rounds ({sum(each):.0f} s in all)" for name, each in named)
    return (
        f"<p>Sites that held rounds up (each round waited a second or more for them past its stages' median "
        f"answers; [quorum] grace_factor bounds it): {sites}.</p>"
        if named
        else ""
    )


# ---------------------------------------------------------------- writing


def write_report(folder: Path, out: Path | None = None) -> Path:
    """Draw the report of the output folder `folder` and write it to `out` (default `folder`/report.html) atomically.

    Return its path. A ConfigError names a missing or bad input.
    """
    path = out if out is not None else folder / REPORT_NAME
    page = render(read_run(folder)).encode()
    atomic_write(path, lambda stream: stream.write(page))
    return path


def refresh_report(folder: Path) -> Path | None:
    """:func:`write_report` for the aggregator's end of run.

    Any failure is logged as a warning and None returned, since a report that cannot be drawn must never fail a
    finished federation.
    """
    try:
        path = write_report(folder)
    except Exception as error:  # noqa: BLE001 -- drawing is best effort; the model and logs are written
        logger.warning("the run report was not written to %s: %s", folder / REPORT_NAME, error)
        return None
    logger.info("run report: %s", path)
    return path
