"""Three real site processes under fedfair's aggregator in a thread: the federation the forged-model rows run.

:func:`run_sites` starts :class:`~attacks.pinned_federation.LoopAggregator` with its round loop adjusted (the attack)
and one ``fedfair collaborator start`` process per site, waits for each site to exit, then kills what is left and
stops the aggregator. The wait is a budget measured on an idle machine, stretched by the load
(:func:`~attacks.patience.patient`): beside two CPU hogs on 2 cores a fixed 180 s turned working rows into
timeouts (issue 79). A site still running at the end is reported (status None), never waited on.

:func:`wait_while_sites_run` bounds a row's wait for an aggregator process by its sites: once every site process
exited, the aggregator's first quorum wait (no deadline by design, docs/operations.md) cannot end, so the row
stops waiting after :data:`AFTER_LAST_SITE_SECONDS` instead of its whole budget.
"""

from __future__ import annotations

import io
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from attacks.pinned_federation import LoopAggregator
from attacks.patience import patient
from attacks.target_site import THREE
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.local.processes import Child, child_environment, collaborator_command
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

SITE_SECONDS = 180.0
"""Longest a site process of these rows may run, on an idle machine (about 20-40 s is usual)."""

AFTER_LAST_SITE_SECONDS = 60.0
"""How long an aggregator may take to finish after the last site exited: its goodbye and final writes."""


@dataclass(frozen=True)
class SiteRun:
    """What the sites of one federation did: each one's exit status (None: still running at the end, killed),
    its output lines, and the federation's wall seconds."""

    statuses: dict[str, int | None]
    lines: dict[str, list[str]]
    seconds: float


def run_sites(
    workspace: Workspace,
    adjust: Callable[[RoundLoop], None],
    seconds: float = SITE_SECONDS,
    beside: Mapping[str, list[str]] | None = None,
) -> SiteRun:
    """The federation of `workspace` (its sites THREE) under the aggregator whose loop `adjust` rewrites.

    Each site is waited for up to `seconds` stretched by the load, counted from its start. `beside`: name -> command
    of more processes the federation needs (an auditor), started with the sites and killed once they exited; their
    lines are kept under their names too.
    """
    plan = load_aggregator_plan(workspace.plan)
    started = time.monotonic()
    aggregator = LoopAggregator(plan, None, adjust)
    sink = io.StringIO()
    others = {
        name: Child(name, command, env=child_environment(None), sink=sink) for name, command in (beside or {}).items()
    }
    sites = {
        name: Child(name, collaborator_command(workspace, name), env=child_environment(None), sink=sink)
        for name in THREE
    }
    deadline = started + patient(seconds)
    statuses: dict[str, int | None] = {}
    try:
        for name, site in sites.items():
            try:
                statuses[name] = site.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                statuses[name] = None
    finally:
        for child in (*others.values(), *sites.values()):
            child.kill()
        aggregator.stop()
    lines = {name: child.lines for name, child in (*sites.items(), *others.items())}
    return SiteRun(statuses, lines, time.monotonic() - started)


def wait_while_sites_run(aggregator: Child, sites: Mapping[str, Child], seconds: float) -> int | None:
    """The aggregator's exit status, waiting up to `seconds` stretched by the load, and no more than
    :data:`AFTER_LAST_SITE_SECONDS` once every site process exited (None: it was still running then)."""
    deadline = time.monotonic() + patient(seconds)
    last_site: float | None = None
    while time.monotonic() < deadline:
        try:
            return aggregator.wait(1.0)
        except subprocess.TimeoutExpired:
            pass
        if last_site is None and all(site.process.poll() is not None for site in sites.values()):
            last_site = time.monotonic()
        if last_site is not None and time.monotonic() - last_site > AFTER_LAST_SITE_SECONDS:
            return None
    return None
