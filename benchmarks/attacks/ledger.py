"""One budget per dataset, revocation, and a ledger that detects edits (issue 51, items 4, 5 and 7).

One pinned three-site federation under ``[privacy] report_epsilon = 1`` (one noised evaluation a
round), every party a real process (``fedfair aggregator start``, ``fedfair collaborator start``)
over loopback mutual TLS, run to its end; then site-c is re-keyed and revoked
(``fedfair pki revoke --replace``) and the federation renewed (``fedfair plan renew``):

- revoked site: before the renewed federation runs, a process holding site-c's revoked key (and the
  old manifest, which still pins it) connects: the aggregator must refuse it at the handshake (exit
  status non-zero, ``certificate-revoked``), while site-c on its new certificate takes part (the control);
- renewal: the renewed federation's first answer at each site is charged on top of the first
  federation's spend (its logged epsilon above the first's total), and each site's ledger composes both;
- edited ledger: site-a's ledger edited as a careless script would (``mu = 1e300`` on one entry, which
  read silently would shrink the spend), and site-a started again: it must stop at once, before it dials,
  naming the file, the entry and the ledger's fix; site-b, unedited, gets past its ledger (the control). A
  truncated copy is refused by ``fedfair collaborator ledger`` too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from attacks.federation import plan_sections
from attacks.rows import RowBook
from fedfair.privacy.ledger import composed
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.collaborator.charges import open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.local.processes import start_aggregator, start_collaborator
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

THREE = ("site-a", "site-b", "site-c")
REVOKED, EDITED, CONTROL = "site-c", "site-a", "site-b"
PRIVACY = {"report_epsilon": 1.0, "budget": 10.0, "delta": 1e-5}
DELTA = PRIVACY["delta"]
PROCESSES = "real processes: `fedfair aggregator start` and `fedfair collaborator start` over loopback mTLS"
WAIT_SECONDS = 180.0


class Quiet:
    """Where the children's lines go: kept by each Child already, so not printed again."""

    def write(self, text: str) -> int:
        """Drop `text` (each Child keeps its own lines)."""
        return len(text)

    def flush(self) -> None:
        """Nothing to flush."""


def fedfair(*words: str) -> subprocess.CompletedProcess[str]:
    """The `fedfair` command line, as an operator runs it."""
    command = [sys.executable, "-m", "fedfair.cli", *words]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def run_federation(workspace: Workspace, configs: dict[str, Path], *extra: str) -> dict[str, int]:
    """The aggregator and one process per site of `configs`, to the end; every exit status."""
    aggregator = start_aggregator(workspace, *extra, sink=Quiet())
    children = {
        name: start_collaborator(_with(workspace, name, path), name, sink=Quiet()) for name, path in configs.items()
    }
    try:
        status = {"aggregator": aggregator.wait(WAIT_SECONDS)}
        status.update({name: child.wait(60) for name, child in children.items()})
    finally:
        for child in (aggregator, *children.values()):
            child.kill()
    return status


def _with(workspace: Workspace, name: str, config: Path) -> Workspace:
    """`workspace` whose collaborator `name` starts from `config`."""
    return dataclasses.replace(workspace, configs={name: config})


def joined(config: Path, name: str, seconds: float) -> bool:
    """Whether collaborator `name` logs, within `seconds`, that it joined (so it read its ledger)."""
    log = config.parent / f"{name}.log"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if log.exists() and "joined federation second" in log.read_text():
            return True
        time.sleep(0.5)
    return False


def spent(workspace: Workspace, name: str) -> float:
    return open_ledger(load_collaborator_config(workspace.configs[name])).spent(DELTA)


def ledger_rows(where: Path, book: RowBook) -> None:
    """Every row of this module, in order, on one workspace (see the module's notes)."""
    sections = plan_sections(
        secure=True,
        rounds=1,
        quorum=3,
        timeout=30.0,
        evaluation_every=1,
        privacy=PRIVACY,
        training={"average_from": 0.0},
    )
    workspace = make_workspace(where, THREE, plan=sections, manifest=True)
    first_status = run_federation(workspace, dict(workspace.configs))
    first_spent = {name: spent(workspace, name) for name in THREE}
    stolen, renewed = revoke_and_renew(workspace)
    revoked_row(workspace, book, stolen, renewed, first_status)
    renewal_row(workspace, book, first_spent)
    edited_row(workspace, book)


def revoke_and_renew(workspace: Workspace) -> tuple[Path, dict[str, Path]]:
    """Re-key site-c, revoke its old certificate and renew the federation; the stolen config and the renewed ones."""
    root, manifest = workspace.root, workspace.root / "manifest.toml"
    shutil.copy(manifest, root / "manifest-old.toml")
    stolen_folder = root / "stolen"
    stolen_folder.mkdir()
    text = workspace.configs[REVOKED].read_text().replace(str(manifest), str(root / "manifest-old.toml"))
    (stolen_folder / "collaborator.toml").write_text(text)
    keys = root / REVOKED / "new-certs"
    for words in (
        ("pki", "request", "--dir", str(keys), "--name", REVOKED),
        ("pki", "sign", "--ca", str(workspace.certs), "--csr", str(keys / f"{REVOKED}.csr"), "--out", str(keys / f"{REVOKED}.crt")),
        ("pki", "revoke", "--manifest", str(manifest), "--name", REVOKED, "--replace", str(keys / f"{REVOKED}.crt"),
         "--ca", str(workspace.certs / "ca.crt"), "--out", str(root / "manifest-r.toml")),
        ("plan", "renew", "--plan", str(workspace.plan), "--manifest", str(root / "manifest-r.toml"), "--federation",
         "second", "--out", str(root / "manifest-2.toml"), *[word for path in workspace.configs.values() for word in ("--config", str(path))]),
    ):  # fmt: skip
        done = fedfair(*words)
        if done.returncode != 0:
            raise RuntimeError(f"fedfair {' '.join(words[:2])} failed: {done.stderr[-600:]}")
    shutil.copy(workspace.certs / "ca.crt", keys / "ca.crt")
    os.replace(root / "manifest-2.toml", manifest)  # every institution puts the agreed manifest in place
    config = workspace.configs[REVOKED]
    config.write_text(config.read_text().replace(f'dir = "{workspace.certs}"', f'dir = "{keys}"'))
    return stolen_folder / "collaborator.toml", dict(workspace.configs)


def revoked_row(
    workspace: Workspace, book: RowBook, stolen: Path, renewed: dict[str, Path], first: dict[str, int]
) -> None:
    with book.row(
        "revoked site: site-c re-keyed and its old certificate revoked (`fedfair pki revoke --replace`); a process "
        "holding the old key and the old manifest connects to the renewed federation",
        "the aggregator refuses it at the handshake (exit status non-zero, certificate-revoked) although the CA signed "
        "it and the name is allowed; site-c on its new certificate contributes (the control)",
        PROCESSES,
    ) as row:
        aggregator = start_aggregator(workspace, sink=Quiet())
        try:
            thief = start_collaborator(_with(workspace, REVOKED, stolen), REVOKED, sink=Quiet())
            thief_status = thief.wait(WAIT_SECONDS)
            said = next((line for line in thief.lines if "certificate-revoked" in line), "")
            children = {
                name: start_collaborator(_with(workspace, name, path), name, sink=Quiet())
                for name, path in renewed.items()
            }
            status = {"aggregator": aggregator.wait(WAIT_SECONDS)}
            status.update({name: child.wait(60) for name, child in children.items()})
        finally:
            aggregator.kill()
        output = load_aggregator_plan(workspace.plan).aggregator.output
        contributors = sorted({name for record in read_round_log(output) for name in record.get("contributors", [])})
        row.record(
            f"first federation exit statuses {first}; the revoked key's process exited {thief_status} "
            f"({said.strip()[:160] or 'no certificate-revoked line'}); renewed federation exit statuses {status}, "
            f"contributors {contributors}",
            thief_status != 0 and bool(said) and set(status.values()) == {0} and REVOKED in contributors,
            contributors=contributors,
        )


def renewal_row(workspace: Workspace, book: RowBook, first: dict[str, float]) -> None:
    with book.row(
        "renewal: the same three sites and data in a new federation (`fedfair plan renew`), report_epsilon = 1 a round",
        "each site's first answer in the new federation is charged on top of the first federation's spend (its "
        "logged epsilon above the first's total), and its ledger composes both federations' releases",
        PROCESSES,
    ) as row:
        figures: dict[str, Any] = {}
        for name in THREE:
            ledger = open_ledger(load_collaborator_config(workspace.configs[name]))
            log = (workspace.configs[name].parent / f"{name}.log").read_text()
            charged = re.findall(r"round \d+ evaluation: .* epsilon ([0-9.e+-]+) of budget", log)
            figures[name] = {
                "first_federation": round(first[name], 4),
                "logged_charges": [float(value) for value in charged],
                "total": round(ledger.spent(DELTA), 4),
                "releases": {
                    federation: len(ledger.releases(federation)) for federation in ("fedfair-launch", "second")
                },
            }
        held = all(
            figure["releases"]["fedfair-launch"] >= 1
            and figure["releases"]["second"] >= 1
            and len(figure["logged_charges"]) >= 2
            and figure["logged_charges"][-1] > figure["first_federation"]
            and figure["total"] > figure["first_federation"]
            for figure in figures.values()
        )
        shown = "; ".join(
            f"{name}: epsilon {figure['first_federation']} after the first, {figure['logged_charges'][-1] if figure['logged_charges'] else '?'} "
            f"logged at the renewed federation's first answer, {figure['total']} in all"
            for name, figure in figures.items()
        )
        row.record(shown, held, sites=figures)


def edited_row(workspace: Workspace, book: RowBook) -> None:
    with book.row(
        f"edited ledger: {EDITED}'s ledger edited by hand (mu = 1e300 on its first entry), then {EDITED} started "
        "again; a truncated copy shown with `fedfair collaborator ledger`",
        "the collaborator stops at once, before it dials, naming the file, the entry and the ledger's fix, the edit "
        f"never read as a smaller spend; {CONTROL}, unedited, gets past its ledger (the control); the truncated copy is refused",
        PROCESSES,
    ) as row:
        ledger = open_ledger(load_collaborator_config(workspace.configs[EDITED]))
        honest = ledger.spent(DELTA)
        document = json.loads(ledger.path.read_text())
        document["entries"][0]["mu"] = 1e300
        edited_releases = [entry for entry in document["entries"] if entry["kind"] != "reset"]
        silently = composed(edited_releases, DELTA)  # what a reader without the checks would have believed
        kept = ledger.path.read_bytes()
        ledger.path.write_text(json.dumps(document, indent=1))
        aggregator = start_aggregator(workspace, "--output", str(workspace.root / "output-again"), sink=Quiet())
        started = [start_collaborator(workspace, name, sink=Quiet()) for name in (EDITED, CONTROL)]
        try:
            status = started[0].wait(WAIT_SECONDS)
            control_passed = joined(workspace.configs[CONTROL], CONTROL, WAIT_SECONDS)
        finally:
            for child in (aggregator, *started):
                child.kill()
        said = "\n".join(started[0].lines)
        # Refused as `local-ledger` with the ledger's own fix (not local-bindings'), as every ledger refusal is,
        # before the dial or at the join: tests/runtime/collaborator/test_ledger_follows_data.py.
        named = re.search(r"(privacy ledger \S+: entry \d+: [^;]*)", said)
        ledger.path.write_bytes(kept)
        truncated = json.loads(kept)
        truncated["entries"] = truncated["entries"][:-1]
        ledger.path.write_text(json.dumps(truncated))
        shown = fedfair("collaborator", "ledger", "--config", str(workspace.configs[EDITED]))
        ledger.path.write_bytes(kept)
        truncated_refused = shown.returncode == 2 and "head records" in shown.stderr
        row.record(
            f"{EDITED} exited {status}: {named.group(1)[:200] if named else said[-300:]}; read silently the edit "
            f"would have turned epsilon {honest:.3g} into {silently:.3g}; {CONTROL} read its ledger and joined: "
            f"{control_passed}; truncated copy: exit "
            f"{shown.returncode}, {'head mismatch named' if truncated_refused else shown.stderr[-200:]}",
            status != 0 and named is not None and control_passed and truncated_refused,
            epsilon=honest,
            read_silently=silently,
        )
