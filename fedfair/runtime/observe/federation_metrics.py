"""The aggregator's Prometheus metrics: families computed at each scrape from the federation's state.

:class:`FederationCollector` reads :func:`fedfair.runtime.observe.status.federation_state` of the output folder
(events and round log) whenever it is collected, so the round code only starts the endpoint
(:func:`start_monitoring`). :data:`FAMILIES` names every family with its type, unit and meaning;
docs/operations.md lists them (tests/runtime/test_monitoring.py keeps the two equal).

Why: docs/operations.md, "Monitoring".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.runtime.observe.events import EventLog
from fedfair.runtime.observe.status_page import status_page
from fedfair.runtime.observe.endpoint import Endpoint, MonitoringSettings, serve_monitoring
from fedfair.runtime.observe.status import FederationState, federation_state

logger = logging.getLogger("fedfair.aggregator")

FAMILIES: dict[str, tuple[str, str]] = {
    "fedfair_federation_info": ("info", "the federation's id and the plan digest its aggregator serves"),
    "fedfair_running": ("gauge", "1 from the aggregator's start until its last round is done, while its process lives"),
    "fedfair_rounds_planned": ("gauge", "the plan's number of training rounds"),
    "fedfair_rounds_completed_total": ("counter", "training rounds applied to the model"),
    "fedfair_rounds_aborted_total": ("counter", "training rounds aborted (model unchanged)"),
    "fedfair_last_round": ("gauge", "the number of the last finished round"),
    "fedfair_round_duration_seconds": ("summary", "seconds each finished round took, quorum wait excluded"),
    "fedfair_last_round_duration_seconds": ("gauge", "seconds the last finished round took"),
    "fedfair_stage_duration_seconds": ("summary", "seconds each stage of the applied rounds took, by stage"),
    "fedfair_last_stage_duration_seconds": ("gauge", "seconds each stage of the last applied round took"),
    "fedfair_received_bytes_total": ("counter", "bytes of uploads the aggregator received in finished rounds"),
    "fedfair_last_round_survivors": ("gauge", "sites whose input is in the last round's sum"),
    "fedfair_last_round_dropouts": ("gauge", "sites that took part in the last round but are not in its sum"),
    "fedfair_last_round_dropped": ("gauge", "1 for a site that dropped out of the last round, else 0, by site"),
    "fedfair_last_round_held_up_seconds": ("gauge", "seconds a site held the last round up past the median answer"),
    "fedfair_site_connected": ("gauge", "1 while a site has a task stream open, by site"),
    "fedfair_site_contributions_total": ("counter", "rounds whose sum holds the site's input, by site"),
    "fedfair_site_dropouts_total": (
        "counter",
        "times the site dropped out: rounds it took part in without its input in the sum, or a task stream lost "
        "mid-run, by site",
    ),
    "fedfair_waiting_for": (
        "gauge",
        "1 for a site the aggregator waits for now (before a round, or at one of its stages), else 0, by site",
    ),
    "fedfair_waiting_stage": (
        "gauge",
        "1 for what the aggregator waits for now, by stage: a stage's uploads (key advertisements, masked inputs, "
        "...) or, before a round, the quorum, everyone or the auditor",
    ),
    "fedfair_waiting_seconds_left": ("gauge", "seconds until the aggregator gives up its wait now (no sample: none)"),
    "fedfair_site_excluded": ("gauge", "1 for a site excluded for misbehaving and not re-admitted, by site"),
    "fedfair_site_epsilon_shared": ("gauge", "the cumulative epsilon a site last shared (share_epsilon), by site"),
    "fedfair_estimate_round": ("gauge", "the round of the latest federated evaluation"),
    "fedfair_worst_group_risk": ("gauge", "the latest worst rho-fraction risk estimate (loss units)"),
    "fedfair_worst_group_risk_lower": ("gauge", "the lower end of its interval (95% noised, or certified)"),
    "fedfair_worst_group_risk_upper": ("gauge", "the upper end of its interval"),
    "fedfair_mean_risk": ("gauge", "the latest mean risk estimate (loss units)"),
    "fedfair_mean_risk_lower": ("gauge", "the lower end of its interval"),
    "fedfair_mean_risk_upper": ("gauge", "the upper end of its interval"),
    "fedfair_last_event_timestamp_seconds": ("gauge", "when the aggregator last wrote an event (Unix time)"),
}
"""Every family of the aggregator's endpoint: its type and meaning (its unit is in its name)."""

SITE = ("site",)


def _family(name: str, labels: tuple[str, ...] = ()) -> Any:
    """An empty family `name` of the type :data:`FAMILIES` gives it (prometheus_client's own classes)."""
    from prometheus_client import core  # the HTTP stack only for a party that serves metrics

    kind, meaning = FAMILIES[name]
    classes = {
        "info": core.InfoMetricFamily,
        "gauge": core.GaugeMetricFamily,
        "counter": core.CounterMetricFamily,
        "summary": core.SummaryMetricFamily,
    }
    # The client adds _total and _info itself: a family is named without them.
    base = name.removesuffix("_total") if kind == "counter" else name.removesuffix("_info")
    return classes[kind](base, meaning, labels=list(labels))


def families(state: FederationState) -> Iterator[Any]:
    """The metric families of `state`: nothing per record, only rounds, stages and sites."""
    info = _family("fedfair_federation_info")
    info.add_metric([], {"federation_id": state.federation_id or "", "plan_digest": state.plan_digest or ""})
    yield info
    figures: dict[str, float | None] = {
        "fedfair_running": float(state.running),
        "fedfair_rounds_planned": state.rounds_planned,
        "fedfair_rounds_completed_total": state.rounds_completed,
        "fedfair_rounds_aborted_total": state.rounds_aborted,
        "fedfair_last_round": state.last_round,
        "fedfair_last_round_duration_seconds": state.last_seconds,
        "fedfair_received_bytes_total": state.bytes_received,
        "fedfair_last_event_timestamp_seconds": state.updated,
    }
    survivors = sum(site.last in ("contributed", "late") for site in state.sites.values())
    dropouts = sum(site.last == "dropped" for site in state.sites.values())
    if state.last_round is not None:
        figures.update(fedfair_last_round_survivors=survivors, fedfair_last_round_dropouts=dropouts)
    estimate = state.estimate
    if estimate is not None:
        figures.update(
            fedfair_estimate_round=estimate.round,
            fedfair_worst_group_risk=estimate.worst,
            fedfair_worst_group_risk_lower=estimate.worst_low,
            fedfair_worst_group_risk_upper=estimate.worst_high,
            fedfair_mean_risk=estimate.mean,
            fedfair_mean_risk_lower=estimate.mean_low,
            fedfair_mean_risk_upper=estimate.mean_high,
        )
    for name, value in figures.items():
        if value is not None:
            family = _family(name)
            family.add_metric([], float(value))
            yield family
    rounds = _family("fedfair_round_duration_seconds")
    rounds.add_metric([], *state.round_seconds)
    yield rounds
    stages, last_stages = (
        _family("fedfair_stage_duration_seconds", ("stage",)),
        _family("fedfair_last_stage_duration_seconds", ("stage",)),
    )
    for stage, (count, summed) in sorted(state.stage_seconds.items()):
        stages.add_metric([stage], count, summed)
    for stage, seconds in sorted(state.last_stage_seconds.items()):
        last_stages.add_metric([stage], seconds)
    yield stages
    yield last_stages
    # Served while nothing is waited for too, without a sample: a scrape then shows the family, and no stale wait.
    waiting, left = _family("fedfair_waiting_stage", ("stage",)), _family("fedfair_waiting_seconds_left")
    if state.waiting is not None:
        waiting.add_metric([state.waiting.goal], 1.0)
        if state.waiting.seconds_left is not None:
            left.add_metric([], state.waiting.seconds_left)
    yield waiting
    yield left
    yield from _site_families(state)


def _site_families(state: FederationState) -> Iterator[Any]:
    """The per-site families: one series per collaborator of the roster, never per record."""
    per_site: dict[str, Callable[[str], float | None]] = {
        "fedfair_site_connected": lambda name: float(state.sites[name].connected),
        "fedfair_site_contributions_total": lambda name: state.sites[name].contributions,
        "fedfair_site_dropouts_total": lambda name: state.sites[name].dropouts,
        "fedfair_site_excluded": lambda name: float(name in state.excluded),
        "fedfair_last_round_dropped": lambda name: float(state.sites[name].last == "dropped"),
        "fedfair_last_round_held_up_seconds": lambda name: state.sites[name].held_up_seconds,
        "fedfair_site_epsilon_shared": lambda name: state.sites[name].epsilon,
        "fedfair_waiting_for": lambda name: float(state.waiting is not None and name in state.waiting.missing),
    }
    for family_name, value_of in per_site.items():
        family = _family(family_name, SITE)
        for name in state.sites:
            value = value_of(name)
            if value is not None:
                family.add_metric([name], float(value))
        yield family


class FederationCollector:
    """A prometheus_client collector of the federation whose aggregator writes to `folder`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def describe(self) -> list[Any]:
        """Nothing: the registry then does not collect at registration, before the folder has events."""
        return []

    def collect(self) -> Iterator[Any]:
        """The families of the folder's state now (none while it holds no event yet)."""
        try:
            state = federation_state(self.folder)
        except ConfigError as error:
            logger.debug("no metrics yet: %s", error)
            return
        yield from families(state)


def start_monitoring(folder: Path, settings: MonitoringSettings, events: EventLog) -> Endpoint:
    """Serve the federation of `folder`: ``/metrics``, the status page at ``/`` and its JSON at ``/status.json``.

    The endpoint's URL goes into the events (``monitoring``), where ``fedfair status`` finds it.
    """
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FederationCollector(folder))

    def page() -> tuple[str, bytes]:
        return "text/html; charset=utf-8", status_page(federation_state(folder)).encode()

    def document() -> tuple[str, bytes]:
        return "application/json", json.dumps(federation_state(folder).to_json(), sort_keys=True).encode()

    endpoint = serve_monitoring(settings, registry, {"/": page, "/status": page, "/status.json": document})
    events.emit("monitoring", url=endpoint.url)
    return endpoint
