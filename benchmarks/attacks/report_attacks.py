"""Abuse of the ``Report`` RPC (a collaborator's status: a spent privacy budget, its epsilon) by the insider.

A status report touches no stage, gate slot or task; all it can do is write a log line,
an event and the epsilon the next ``round`` event shows. So the rows check, beside the
answer, what reached the operator's ``events.jsonl``: a refused report must add no
``status`` event, and an accepted one exactly one, naming the certified caller and no
one else. The run itself is checked afterwards by the plain scenario's replay of the
round log (:func:`~attacks.round_check.check_rounds`): the rounds around these attacks
must be exactly what the parties sent.

The reports are the hostile client's (:func:`~attacks.hostile_client.status_report`,
sent as raw bytes), over the insider's own mutual-TLS channel. The aggregator's rate
limit (:class:`~fedfair.runtime.rate_limits.RateLimit`, a burst of 10, then 1
a second) is spent by every parsed report, so the flood runs last and the rows before
it stay under the burst.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from attacks.hostile_client import named_stage
from attacks.federation import FEDERATION_ID, HONEST, INSIDER
from attacks.hostile_client import Answer, bind, report, status_report, unknown_field
from attacks.rows import RowBook
from fedfair.runtime.observe.events import read_events
from fedfair.runtime.rate_limits import RateLimit
from fedfair.runtime.transport import fedfair_pb2 as pb

SPENT = pb.COLLABORATOR_STATUS_PRIVACY_SPENT_REPORT
FLOOD_REPORTS = 40
"""Reports the flood sends back to back: four times the aggregator's burst."""


@dataclass
class ReportAttacks:
    """The Report rows, run by the insider while its training round's MASKED_INPUT stage is open."""

    book: RowBook
    channel: grpc.Channel
    output: Path
    refused: Callable[[Answer, tuple[str, ...]], bool]
    """Whether an answer is a refusal with one of the codes and generic details (the plain scenario's check)."""
    alive: Callable[[], bool]

    def run(self, round_number: int) -> None:
        started = bind(FEDERATION_ID, round_number, named_stage("STAGE_MASKED_INPUT"))
        valid = status_report(started, SPENT, 2.5)
        refusals: list[tuple[str, str, bytes, tuple[str, ...]]] = [
            (
                "Report: not a protobuf message (a length prefix past its end)",
                "INVALID_ARGUMENT",
                b"\x0a\xff\xff\xff\x0f\x00",
                ("INVALID_ARGUMENT",),
            ),
            ("Report: a valid report cut short", "INVALID_ARGUMENT", valid[:-3], ("INVALID_ARGUMENT",)),
            (
                "Report: oversized (a 2 MiB StatusReport, over the message limit)",
                "RESOURCE_EXHAUSTED before the handler sees it",
                valid + unknown_field(15, bytes(2 << 20)),
                ("RESOURCE_EXHAUSTED",),
            ),
            (
                "Report: another federation's id",
                "FAILED_PRECONDITION",
                status_report(bind("another-federation", round_number, named_stage("STAGE_MASKED_INPUT")), SPENT, 2.5),
                ("FAILED_PRECONDITION",),
            ),
            (
                "Report: a round that has not started",
                "FAILED_PRECONDITION",
                status_report(bind(FEDERATION_ID, round_number + 5, named_stage("STAGE_MASKED_INPUT")), SPENT, 2.5),
                ("FAILED_PRECONDITION",),
            ),
            (
                "Report: a status the schema does not define (99)",
                "INVALID_ARGUMENT",
                status_report(started, 99),
                ("INVALID_ARGUMENT",),
            ),
            *[
                (
                    f"Report: {what} epsilon",
                    "INVALID_ARGUMENT",
                    status_report(started, SPENT, value),
                    ("INVALID_ARGUMENT",),
                )
                for what, value in (("NaN", math.nan), ("negative (-1)", -1.0), ("+Inf", math.inf))
            ],
        ]
        for attack, expected, data, codes in refusals:
            with self.book.row(attack, f"{expected} with generic details; no status reaches the events") as row:
                answer, added = self._send(data)
                row.record(
                    f"{answer.describe()}; {len(added)} status events added",
                    self.refused(answer, codes) and not added and self.alive(),
                )
        self._attributed_rows(started)
        self._flood_row(started)

    def _attributed_rows(self, started: pb.Binding) -> None:
        """Reports the aggregator takes: they must speak only for the certified caller."""
        victim = HONEST[0]
        cases = [
            (
                f"Report naming another collaborator ({victim!r} in a field the schema lacks)",
                status_report(started, SPENT, 0.5) + unknown_field(15, victim.encode()),
                0.5,
            ),
            ("Report: huge epsilon (1e308)", status_report(started, SPENT, 1e308), 1e308),
        ]
        for attack, data, epsilon in cases:
            with self.book.row(
                attack,
                f"taken as {INSIDER}'s own claim about itself (the schema has no name to spoof): one status event "
                "naming the certified caller, nobody else's status touched; the events stay valid JSON",
            ) as row:
                answer, added = self._send(data)
                named = sorted({event["name"] for event in added})
                good = (
                    answer.ok
                    and named == [INSIDER]
                    and len(added) == 1
                    and added[0]["epsilon"] == epsilon
                    and self.alive()
                )
                row.record(f"{answer.describe()}; status events added for {named}", good, events=added)

    def _flood_row(self, started: pb.Binding) -> None:
        rate = RateLimit()
        with self.book.row(
            f"Report flood ({FLOOD_REPORTS} reports back to back)",
            f"at most the burst ({rate.burst}) plus {rate.per_second:g} a second taken, the rest RESOURCE_EXHAUSTED "
            "with generic details; one status event per report taken",
        ) as row:
            before = self._status_events()
            begun = time.monotonic()
            answers = [report(self.channel, status_report(started, SPENT)) for _ in range(FLOOD_REPORTS)]
            seconds = time.monotonic() - begun
            added = self._status_events()[len(before) :]
            taken = sum(answer.ok for answer in answers)
            refusals = [answer for answer in answers if not answer.ok]
            good = (
                taken <= rate.burst + math.ceil(seconds * rate.per_second)
                and refusals
                and all(self.refused(answer, ("RESOURCE_EXHAUSTED",)) for answer in refusals)
                and len(added) == taken
                and self.alive()
            )
            row.record(
                f"{taken} taken, {len(refusals)} refused ({', '.join(sorted({a.describe() for a in refusals}))}) "
                f"in {seconds:.2f} s; {len(added)} status events added",
                bool(good),
            )

    def _send(self, data: bytes) -> tuple[Answer, list[dict[str, Any]]]:
        """Send one report; return the answer and the status events it added (written before the reply)."""
        before = len(self._status_events())
        answer = report(self.channel, data)
        return answer, self._status_events()[before:]

    def _status_events(self) -> list[dict[str, Any]]:
        return [event for event in read_events(self.output) if event["event"] == "status"]
