"""The bounded secure sum declared once: its stages and steps, in order, each naming its messages.

A second kind of secure sum beside :data:`fedfair.secagg.round.SECURE_ROUND`, with the stages the design
note names (docs/security.md, "Bounded inputs (two verifiers)"): SHARE (each site's two parts), VERIFY
(the verifiers' commit-reveal exchange), DECIDE (the verdict record to every site) and TOTAL (the auditor's
total to the aggregator). Whoever runs the sum (:func:`~fedfair.secagg.bounded.simulate.simulate_bounded_round`,
later the runtime) loops over :data:`BOUNDED_ROUND`: a step names who sends its message to whom, its wire
name, how it is parsed, and the receiving :class:`~fedfair.secagg.bounded.verifying.RoundVerifier`'s step.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fedfair.secagg.bounded.exchange import AuditorTotal, Commitments, Reveal, Roster, SeedReveal
from fedfair.secagg.bounded.record import VerdictRecord
from fedfair.secagg.bounded.upload import LeaderUpload, SealedSeed
from fedfair.secagg.bounded.verifying import RoundVerifier


class BoundedStage(enum.IntEnum):
    """The stages of a bounded secure sum, in order."""

    SHARE = 1
    VERIFY = 2
    DECIDE = 3
    TOTAL = 4


class Party(enum.Enum):
    """Who sends or receives a step's message."""

    SITE = "site"
    AGGREGATOR = "aggregator"
    AUDITOR = "auditor"
    VERIFIERS = "each verifier, to the other"


@dataclass(frozen=True)
class BoundedStep:
    """One message of a bounded secure sum.

    stage: the stage it belongs to.
    wire: its name on the transport.
    sender, receiver: who sends it and who receives it (VERIFIERS: both send, each to the other).
    parse: its bytes to the message.
    receive: the receiving verifier's step, returning what it sends next (None: a site receives it).
    noun: what the messages are, for the operator's progress line.
    """

    stage: BoundedStage
    wire: str
    sender: Party
    receiver: Party
    parse: Callable[[bytes], Any]
    receive: Callable[[RoundVerifier, Any], Any] | None
    noun: str


BOUNDED_ROUND: tuple[BoundedStep, ...] = (
    BoundedStep(
        BoundedStage.SHARE,
        "BOUNDED_SHARE_AGGREGATOR",
        Party.SITE,
        Party.AGGREGATOR,
        LeaderUpload.from_bytes,
        RoundVerifier.receive_upload,
        "bounded shares",
    ),
    BoundedStep(
        BoundedStage.SHARE,
        "BOUNDED_SHARE_AUDITOR",
        Party.SITE,
        Party.AUDITOR,  # relayed by the aggregator, which cannot open it
        SealedSeed.from_bytes,
        RoundVerifier.receive_upload,
        "sealed auditor seeds",
    ),
    BoundedStep(
        BoundedStage.VERIFY,
        "BOUNDED_ROSTER",
        Party.VERIFIERS,
        Party.VERIFIERS,
        Roster.from_bytes,
        RoundVerifier.receive_roster,
        "rosters",
    ),
    BoundedStep(
        BoundedStage.VERIFY,
        "BOUNDED_QUERY_SEED",
        Party.VERIFIERS,
        Party.VERIFIERS,
        SeedReveal.from_bytes,
        RoundVerifier.receive_seed,
        "query seed halves",
    ),
    BoundedStep(
        BoundedStage.VERIFY,
        "BOUNDED_COMMIT",
        Party.VERIFIERS,
        Party.VERIFIERS,
        Commitments.from_bytes,
        RoundVerifier.receive_commitments,
        "verifier message commitments",
    ),
    BoundedStep(
        BoundedStage.VERIFY,
        "BOUNDED_REVEAL",
        Party.VERIFIERS,
        Party.VERIFIERS,
        Reveal.from_bytes,
        RoundVerifier.receive_reveal,
        "signed verifier messages",
    ),
    BoundedStep(
        BoundedStage.DECIDE,
        "BOUNDED_DECIDE",
        Party.AGGREGATOR,
        Party.SITE,
        VerdictRecord.from_bytes,
        None,
        "verdict records",
    ),
    BoundedStep(
        BoundedStage.TOTAL,
        "BOUNDED_TOTAL",
        Party.AUDITOR,
        Party.AGGREGATOR,
        AuditorTotal.from_bytes,
        None,  # the aggregator's RoundVerifier.finish takes it with the round's result
        "auditor totals",
    ),
)
"""The bounded secure sum: SHARE, VERIFY (four exchanges), DECIDE, TOTAL."""


def steps(stage: BoundedStage) -> tuple[BoundedStep, ...]:
    """The steps of ``stage``, in order."""
    return tuple(step for step in BOUNDED_ROUND if step.stage is stage)
