"""One row of the attack matrix per attack: what was tried, what should happen, what did.

A row is handled only when the observed outcome is the expected one; an attack that
could not be carried out as designed (a stage that never opened, a crafted message the
aggregator refused for another reason than the one under test) is recorded as not
handled, with an ``observed`` that says so, never as a pass. An attack that needs what this
machine lacks (a tmpfs it may mount) is skipped, with the reason: neither handled nor failed.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

PURE = "hostile client (wire schema only)"
PATCHED_COLLABORATOR = "patched collaborator (fedfair's own code with one step corrupted)"
PATCHED_AGGREGATOR = "patched aggregator (fedfair's aggregator with its relay rewritten)"
PROCESS_KILL = "kill -9 of the aggregator process, then --resume"
CHECK = "check of the round log and checkpoints"


@dataclass
class Row:
    """One attack and its outcome, as it appears in the JSON."""

    attack: str
    expected: str
    method: str
    observed: str = "not run"
    handled: bool = False
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None
    """Why the attack could not be made on this machine (it needs what is missing here): neither handled nor failed."""

    def record(self, observed: str, handled: bool, **details: Any) -> None:
        """Set the outcome (the last call wins, so a row can be refined as evidence arrives)."""
        self.observed, self.handled = observed, handled
        self.details.update(details)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "attack": self.attack,
            "expected": self.expected,
            "observed": self.observed,
            "handled": self.handled,
            "seconds": round(self.seconds, 3),
            "method": self.method,
        }
        if self.details:
            document["details"] = self.details
        if self.skipped is not None:
            document["skipped"] = self.skipped
        return document


class RowBook:
    """The rows of one run, in the order they were opened."""

    def __init__(self) -> None:
        self.rows: list[Row] = []

    @contextmanager
    def row(self, attack: str, expected: str, method: str = PURE) -> Iterator[Row]:
        """Open a row and time the block; an exception in the block is recorded as the row's failure
        (the attack harness broke, so nothing was shown) and does not stop the other rows."""
        row = Row(attack, expected, method)
        self.rows.append(row)
        started = time.perf_counter()
        try:
            yield row
        except Exception as error:  # noqa: BLE001 -- one broken attack must not hide the others' results
            row.record(
                f"the attack harness failed before an outcome was seen: {type(error).__name__}: {error}",
                False,
                traceback=traceback.format_exc(limit=4),
            )
        finally:
            row.seconds += time.perf_counter() - started

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def skip(self, attack: str, expected: str, method: str, reason: str) -> Row:
        """A row whose attack this machine cannot make (`reason` says what it lacks): skipped, not failed."""
        return self.add(Row(attack, expected, method, f"skipped: {reason}", skipped=reason))

    def failed(self) -> list[str]:
        return [row.attack for row in self.rows if not row.handled and row.skipped is None]
