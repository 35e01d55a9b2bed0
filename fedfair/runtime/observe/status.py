"""A federation's state now, from its aggregator's output folder: what metrics, the status page and `status` show.

Read afresh at each call from the events (:data:`~fedfair.runtime.observe.events.EVENTS`), the
round log and the checkpoint's presence, so a scrape, a page load or ``fedfair status`` always
agrees with the files and the aggregator's round code holds no extra state for them. Figures are
aggregates of rounds and sites, never of a record.

Why: docs/operations.md, "Monitoring".
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.runtime.output_folder import EVENTS_NAME
from fedfair.runtime.observe.events import whole_lines
from fedfair.runtime.report import verdicts
from fedfair.runtime.report.data import Run, contribution_matrix, epsilon_series, roster
from fedfair.runtime.output_folder import CHECKPOINT_NAME, ROUND_LOG_NAME

SURVIVED = ("contributed", "late")
"""The contribution-matrix cells of a site whose input is in the round's sum."""


@dataclass(frozen=True)
class Estimate:
    """The latest finished federated evaluation: worst-group and mean risk, each with its interval."""

    round: int
    worst: float
    worst_low: float
    worst_high: float
    mean: float
    mean_low: float
    mean_high: float
    noised: bool


@dataclass(frozen=True)
class Site:
    """One collaborator as the aggregator sees it."""

    connected: bool
    contributions: int
    """Rounds whose sum holds its input."""
    dropouts: int
    """Rounds it took part in and whose sum does not hold its input (aborted rounds not counted)."""
    last: str
    """Its cell in the last round (a key of fedfair.runtime.report.data.CELLS)."""
    epsilon: float | None
    """The cumulative epsilon it last shared (None: it shares none)."""
    held_up_seconds: float | None
    """How long it held the last round up past the median answer, if it did."""


@dataclass(frozen=True)
class FederationState:
    """What an output folder says about its federation now; every field a JSON value once ``asdict``-ed."""

    folder: str
    federation_id: str | None = None
    plan_digest: str | None = None
    rounds_planned: int | None = None
    pid: int | None = None
    running: bool = False
    """A ``start`` with no ``finish`` after it, and its process is alive on this machine."""
    finished: bool = False
    started: float | None = None
    updated: float | None = None
    """The time of the latest event."""
    monitoring_url: str | None = None
    checkpoint: bool = False
    rounds_completed: int = 0
    rounds_aborted: int = 0
    last_round: int | None = None
    last_status: str | None = None
    last_reason: str | None = None
    last_seconds: float | None = None
    last_stage_seconds: dict[str, float] = field(default_factory=dict)
    round_seconds: tuple[int, float] = (0, 0.0)
    """(count, sum) over the finished rounds with a duration."""
    stage_seconds: dict[str, tuple[int, float]] = field(default_factory=dict)
    """Each stage's (count, sum) over the applied rounds."""
    bytes_received: int = 0
    held_up_by: dict[str, float] = field(default_factory=dict)
    estimate: Estimate | None = None
    sites: dict[str, Site] = field(default_factory=dict)
    excluded: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The state as JSON values (what ``fedfair status --json`` prints)."""
        return dataclasses.asdict(self)


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        return whole_lines(path)
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(
            f"{path} cannot be read as JSON lines ({error}); restore it from a backup, or delete the damaged line"
        ) from None


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return True


def estimate_of(evaluation: Mapping[str, Any]) -> Estimate:
    """A finished evaluation's estimates with their intervals (the run report's, fedfair.runtime.report.verdicts)."""
    low, high = verdicts.worst_interval(evaluation)
    mean = float(evaluation["mean_risk"])
    spread = float(evaluation.get("mean_error_bound") or 0.0)
    return Estimate(
        round=int(evaluation["round"]),
        worst=float(evaluation["worst_risk"]),
        worst_low=low,
        worst_high=high,
        mean=mean,
        mean_low=mean - spread,
        mean_high=mean + spread,
        noised=verdicts.noised(evaluation),
    )


def federation_state(folder: Path) -> FederationState:
    """The state of the federation whose aggregator writes to `folder`.

    Raises:
        ConfigError: `folder` is no aggregator's output folder, or one of its logs is damaged.
    """
    if not (folder / EVENTS_NAME).is_file() and not (folder / ROUND_LOG_NAME).is_file():
        raise ConfigError(
            f"{folder} holds neither {EVENTS_NAME} nor {ROUND_LOG_NAME}: give the aggregator's output folder (the "
            "plan's [aggregator] output), once its aggregator has started"
        )
    events, records = _lines(folder / EVENTS_NAME), _lines(folder / ROUND_LOG_NAME)
    run = Run(folder, records, events)
    start: dict[str, Any] = {}
    finished, monitoring, connected = False, None, set[str]()
    for event in events:
        kind = event.get("event")
        if kind == "start":
            start, finished, monitoring, connected = event, False, None, set()
        elif kind == "finish":
            finished = True
        elif kind == "monitoring":
            monitoring = event.get("url")
        elif kind == "connect":
            connected.add(str(event.get("name")))
        elif kind == "disconnect":
            connected.discard(str(event.get("name")))
    names = roster(run)
    matrix = contribution_matrix(run, names)
    counts = {name: [0, 0] for name in names}
    stages: dict[str, tuple[int, float]] = {}
    timed, total_seconds, received = 0, 0.0, 0
    estimate = None
    excluded: dict[str, str] = {}
    for record, cells in matrix:
        for name, cell in cells.items():
            counts[name][0] += cell.state in SURVIVED
            counts[name][1] += cell.state == "dropped"
        if isinstance(record.get("seconds"), (int, float)):
            timed, total_seconds = timed + 1, total_seconds + float(record["seconds"])
        for stage, seconds in (record.get("stage_seconds") or {}).items():
            count, summed = stages.get(stage, (0, 0.0))
            stages[stage] = (count + 1, summed + float(seconds))
        received += int(record.get("received_bytes") or 0)
        evaluation = record.get("evaluation") or {}
        if evaluation.get("status") == "done":
            estimate = estimate_of(evaluation)
        excluded.update({**(record.get("excluded") or {}), **(evaluation.get("excluded") or {})})
        for name in record.get("readmitted") or ():
            excluded.pop(name, None)
    shared = {name: values[-1] for name, (_, values) in epsilon_series(run).items()}
    last, last_cells = matrix[-1] if matrix else ({}, {})
    held = {str(name): float(seconds) for name, seconds in (last.get("held_up_by") or {}).items()}
    sites = {
        name: Site(
            connected=name in connected,
            contributions=counts[name][0],
            dropouts=counts[name][1],
            last=last_cells[name].state if name in last_cells else "absent",
            epsilon=shared.get(name),
            held_up_seconds=held.get(name),
        )
        for name in names
    }
    pid = start.get("pid")
    return FederationState(
        folder=str(folder),
        federation_id=start.get("federation_id"),
        plan_digest=start.get("plan_digest"),
        rounds_planned=start.get("rounds"),
        pid=pid,
        running=bool(start) and not finished and _alive(pid),
        finished=finished,
        started=start.get("time"),
        updated=events[-1].get("time") if events else None,
        monitoring_url=monitoring,
        checkpoint=(folder / CHECKPOINT_NAME).is_file(),
        rounds_completed=sum(record.get("status") == "applied" for record in records),
        rounds_aborted=sum(record.get("status") == "aborted" for record in records),
        last_round=last.get("round"),
        last_status=last.get("status"),
        last_reason=last.get("reason"),
        last_seconds=last.get("seconds"),
        last_stage_seconds={str(key): float(value) for key, value in (last.get("stage_seconds") or {}).items()},
        round_seconds=(timed, total_seconds),
        stage_seconds=stages,
        bytes_received=received,
        held_up_by=held,
        estimate=estimate,
        sites=sites,
        excluded=excluded,
    )
