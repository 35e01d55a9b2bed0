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
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.runtime.observe.events import whole_lines
from fedfair.runtime.output_folder import CHECKPOINT_NAME, EVENTS_NAME, ROUND_LOG_NAME
from fedfair.runtime.report import verdicts
from fedfair.runtime.report.data import Cell, Run, contribution_matrix, epsilon_series, roster

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

    def text(self) -> str:
        """The estimate in words, in the form every surface uses (:func:`verdicts.estimate_text`), naming its round."""
        return verdicts.estimate_text(
            (self.worst, self.worst_low, self.worst_high),
            (self.mean, self.mean_low, self.mean_high),
            noised=self.noised,
            round_number=self.round,
        )


@dataclass(frozen=True)
class Waiting:
    """What a running aggregator waits for, before round `round` or at one of its stages, brought to now.

    Its latest ``waiting`` event, its seconds left counted down since it was written.
    """

    round: int
    goal: str
    """Before a round: "the quorum", "everyone" (the first round of a process waits for everyone it can), "the
    auditor" or a voided round's survivors; at a stage: its uploads ("key advertisements", "masked inputs")."""
    connected: int
    """Of the `eligible`: how many are connected (before a round) or have answered (at a stage)."""
    eligible: int
    missing: tuple[str, ...]
    seconds_left: float | None
    """Seconds until it gives up waiting, now (None: no deadline)."""
    since: float
    """When it began naming these sites (Unix time)."""
    stage: str | None = None
    """The stage whose uploads it waits for ("STAGE_ADVERTISE_KEYS"); None: it waits before the round."""
    silent: tuple[str, ...] = ()
    """The `missing` whose task stream is still open: connected, yet not answering (frozen, hung or slow; before a
    round, one an aborted round waited for in vain). The others' streams ended (stopped, killed, cut off)."""

    def line(self) -> str:
        """The one form every view shows.

        "waiting for the quorum: missing site-3, 290 s left (...)" before a round; "round 62: waiting for
        hospital-c's key advertisements, 50 s left (2 of 3 answered; hospital-c connected but not answering)"
        at a stage.
        """
        left = "no deadline" if self.seconds_left is None else f"{self.seconds_left:.0f} s left"
        if self.stage is None:
            silent = f"; {', '.join(self.silent)} connected but not answering" if self.silent else ""
            return (
                f"waiting for {self.goal}: missing {', '.join(self.missing)}, {left} "
                f"({self.connected} of {self.eligible} connected, before round {self.round}{silent})"
            )
        gone = [name for name in self.missing if name not in self.silent]
        how = [f"{', '.join(self.silent)} connected but not answering"] if self.silent else []
        how += [f"{', '.join(gone)} disconnected"] if gone else []
        return (
            f"round {self.round}: waiting for {', '.join(self.missing)}'s {self.goal}, {left} "
            f"({self.connected} of {self.eligible} answered; {'; '.join(how)})"
        )


@dataclass(frozen=True)
class Site:
    """One collaborator as the aggregator sees it."""

    connected: bool
    contributions: int
    """Rounds whose sum holds its input."""
    dropouts: int
    """Times it dropped out: rounds it took part in whose sum does not hold its input (an aborted round that
    names it missing included), and task streams it lost mid-run that no later round holds it through."""
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
    stopped: str | None = None
    """Why the aggregator stopped before its last round (the error line with its fix, or the signal), from its
    ``stop`` event; None while it runs, once it finished, or when it was killed without a word."""
    exit_status: int | None = None
    """The exit status it stopped with (None: see `stopped`)."""
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
    waiting: Waiting | None = None
    """What the aggregator waits for now (None: it does not wait, or it does not run)."""
    auditor: str | None = None
    """The auditor of the two-verifier input bound the run started under (None: no input bound)."""

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
    mean_low, mean_high = verdicts.mean_interval(evaluation)
    return Estimate(
        round=int(evaluation["round"]),
        worst=float(evaluation["worst_risk"]),
        worst_low=low,
        worst_high=high,
        mean=float(evaluation["mean_risk"]),
        mean_low=mean_low,
        mean_high=mean_high,
        noised=verdicts.noised(evaluation),
    )


def _dropped(record: Mapping[str, Any], cells: Mapping[str, Cell]) -> set[str]:
    """Who dropped out of a round: a survivor-less participant, or one an aborted round names missing."""
    missing = {name for names in (record.get("dropped") or {}).values() for name in names}
    return {
        name for name, cell in cells.items() if cell.state == "dropped" or (cell.state == "aborted" and name in missing)
    }


def _lost_streams(
    events: list[dict[str, Any]], rounds: Mapping[int, tuple[Mapping[str, Any], set[str]]], *, running: bool
) -> dict[str, int]:
    """Per site, the task streams it lost mid-run that no round accounts for (each a dropout).

    A ``disconnect`` between a ``start`` and its ``finish`` is settled at the next ``round`` event: nothing more if
    that round counts the site dropped (already a dropout) or holds its input (it came back in time); a dropout
    otherwise (it missed the round, or the round aborted). One still unsettled counts too while the aggregator
    runs (it goes on without the site), and at a ``stop`` (the run stopped without it); when its process is
    gone without one, its own end closed the streams.
    """
    lost: dict[str, int] = {}
    unsettled: set[str] = set()
    for event in events:
        kind = event.get("event")
        if kind == "stop":
            for name in unsettled:
                lost[name] = lost.get(name, 0) + 1
        if kind in ("start", "finish", "stop"):
            unsettled = set()
        elif kind == "disconnect":
            unsettled.add(str(event.get("name")))
        elif kind == "round" and isinstance(event.get("round"), int):
            record, dropped = rounds.get(event["round"], ({}, set()))
            held = set(record.get("contributors", ())) if record.get("status") == "applied" else set()
            for name in unsettled - dropped - held:
                lost[name] = lost.get(name, 0) + 1
            unsettled = set()
    for name in unsettled if running else ():
        lost[name] = lost.get(name, 0) + 1
    return lost


def _waiting(events: list[dict[str, Any]], connected: set[str]) -> Waiting | None:
    """The wait the latest events leave open (a ``waiting`` event no round, start or finish followed), to now.

    A wait names as silent its missing sites `connected` holds (a task stream open now).
    """
    latest: dict[str, Any] | None = None
    since = 0.0
    for event in events:
        kind = event.get("event")
        if kind == "waiting":
            same = latest is not None and (latest.get("round"), latest.get("goal")) == (
                event.get("round"),
                event.get("goal"),
            )
            since = since if same else float(event.get("time") or 0.0)
            latest = event
        elif kind in ("round_start", "round", "start", "finish", "waited"):
            latest = None
    if latest is None:
        return None
    missing = tuple(str(name) for name in latest.get("missing") or ())
    stage = latest.get("stage")
    left = latest.get("seconds_left")
    if isinstance(left, (int, float)):
        left = max(float(left) - (time.time() - float(latest.get("time") or 0.0)), 0.0)
    return Waiting(
        round=int(latest.get("round") or 0),
        goal=str(latest.get("goal")),
        connected=int(latest.get("connected") or 0),
        eligible=int(latest.get("eligible") or 0),
        missing=missing,
        seconds_left=left,
        since=since,
        stage=None if stage is None else str(stage),
        silent=tuple(name for name in missing if name in connected),
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
    stop: dict[str, Any] = {}
    finished, monitoring, connected = False, None, set[str]()
    for event in events:
        kind = event.get("event")
        if kind == "start":
            start, stop, finished, monitoring, connected = event, {}, False, None, set()
        elif kind == "finish":
            finished = True
        elif kind == "stop":
            stop = event
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
    by_round: dict[int, tuple[Mapping[str, Any], set[str]]] = {}
    for record, cells in matrix:
        dropped = _dropped(record, cells)
        by_round[record["round"]] = (record, dropped)
        for name, cell in cells.items():
            counts[name][0] += cell.state in SURVIVED
            counts[name][1] += name in dropped
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
    pid = start.get("pid")
    running = bool(start) and not finished and not stop and _alive(pid)
    lost = _lost_streams(events, by_round, running=running)
    sites = {
        name: Site(
            connected=name in connected,
            contributions=counts[name][0],
            dropouts=counts[name][1] + lost.get(name, 0),
            last=last_cells[name].state if name in last_cells else "absent",
            epsilon=shared.get(name),
            held_up_seconds=held.get(name),
        )
        for name in names
    }
    return FederationState(
        folder=str(folder),
        federation_id=start.get("federation_id"),
        plan_digest=start.get("plan_digest"),
        auditor=start.get("auditor"),
        rounds_planned=start.get("rounds"),
        pid=pid,
        running=running,
        finished=finished,
        stopped=None if not stop else str(stop.get("reason")),
        exit_status=stop.get("status"),
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
        waiting=_waiting(events, connected) if running else None,
    )
