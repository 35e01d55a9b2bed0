"""``fedfair report OUTPUT_DIR``: one self-contained HTML page of an aggregator's run.

The page is drawn from what the aggregator writes into its output folder:

- ``rounds.jsonl`` (one record per round, trimmed on resume, so one per round the model
  went through): who took part, contributed, dropped out or was excluded; c and c-bar;
  each stage's seconds; the federated evaluation's held-out risks;
- ``events.jsonl`` (optional): the federation's id and roster (``start``), the epsilon each
  site chose to share (``round``), spent budgets (``status``);
- ``model_bundle.pt`` (optional, read as data with ``torch.load(weights_only=True)`` by
  :func:`fedfair.bundle.load_bundle`): only its number of classes K, for the reference line
  the research figures draw too, the uniform classifier's risk ln K. The round records carry
  no baseline of their own; without a readable bundle the page says so and draws none.

The figures are inline SVG (:mod:`fedfair.runtime.report_figures`) and the style sheet is in
the page, so it opens from a file, offline, anywhere. The page is written to a temporary
file and renamed (:func:`fedfair.core.files.atomic_write`): a failure leaves the previous
report or none, never half of one. The aggregator refreshes it at the end of a run
(:func:`refresh_report`), where a failure to draw is a warning, never the run's failure.

This module imports neither torch nor matplotlib at load time, so ``fedfair report --help``
starts at once: the figures, the round log's and the bundle's modules are imported when a
report is drawn.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write
from fedfair.runtime.aggregator.events import EVENTS_NAME

logger = logging.getLogger("fedfair.report")

REPORT_NAME = "report.html"
"""The report's file name in the aggregator's output folder."""

ROUND_LOG_FIX = (
    "a torn last line is dropped by `fedfair aggregator start --resume`; otherwise restore the file from a backup"
)

CELLS: dict[str, tuple[str, str]] = {
    "contributed": ("\u2713", "contributed"),
    "late": ("\u2713", "contributed, then missed a later stage (the sum did not need it)"),
    "dropped": ("\u2717", "dropped out: took part but its input is not in the sum"),
    "excluded": ("\u2298", "excluded in this round (a proven fault; named on hover)"),
    "aborted": ("\u2013", "took part in a round that was aborted (model unchanged)"),
    "out": ("\u00b7", "left out: excluded in an earlier round and not re-admitted"),
    "absent": ("", "not taking part (not connected)"),
}
"""Each state of a (round, collaborator) cell of the contribution matrix: its mark and its legend."""


@dataclass(frozen=True)
class Run:
    """What an output folder says about its run: round records, events, the model's number of classes."""

    folder: Path
    rounds: list[dict[str, Any]]
    events: list[dict[str, Any]]
    classes: int | None
    classes_note: str
    """Where `classes` came from, or why it is unknown."""


@dataclass(frozen=True)
class Cell:
    """One collaborator in one round: a key of :data:`CELLS` and what hovering over it says."""

    state: str
    detail: str


def read_json_lines(path: Path, what: str, fix: str) -> list[dict[str, Any]]:
    """Every object of the JSON-lines file `path`; a ConfigError naming the file, the line and `fix`
    for a line that is not a JSON object (`what` names what a line should be)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path} cannot be read ({error}); {fix}") from None
    records: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise ConfigError(f"{path} line {number} is not {what} ({error}); {fix}") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path} line {number} is not {what} (not a JSON object); {fix}")
        records.append(record)
    return records


def read_rounds(folder: Path) -> list[dict[str, Any]]:
    """The round records of `folder`/rounds.jsonl, each with an integer ``round`` and a ``status``."""
    from fedfair.runtime.aggregator.checkpoint import ROUND_LOG_NAME  # imports torch: not at --help

    path = folder / ROUND_LOG_NAME
    if not path.is_file():
        raise ConfigError(
            f"{path} does not exist: give `fedfair report` an aggregator's output folder (the plan's "
            "[aggregator] output) once a round has finished there"
        )
    records = read_json_lines(path, "a round record", ROUND_LOG_FIX)
    for number, record in enumerate(records, start=1):
        if not isinstance(record.get("round"), int) or not isinstance(record.get("status"), str):
            raise ConfigError(f"{path} record {number} has no integer round or no status; {ROUND_LOG_FIX}")
    if not records:
        raise ConfigError(f"{path} holds no round yet; run `fedfair report` again once a round has finished")
    return records


def bundle_classes(folder: Path) -> tuple[int | None, str]:
    """The number of classes of the model bundle in `folder`, and where it came from (or why it is unknown)."""
    from fedfair.bundle import load_bundle
    from fedfair.runtime.aggregator.bundles import BUNDLE_NAME

    path = folder / BUNDLE_NAME
    if not path.is_file():
        return None, f"no model bundle ({path.name}) in the folder to read the number of classes from"
    try:
        bundle = load_bundle(path)
    except ConfigError as error:
        return None, f"the model bundle could not be read: {error}"
    # A built-in architecture names its classes; under a [schema] the encoder lists them.
    classes = bundle.architecture.get("classes")
    if not isinstance(classes, int) and bundle.encoder is not None:
        classes = len(bundle.encoder["schema"]["classes"])
    if not isinstance(classes, int):
        return None, "the model bundle's architecture (a factory) names no number of classes"
    return classes, f"K = {classes} classes, from the model bundle"


def read_run(folder: Path) -> Run:
    """Everything the report shows, read from the output folder `folder` (events and bundle optional)."""
    rounds = read_rounds(folder)
    events_path = folder / EVENTS_NAME
    events = (
        read_json_lines(
            events_path, "an event", "delete that line (the report needs whole events only) or restore the file"
        )
        if events_path.is_file()
        else []
    )
    classes, note = bundle_classes(folder)
    return Run(folder, rounds, events, classes, note)


def uniform_risk(classes: int) -> float:
    """ln K, the cross-entropy of the uniform classifier on K classes (a one-logit binary model: ln 2)."""
    return math.log(max(classes, 2))


def roster(run: Run) -> list[str]:
    """The collaborators: each ``start`` event's roster in order (a resume may run a longer one), then
    any other name the round records mention (a log without events has only those)."""
    names = [name for event in run.events if event.get("event") == "start" for name in event.get("collaborators", ())]
    for record in run.rounds:
        names.extend(record.get("participants", ()))
        names.extend(sorted(_excluded(record)))
    return list(dict.fromkeys(names))


def _excluded(record: Mapping[str, Any]) -> dict[str, str]:
    """Who a round excluded, with why: its training's exclusions, then its evaluation's."""
    evaluation = record.get("evaluation") or {}
    return {**(record.get("excluded") or {}), **(evaluation.get("excluded") or {})}


def contribution_matrix(run: Run, names: Sequence[str]) -> list[tuple[Mapping[str, Any], dict[str, Cell]]]:
    """Each round record with the cell of every collaborator in `names` (see :data:`CELLS`).

    Exclusions last until a record re-admits the name (``readmitted``, from ``--readmit``), as
    the aggregator itself reads them (:func:`fedfair.runtime.aggregator.loop.excluded_in`).
    """
    rows: list[tuple[Mapping[str, Any], dict[str, Cell]]] = []
    left_out: dict[str, str] = {}
    for record in run.rounds:
        excluded = _excluded(record)
        participants = set(record.get("participants", ()))
        contributors = set(record.get("contributors", ()))
        missed: dict[str, list[str]] = {}
        for stage, missing in (record.get("dropped") or {}).items():
            for name in missing:
                missed.setdefault(name, []).append(_stage_label(stage))
        cells = {}
        for name in names:
            stages = ", ".join(missed.get(name, ())) or "none"
            if name in excluded:
                cells[name] = Cell("excluded", f"excluded: {excluded[name]}")
            elif record["status"] == "aborted" and name in participants:
                cells[name] = Cell("aborted", f"round aborted: {record.get('reason', 'no reason recorded')}")
            elif name in contributors:
                cells[name] = Cell("late", f"missed {stages}") if name in missed else Cell("contributed", "")
            elif name in participants:
                cells[name] = Cell("dropped", f"missed stages: {stages}")
            elif name in left_out:
                cells[name] = Cell("out", f"excluded earlier: {left_out[name]}")
            else:
                cells[name] = Cell("absent", "")
        rows.append((record, cells))
        left_out.update(excluded)
        for name in record.get("readmitted") or ():
            left_out.pop(name, None)
    return rows


def epsilon_series(run: Run) -> dict[str, tuple[list[int], list[float]]]:
    """Each site's cumulative epsilon by round, from the ``round`` events (a site that never shared
    its epsilon has none); a round re-run after a restart keeps its later event."""
    by_round: dict[int, Mapping[str, Any]] = {}
    for event in run.events:
        if event.get("event") == "round" and isinstance(event.get("round"), int):
            by_round[event["round"]] = event.get("epsilon") or {}
    series: dict[str, tuple[list[int], list[float]]] = {}
    for round_number in sorted(by_round):
        for name, epsilon in by_round[round_number].items():
            if isinstance(epsilon, (int, float)):
                rounds, values = series.setdefault(name, ([], []))
                rounds.append(round_number)
                values.append(float(epsilon))
    return series


def _stage_label(stage: str) -> str:
    return stage.removeprefix("STAGE_")


# ---------------------------------------------------------------- the page


def render(run: Run) -> str:
    """The report of `run` as one HTML document, with no reference outside itself."""
    start: Mapping[str, Any] = next((event for event in reversed(run.events) if event.get("event") == "start"), {})
    title = f"fedfair run report: {start.get('federation_id', run.folder.name)}"
    sections = (
        ("risks", "Worst-group and mean risk", _risks_section(run)),
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
        f"<h1>{html.escape(title)}</h1>{_summary(run, start)}<ul class=contents>{contents}</ul>{body}"
        "</body></html>\n"
    )


STYLE = """
body{font-family:sans-serif;margin:1.5em auto;max-width:60em;color:#222}
h2{border-bottom:1px solid #ccc;margin-top:1.6em}
.note{color:#555;font-size:.9em}
table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:.15em .4em;text-align:center}
th.name{writing-mode:vertical-rl;transform:rotate(180deg);white-space:nowrap}
.matrix{overflow-x:auto}
.contributed{background:#c8e6c9}.late{background:#e6f4d7}.dropped{background:#ffcdd2;font-weight:bold}
.excluded{background:#b71c1c;color:#fff}.aborted{background:#ffe0b2}.out{background:#e0e0e0}.absent{background:#fff}
svg{max-width:100%;height:auto}
"""


def _summary(run: Run, start: Mapping[str, Any]) -> str:
    statuses = [record["status"] for record in run.rounds]
    secure = {bool(record.get("secure_aggregation")) for record in run.rounds}
    resumes = sum(1 for event in run.events if event.get("event") == "start" and event.get("resume"))
    planned = f" of {start['rounds']} planned" if "rounds" in start else ""
    return (
        f'<p class="summary">Output folder <code>{html.escape(str(run.folder))}</code>: '
        f"{len(run.rounds)} rounds recorded{planned} ({statuses.count('applied')} applied, "
        f"{statuses.count('aborted')} aborted); secure aggregation {'on' if secure == {True} else 'off'}; "
        f"{resumes} resumed start(s).</p>"
    )


def _risks_section(run: Run) -> str:
    from fedfair.runtime.report_figures import risks, svg  # matplotlib: loaded only to draw

    done = [record["evaluation"] for record in run.rounds if (record.get("evaluation") or {}).get("status") == "done"]
    others = [
        f"round {record['round']}: evaluation {html.escape(str(record['evaluation'].get('status')))} "
        f"({html.escape(str(record['evaluation'].get('reason', '')))})"
        for record in run.rounds
        if (record.get("evaluation") or {}).get("status") not in (None, "done")
    ]
    if run.classes is None:
        baseline = f"No uniform baseline drawn: {html.escape(run.classes_note)}."
    else:
        baseline = (
            f"The dashed line is the uniform classifier's risk ln K = {uniform_risk(run.classes):.4f} "
            f"({html.escape(run.classes_note)}): a model above it on its worst group does worse there than guessing."
        )
    note = (
        "<p class=note>The federated evaluation of the output model (theta-bar, c-bar) on the sites' held-out data, "
        f"from secure sums, at each evaluated round. {baseline}</p>"
    )
    skipped = f"<p class=note>{'; '.join(others)}.</p>" if others else ""
    if not done:
        return f"<p>No round has a finished evaluation yet.</p>{skipped}"
    figure = risks(
        [item["round"] for item in done],
        [item["worst_risk"] for item in done],
        [item["mean_risk"] for item in done],
        None if run.classes is None else uniform_risk(run.classes),
    )
    return svg(figure) + note + skipped


def _applied(run: Run) -> list[dict[str, Any]]:
    return [record for record in run.rounds if record["status"] == "applied"]


def _threshold_section(run: Run) -> str:
    from fedfair.runtime.report_figures import svg, thresholds  # matplotlib: loaded only to draw

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
        rows.append(f'<tr data-round="{record["round"]}"><th>{record["round"]}</th><td>{record["status"]}</td>{marks}</tr>')
    legend = "".join(f'<li><span class="{state}">&nbsp;{mark}&nbsp;</span> {text}</li>' for state, (mark, text) in CELLS.items())
    return (
        f'<div class="matrix"><table><thead><tr><th>round</th><th>status</th>{header}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div><ul class=note>{legend}</ul>"
    )


def _privacy_section(run: Run) -> str:
    from fedfair.runtime.report_figures import epsilons, svg  # matplotlib: loaded only to draw

    series = epsilon_series(run)
    spent = {
        event.get("name"): event.get("round")
        for event in run.events
        if event.get("event") == "status" and event.get("status") == "budget_spent"
    }
    if not series and not spent:
        return (
            "<p>No DP in this run: no site reported an epsilon. Either no site trains with differential "
            "privacy, or those that do keep their epsilon to themselves ([privacy] share_epsilon = false, "
            "the default).</p>"
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
    return (
        f"{drawn}<table><thead><tr><th>site</th><th>epsilon spent</th><th>as of round</th><th>budget spent</th></tr>"
        f"</thead><tbody>{rows}</tbody></table><p class=note>The cumulative epsilon each site chose to share "
        "([privacy] share_epsilon); sites that keep theirs private are not listed.</p>"
    )


def _stages_section(run: Run) -> str:
    from fedfair.runtime.report_figures import stage_times, svg  # matplotlib: loaded only to draw

    timed = [record for record in run.rounds if record.get("stage_seconds")]
    if not timed:
        return "<p>No round has stage times (only applied rounds record them).</p>"
    stages = list(dict.fromkeys(stage for record in timed for stage in record["stage_seconds"]))
    figure = stage_times(
        [record["round"] for record in timed],
        {_stage_label(stage): [record["stage_seconds"].get(stage, 0.0) for record in timed] for stage in stages},
    )
    return svg(figure) + (
        "<p class=note>Seconds the aggregator spent in each stage of a round's training sum, stacked "
        "(the evaluation's stages are not included).</p>"
    )


# ---------------------------------------------------------------- writing


def write_report(folder: Path, out: Path | None = None) -> Path:
    """Draw the report of the output folder `folder` and write it to `out` (default
    `folder`/report.html) atomically; return its path. A ConfigError names a missing or bad input."""
    path = out if out is not None else folder / REPORT_NAME
    page = render(read_run(folder)).encode()
    atomic_write(path, lambda stream: stream.write(page))
    return path


def refresh_report(folder: Path) -> Path | None:
    """:func:`write_report` for the aggregator's end of run: any failure is logged as a warning and
    None returned, since a report that cannot be drawn must never fail a finished federation."""
    try:
        path = write_report(folder)
    except Exception as error:  # noqa: BLE001 -- drawing is best effort; the model and logs are written
        logger.warning("the run report was not written to %s: %s", folder / REPORT_NAME, error)
        return None
    logger.info("run report: %s", path)
    return path


def _report_command(args: argparse.Namespace) -> int:
    path = write_report(args.output_dir, args.out)
    print(f"wrote {path}")
    return 0


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair report OUTPUT_DIR`."""
    parser = subparsers.add_parser(
        "report",
        help="draw an aggregator's run as one self-contained HTML page",
        description="Draw the run in an aggregator's output folder (rounds.jsonl, events.jsonl, the model bundle) "
        "as one HTML page: risks, threshold, who took part, DP epsilon, stage times. No network needed to view it.",
    )
    parser.add_argument("output_dir", type=Path, metavar="OUTPUT_DIR", help="the aggregator's output folder")
    parser.add_argument("--out", type=Path, help=f"where to write the page (default OUTPUT_DIR/{REPORT_NAME})")
    parser.set_defaults(handler=_report_command)
