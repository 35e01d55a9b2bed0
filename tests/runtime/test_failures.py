"""The collaborator's failure table: every class is documented in the runbook, word for word."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedfair.core.errors import FailureClass
from fedfair.runtime.failures import FAILURES, runbook_table

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_the_runbook_carries_the_generated_table() -> None:
    text = RUNBOOK.read_text()
    start, end = "<!-- failure-table:start -->\n", "<!-- failure-table:end -->"
    assert start in text and end in text, "docs/operations.md lost its failure-table markers"
    documented = text.split(start, 1)[1].split(end, 1)[0]
    assert documented == runbook_table(), "regenerate with: python -m fedfair.runtime.failures"


def test_ids_are_unique_and_each_class_appears_once() -> None:
    ids = [failure.id for failure in FAILURES]
    assert len(ids) == len(set(ids))
    table = runbook_table()
    assert all(table.count(f"| `{failure_id}` |") == 1 for failure_id in ids)


@pytest.mark.parametrize("failure", FAILURES, ids=lambda failure: failure.id)
def test_every_message_starts_with_its_id_and_ends_with_a_fix(failure: FailureClass) -> None:
    facts = {
        "address": "a:1",
        "reason": "r",
        "role": "collaborator",
        "what": "w",
        "seconds": 1,
        "ca": "ca",
        "name": "n",
        "theirs": "t",
        "ours": "o",
        "code": "C",
        "config": "c.toml",
        "served": "s",
        "changes": "x",
        "details": "d",
        "limit": 1,
        "path": "p",
        "evidence": "e",
        "latest": 1,
        "federation": "f",
        "round": 1,
        "detail": "d",
        "issuer": "i",
        "cert": "c.crt",
        "why": "y",
        "rounds": 1,
        "expired": "2026-01-01 00:00:00",
        "auditor": "audit-co",
        "data": "the table at t.csv",
        "bound": "b",
        "now": "n",
    }
    message = failure.message(**facts)
    assert message.startswith(f"{failure.id}: ") and ". Fix: " in message
