"""The aggregator's live status page: one self-contained HTML page of the federation's state, reloading itself.

Drawn from :class:`~fedfair.runtime.observe.status.FederationState` at each request (the monitoring endpoint
serves it at ``/``): the rounds, who is connected, who held the last round up, the latest estimate with
its interval, the privacy each site shared. No script, no network: the browser reloads it every
:data:`REFRESH_SECONDS`.
"""

from __future__ import annotations

import datetime as dt
from html import escape

from fedfair.runtime.report.data import CELLS
from fedfair.runtime.observe.status import FederationState

REFRESH_SECONDS = 5

STYLE = """
body { font: 15px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 60em; }
h1 { font-size: 1.4em; margin: 0 0 .3em; } h2 { font-size: 1.1em; margin: 1.2em 0 .3em; }
table { border-collapse: collapse; } td, th { padding: .25em .8em; border-bottom: 1px solid #ddd; text-align: left; }
.state { display: inline-block; padding: .1em .6em; border-radius: .8em; color: #fff; font-weight: 600; }
.running { background: #2ca02c; } .finished { background: #1f77b4; } .stopped { background: #7f7f7f; }
.yes { color: #2ca02c; font-weight: 600; } .no { color: #d62728; font-weight: 600; }
.dropped, .aborted, .excluded { background: #fde0e0; } .held { background: #fff3cd; }
.estimate { font-size: 1.3em; } .muted { color: #777; }
.waiting { background: #fff3cd; padding: .4em .8em; border-radius: .4em; font-weight: 600; }
"""


def _when(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _number(value: float | None, digits: int = 4) -> str:
    return "&ndash;" if value is None else f"{value:.{digits}g}"


def status_page(state: FederationState) -> str:
    """The page of `state`: every value escaped, nothing fetched."""
    phase = "running" if state.running else "finished" if state.finished else "stopped"
    rounds = f"{state.last_round or 0} of {state.rounds_planned or '?'}"
    lines = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
        f"<title>fedfair {escape(state.federation_id or '')}: round {rounds}</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>Federation {escape(state.federation_id or '(not started)')} "
        f'<span class="state {phase}" id="phase">{phase}</span></h1>',
        f'<p id="rounds">Round {rounds}: {state.rounds_completed} applied, {state.rounds_aborted} aborted. '
        f"Last event {_when(state.updated)}; plan digest "
        f"<code>{escape((state.plan_digest or 'unknown')[:16])}</code>.</p>",
    ]
    if state.waiting is not None:
        lines.append(f'<p id="waiting" class="waiting">{escape(state.waiting.line())}</p>')
    if state.stopped is not None:
        lines.append(f'<p id="stopped" class="waiting">stopped (exit {state.exit_status}): {escape(state.stopped)}</p>')
    lines += _estimate(state)
    lines += _last_round(state)
    lines += _sites(state)
    lines.append(f'<p class="muted">Reloads every {REFRESH_SECONDS} s. {escape(state.folder)}</p></body></html>')
    return "\n".join(lines)


def _estimate(state: FederationState) -> list[str]:
    estimate = state.estimate
    if estimate is None:
        return ['<h2>Estimate</h2><p id="estimate" class="muted">no federated evaluation yet</p>']
    kind = "95% interval of the noised answers" if estimate.noised else "certified bracket of the exact sums"
    return [
        f"<h2>Estimate (round {estimate.round})</h2>",
        f'<p id="estimate" class="estimate">{escape(estimate.text())}</p><p class="muted">{kind}</p>',
    ]


def _last_round(state: FederationState) -> list[str]:
    if state.last_round is None:
        return ['<h2>Last round</h2><p id="last" class="muted">no round has finished yet</p>']
    status = escape(state.last_status or "")
    reason = f": {escape(state.last_reason)}" if state.last_reason else ""
    held = (
        ", ".join(f"{escape(name)} ({seconds:.1f} s)" for name, seconds in state.held_up_by.items())
        or "nobody (no site answered well past the median)"
    )
    stages = "".join(
        f"<tr><td>{escape(stage.removeprefix('STAGE_').replace('_', ' ').lower())}</td><td>{seconds:.2f} s</td></tr>"
        for stage, seconds in state.last_stage_seconds.items()
    )
    return [
        f"<h2>Last round ({state.last_round})</h2>",
        f'<p id="last"><span class="{status}">{status}</span>'
        f"{reason} in {_number(state.last_seconds, 3)} s; "
        f'held up by: <span id="held">{held}</span></p>',
        f'<table id="stages"><tr><th>stage</th><th>seconds</th></tr>{stages}</table>' if stages else "",
    ]


def _sites(state: FederationState) -> list[str]:
    rows = []
    for name, site in state.sites.items():
        connected = '<span class="yes">yes</span>' if site.connected else '<span class="no">no</span>'
        mark, meaning = CELLS.get(site.last, ("", site.last))
        held = f"{site.held_up_seconds:.1f} s" if site.held_up_seconds is not None else ""
        kind = "held" if held else site.last
        rows.append(
            f'<tr class="{escape(kind)}" id="site-{escape(name)}"><td>{escape(name)}</td><td>{connected}</td>'
            f"<td>{mark} {escape(meaning)}</td><td>{site.contributions}</td><td>{site.dropouts}</td>"
            f"<td>{held}</td><td>{_number(site.epsilon)}</td></tr>"
        )
    return [
        "<h2>Sites</h2>",
        '<table id="sites"><tr><th>site</th><th>connected</th><th>last round</th><th>contributed</th>'
        "<th>dropped out</th><th>held up</th><th>epsilon shared</th></tr>",
        *rows,
        "</table>",
        '<p class="muted">Epsilon: the cumulative privacy spent a site shares each round ([privacy] share_epsilon); '
        "each site's own endpoint shows its ledger and budget.</p>",
    ]
