"""Revocation that acts while a federation runs (issue 65): a key rotation mid-run, every party a process.

A pinned three-site secure federation of 6 rounds, each round needing all three sites, over loopback
mutual TLS (``fedfair aggregator start``, ``fedfair collaborator start``). After round 2 site-c's key is
taken to be stolen: the CA holder signs an update re-keying it (``fedfair pki revoke --replace --sign``),
which is put in place of the shared manifest file while everything runs; the process holding the old key
keeps running (the thief). Rows:

- revoked key mid-run: the old key takes part in 0 rounds after the one in flight when the update landed;
- key rotation mid-run: site-c restarted on its new key carries the federation to its last round, all
  rounds applied, every process but the thief exiting 0.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

from attacks.federation import plan_sections
from attacks.ledger import PROCESSES, Quiet, fedfair
from attacks.rows import RowBook
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.local.processes import start_aggregator, start_collaborator
from fedfair.runtime.local.workspace import make_workspace
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

THREE = ("site-a", "site-b", "site-c")
REVOKED = "site-c"
ROUNDS = 6
WAIT_SECONDS = 240.0


def rotation_rows(where: Path, book: RowBook) -> None:
    """Both rows of this module on one federation (see the module's notes)."""
    sections = plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=60.0)
    workspace = make_workspace(where, THREE, plan=sections, manifest=True)
    output = load_aggregator_plan(workspace.plan).aggregator.output
    manifest = where / "manifest.toml"
    keys = where / REVOKED / "new-certs"
    for words in (
        ("pki", "request", "--dir", str(keys), "--name", REVOKED),
        ("pki", "sign", "--ca", str(workspace.certs), "--csr", str(keys / f"{REVOKED}.csr"), "--out", str(keys / f"{REVOKED}.crt")),
        ("pki", "revoke", "--manifest", str(manifest), "--name", REVOKED, "--replace", str(keys / f"{REVOKED}.crt"),
         "--ca", str(workspace.certs / "ca.crt"), "--sign", str(workspace.certs), "--out", str(where / "manifest-2.toml")),
    ):  # fmt: skip
        done = fedfair(*words)
        if done.returncode != 0:
            raise RuntimeError(f"fedfair {' '.join(words[:2])} failed: {done.stderr[-600:]}")
    shutil.copy(workspace.certs / "ca.crt", keys / "ca.crt")
    aggregator = start_aggregator(workspace, sink=Quiet())
    children = {name: start_collaborator(workspace, name, sink=Quiet()) for name in THREE}
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while len(read_round_log(output)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        os.replace(where / "manifest-2.toml", manifest)  # every institution and the aggregator: one file here
        in_flight = len(read_round_log(output)) + 1
        thief_status = children[REVOKED].wait(WAIT_SECONDS)
        before_new_key = len(read_round_log(output))
        said = next((line for line in children[REVOKED].lines if "certificate-revoked" in line), "")
        config = workspace.configs[REVOKED]
        config.write_text(config.read_text().replace(f'dir = "{workspace.certs}"', f'dir = "{keys}"'))
        renewed = start_collaborator(dataclasses.replace(workspace, configs={REVOKED: config}), REVOKED, sink=Quiet())
        status = {"aggregator": aggregator.wait(WAIT_SECONDS)}
        status.update({name: children[name].wait(60) for name in THREE if name != REVOKED})
        status["site-c (new key)"] = renewed.wait(60)
    finally:
        for child in (aggregator, *children.values()):
            child.kill()
    records = read_round_log(output)
    # Every round needs site-c, and its new key started only after the old key's process ended: a round done
    # between the one in flight at the update and the new key's start had the old key in it.
    old_key_after = [r["round"] for r in records[in_flight:before_new_key] if REVOKED in r.get("contributors", [])]
    new_key_rounds = [r["round"] for r in records[before_new_key:] if REVOKED in r.get("contributors", [])]
    applied = [r["round"] for r in records if r.get("contributors")]
    with book.row(
        "revoked key mid-run: after round 2 the CA holder's signed update re-keys site-c (`fedfair pki revoke "
        "--replace --sign`) and is put in place while everything runs; the process holding the old key runs on",
        "the old key takes part in 0 rounds after the one in flight when the update landed, and its process is "
        "refused (exit non-zero, certificate-revoked)",
        PROCESSES,
    ) as row:
        row.record(
            f"update landed during round {in_flight}; the old key's process exited {thief_status} "
            f"({said.strip()[:160] or 'no certificate-revoked line'}) after {before_new_key} rounds; old-key rounds "
            f"after round {in_flight}: {old_key_after}",
            thief_status != 0 and bool(said) and old_key_after == [],
            old_key_rounds_after=old_key_after,
        )
    with book.row(
        "key rotation mid-run: site-c restarted on its new certificate, the federation still running",
        f"all {ROUNDS} rounds applied, site-c's new key contributing after the rotation, every process but the "
        "thief exiting 0",
        PROCESSES,
    ) as row:
        row.record(
            f"rounds applied {applied}; the new key contributed in rounds {new_key_rounds}; exit statuses {status}",
            applied == list(range(1, ROUNDS + 1)) and bool(new_key_rounds) and set(status.values()) == {0},
            new_key_rounds=new_key_rounds,
        )
