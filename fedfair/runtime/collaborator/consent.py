"""What this institution consents to of a plan's input bound: the auditor it names, which a site may refuse.

A plan in the two-verifier mode (fedfair.runtime.plan.input_bound) shows an auditor institution every share of
this site's input that the aggregator does not get; the aggregator and the auditor together could read it. So
each site decides whom it trusts with that: ``[collaborator] refuse_auditors = ["NAME", ...]`` in its own
``collaborator.toml``. :func:`check_input_bound` runs as the plan arrives, before anything is sent or recorded.

Why: docs/security.md, "Bounded inputs (two verifiers)", "Declaring it".
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.core.tables import Table
from fedfair.pki.names import validate_name
from fedfair.runtime.failures import AUDITOR_REFUSED, plan_mismatch
from fedfair.runtime.manifest import Manifest
from fedfair.runtime.plan.aggregator_plan import SharedSettings

REFUSE_AUDITORS = "refuse_auditors"
"""[collaborator] refuse_auditors: the auditor institutions this site refuses as a second verifier of its input."""


def read_refused_auditors(table: Table) -> tuple[str, ...]:
    """[collaborator] refuse_auditors: participant names (none when absent; an empty list is refused)."""
    if not table.given(REFUSE_AUDITORS):
        return ()
    names = table.strings(REFUSE_AUDITORS, expected='a non-empty list of auditor names, e.g. ["audit-co"]')
    for name in names:
        try:
            validate_name(name)
        except ConfigError as error:
            table.fail(f"{table.where} {REFUSE_AUDITORS}: {error}")
    return names


def check_input_bound(
    shared: SharedSettings, refused: Collection[str], manifest: Manifest | None, config: Path
) -> None:
    """Refuse a plan whose input bound names an auditor this site refuses, or one no manifest of its pins.

    `shared` is the served plan, `refused` the site's refuse_auditors, `config` its file.
    Checked as the plan arrives, before anything is sent or recorded: a refusing site loses nothing.

    Raises:
        PermanentFailureError: ``auditor-refused`` (exit status EXIT_REFUSED) when `refused` names the auditor;
            ``plan-mismatch`` when this site has no manifest to pin the auditor by.
    """
    secure = shared.secure_aggregation
    auditor = secure.auditor
    if auditor is None:
        return
    if auditor in refused:
        raise PermanentFailureError(AUDITOR_REFUSED, auditor=auditor, config=config)
    if manifest is None:
        raise plan_mismatch(
            "collaborator",
            f"it names {auditor!r} as the auditor of its input bound, an institution only a manifest can pin; "
            f"set [collaborator] manifest in {config} to the federation's manifest that lists it",
        )
