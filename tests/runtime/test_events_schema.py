"""One event schema: every event fedfair emits is a kind of `EVENTS`, with only that kind's fields.

Read from the syntax tree of every module (any ``.emit("kind", field=...)`` call), so a new
event or field cannot reach events.jsonl, and through it the metrics, the status page and
`fedfair logs`, without its place in the schema.
"""

from __future__ import annotations

import ast
from pathlib import Path

from fedfair.runtime.observe.events import EVENTS

PACKAGE = Path(__file__).resolve().parents[2] / "fedfair"


def emits() -> list[tuple[str, str, set[str]]]:
    """(where, kind, fields) of every emit call with a literal kind in fedfair."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "emit"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                fields = {keyword.arg for keyword in node.keywords if keyword.arg is not None}
                found.append((f"{path.relative_to(PACKAGE)}:{node.lineno}", node.args[0].value, fields))
    return found


def test_every_emitted_event_is_in_the_schema_with_its_fields() -> None:
    found = emits()
    assert {kind for _, kind, _ in found} == set(EVENTS), "an EVENTS kind nobody emits, or one emitted unlisted"
    for where, kind, fields in found:
        assert fields <= set(EVENTS[kind][0]), f"{where}: {kind} carries {sorted(fields - set(EVENTS[kind][0]))}"
