"""A collaborator's own Prometheus metrics: the privacy its data has spent, from its ledger and accountant.

:class:`SiteCollector` reads, at each scrape, the files the collaborator already keeps in the institution's
ledger folder: the DP-SGD accountant (``NAME.DATA.privacy.json``, local DP) and the ledger of noised secure-sum
inputs (``NAME.DATA.ledger.json``, with the other ledgers of the same people). Its epsilon is the one the
collaborator itself checks its budget against (and shares, with share_epsilon). :data:`FAMILIES` names every family; docs/operations.md lists them.

Why: docs/operations.md, "Monitoring".
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

from fedfair.core.errors import ConfigError
from fedfair.privacy.ledger import Ledger, ledger_path
from fedfair.privacy.ledger_home import ledger_folder
from fedfair.privacy.ledger_people import know_people
from fedfair.runtime.collaborator.charges import data_identity, dp_sgd_steps
from fedfair.runtime.collaborator.table_fingerprint import table_rows
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.observe.endpoint import Endpoint, serve_monitoring

logger = logging.getLogger("fedfair.collaborator")

FAMILIES: dict[str, tuple[str, str]] = {
    "fedfair_site_epsilon_spent": (
        "gauge",
        "epsilon this site's data has spent, by site and accounting (dp_sgd: its local DP-SGD accountant at its "
        "[privacy] delta; secure_sum: its ledger of noised inputs at the largest delta charged)",
    ),
    "fedfair_site_epsilon_budget": (
        "gauge",
        "the most epsilon this site allows itself ([privacy] budget_epsilon, else target_epsilon; +Inf: none)",
    ),
    "fedfair_site_privacy_delta": ("gauge", "the delta its epsilon_spent is stated at, by accounting"),
    "fedfair_site_dp_sgd_steps_total": ("counter", "DP-SGD steps its accountant recorded, over every federation"),
    "fedfair_site_noised_releases_total": ("counter", "noised inputs charged to its ledger since its last reset"),
}
"""Every family of a collaborator's endpoint: its type and meaning (its unit is in its name)."""


class SiteCollector:
    """A prometheus_client collector of one collaborator's privacy spend (its files re-read when they change)."""

    def __init__(self, config: CollaboratorConfig) -> None:
        self.config = config
        identity = data_identity(config.data)
        from fedfair.privacy.accounting import privacy_state_path  # Opacus: only for a site that serves metrics

        self.accountant_path = privacy_state_path(ledger_folder(), config.name, identity)
        self.ledger_path = ledger_path(ledger_folder(), config.name, identity)
        self._identity = identity
        self._cached: tuple[float, float, int] | None = None
        """(the accountant file's mtime, its epsilon, its steps): PRV composition takes a while, done once a change."""

    def describe(self) -> list[Any]:
        """Nothing: the registry then does not collect at registration."""
        return []

    def _dp_sgd(self) -> tuple[float, int] | None:
        """(epsilon at the [privacy] delta, steps) of the local accountant, or None when it has no file."""
        if not self.accountant_path.is_file():
            return None
        changed = self.accountant_path.stat().st_mtime
        if self._cached is None or self._cached[0] != changed:
            from fedfair.privacy.accounting import PrivacyAccountant

            accountant = PrivacyAccountant(self.accountant_path, data=self._identity)
            privacy = self.config.privacy
            self._cached = (changed, accountant.epsilon(privacy.delta, privacy.accountant), accountant.steps)
        return self._cached[1], self._cached[2]

    def collect(self) -> Iterator[Any]:
        """The families of the site's files now; a damaged file is logged and left out, never served half."""
        from prometheus_client import core

        site = [self.config.name]
        spent = core.GaugeMetricFamily(
            "fedfair_site_epsilon_spent", FAMILIES["fedfair_site_epsilon_spent"][1], labels=["site", "accounting"]
        )
        delta = core.GaugeMetricFamily(
            "fedfair_site_privacy_delta", FAMILIES["fedfair_site_privacy_delta"][1], labels=["site", "accounting"]
        )
        steps = core.CounterMetricFamily(
            "fedfair_site_dp_sgd_steps", FAMILIES["fedfair_site_dp_sgd_steps_total"][1], labels=["site"]
        )
        releases = core.CounterMetricFamily(
            "fedfair_site_noised_releases", FAMILIES["fedfair_site_noised_releases_total"][1], labels=["site"]
        )
        try:
            local = self._dp_sgd()
            ledger = Ledger(self.ledger_path, self.config.name, self._identity) if self.ledger_path.is_file() else None
            if ledger is not None and self.config.data.csv is not None:
                know_people(ledger, table_rows(self.config.data.csv), dp_sgd_steps)
        except (ConfigError, OSError, ValueError) as error:
            logger.warning("%s: the privacy metrics are left out: %s", self.config.name, error)
            return
        if local is not None:
            spent.add_metric([*site, "dp_sgd"], local[0])
            delta.add_metric([*site, "dp_sgd"], self.config.privacy.delta)
            steps.add_metric(site, local[1])
        if ledger is not None:
            charged = ledger.releases()
            at = max((float(entry["delta"]) for entry in charged), default=0.0)  # type: ignore[arg-type]
            spent.add_metric([*site, "secure_sum"], ledger.spent(at) if charged else 0.0)
            delta.add_metric([*site, "secure_sum"], at)
            releases.add_metric(site, len(charged))
        yield from (spent, delta, steps, releases)
        budget = self.config.privacy.budget
        family = core.GaugeMetricFamily(
            "fedfair_site_epsilon_budget", FAMILIES["fedfair_site_epsilon_budget"][1], labels=["site"]
        )
        # A site without a budget of its own is served too, at +Inf: an alert on spent / budget then never fires.
        family.add_metric(site, math.inf if budget is None else budget)
        yield family


def start_site_monitoring(config: CollaboratorConfig) -> Endpoint | None:
    """Serve `config`'s privacy metrics per its [monitoring] (None: the config has no such section)."""
    if config.monitoring is None:
        return None
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(SiteCollector(config))
    return serve_monitoring(config.monitoring, registry)
