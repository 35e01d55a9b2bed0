"""What ``fedfair report`` reads of an aggregator's output folder, as data.

The round records, the events, and what the page tabulates from them (who took
part in each round, the epsilon each site shared). :mod:`fedfair.runtime.report.page` draws it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.runtime.output_folder import COMPARISON_NAME, EVENTS_NAME, ROUND_LOG_NAME
from fedfair.secagg.round import stage_words

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
    """What an output folder says about its run: round records and events."""

    folder: Path
    rounds: list[dict[str, Any]]
    events: list[dict[str, Any]]
    comparison: dict[str, Any] | None = None
    """``comparison.json`` where `fedfair launch` wrote one: {"rho", "exact": {model: exact report} or None,
    "private": the federation's own final evaluation}."""


@dataclass(frozen=True)
class Cell:
    """One collaborator in one round: a key of :data:`CELLS` and what hovering over it says."""

    state: str
    detail: str


def read_json_lines(path: Path, what: str, fix: str) -> list[dict[str, Any]]:
    """Every object of the JSON-lines file `path`.

    A ConfigError naming the file, the line and `fix` for a line that is not a JSON object (`what` names what a
    line should be).
    """
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


def read_run(folder: Path) -> Run:
    """Everything the report shows, read from the output folder `folder` (events optional)."""
    rounds = read_rounds(folder)
    events_path = folder / EVENTS_NAME
    events = (
        read_json_lines(
            events_path, "an event", "delete that line (the report needs whole events only) or restore the file"
        )
        if events_path.is_file()
        else []
    )
    comparison_path = folder / COMPARISON_NAME
    comparison = None
    if comparison_path.is_file():
        try:
            comparison = json.loads(comparison_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ConfigError(
                f"{comparison_path} cannot be read ({error}): delete it (the report is drawn without the comparison)"
            ) from error
    return Run(folder, rounds, events, comparison)


def roster(run: Run) -> list[str]:
    """The collaborators.

    Each ``start`` event's roster in order (a resume may run a longer one), then any other name the round
    records mention (a log without events has only those).
    """
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
    the aggregator itself reads them (:func:`fedfair.runtime.aggregator.checkpoint.excluded_in`).
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
                missed.setdefault(name, []).append(stage_label(stage))
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
    """Each site's cumulative epsilon by round, from the ``round`` events: site -> (rounds, epsilons).

    A site that never shared its epsilon has none; a round re-run after a restart keeps its later event.
    """
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


START_WORDS: dict[str, str] = {"JOIN": "joining", "TRAIN": "training", "EVALUATE": "evaluation"}
"""The runtime's own stages, before a secure round's, in words a reader of the report knows; a secure round's stages
say theirs in their declaration (:attr:`~fedfair.secagg.round.StageSpec.words`). The protocol's names are in
rounds.jsonl."""


def stage_label(stage: str) -> str:
    """A stage's name as the page shows it.

    "upload" for "STAGE_MASKED_INPUT", "evaluation: upload" for "STAGE_EVAL_MASKED_INPUT"; a stage with no words of
    its own, in lower case.
    """
    name = stage.removeprefix("STAGE_")
    evaluation = name.startswith("EVAL_")
    bare = name.removeprefix("EVAL_")
    words = START_WORDS.get(bare) or stage_words(bare) or name.lower().replace("_", " ")
    return f"evaluation: {words}" if evaluation else words


def input_bound_words(auditor: object) -> str:
    """What the status and the report say of the run's input bound, from its start event's `auditor`."""
    if not auditor:
        return "input bound off"
    return f"input bound on: every training update proven within its bound to the aggregator and the auditor {auditor}"
