"""A site's check of a bounded round it took no part in: what lets a site that missed one catch up (issue 98).

A site down during a bounded round checks what every accepted site was sent (the SHARE opening, the verdict record,
the tag set) as an accepted site checks it, less its own tags. It applies the record's total only where every
accepted site (at least the floor, t >= max_colluding + 2) signed tags over that record, so at least two honest sites
checked this very record. A record that names a liar is not applied
(:class:`~fedfair.core.errors.VoidableRoundError`): tags are signed before disputes are relayed, so a dispute that
voided it could have been dropped from what was kept; the next round's signed model digest decides instead.

Why: docs/security.md, "A site that missed a bounded round (issue 98)".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError, ProtocolError, VerificationError, VerifyReason, VoidableRoundError
from fedfair.secagg.bounded.context import BoundedContext
from fedfair.secagg.bounded.messages import ShareOpening
from fedfair.secagg.bounded.parameters import BoundedParameters
from fedfair.secagg.bounded.record import RoundFindings, VerdictRecord, check_round_evidence, framing
from fedfair.secagg.bounded.total import TagSet, record_digest, verified_total
from fedfair.secagg.bounded.verifier import Verdict


@dataclass(frozen=True)
class PastBoundedRound:
    """What every accepted site of one bounded round was sent, as the aggregator kept it: all a bystander checks."""

    opening: ShareOpening
    record: VerdictRecord
    tag_set: TagSet

    @classmethod
    def parsed(cls, inputs: Sequence[bytes | memoryview]) -> PastBoundedRound:
        """The past round whose kept SHARE, DECIDE and VERIFY inputs are `inputs`, in this order.

        Raises:
            ValueError: `inputs` are not three.
            ProtocolError: one does not parse as its message.
        """
        opening, record, tag_set = inputs
        return cls(ShareOpening.from_bytes(opening), VerdictRecord.from_bytes(record), TagSet.from_bytes(tag_set))


@dataclass(frozen=True)
class PastTotal:
    """A missed bounded round's total, checked: signed integers in the encoded scale, and what the record found."""

    total: np.ndarray
    findings: RoundFindings


def framings(
    context: BoundedContext,
    record: VerdictRecord,
    tag_set: TagSet,
    site_keys: Mapping[int, ec.EllipticCurvePublicKey],
) -> dict[int, Verdict]:
    """Every dispute `tag_set` relays, checked against `record`: disputing site -> its verdict with the true message.

    `record` must have passed :func:`~.record.check_round_evidence`. Any entry shows the aggregator signed a false
    message about that site (:func:`~.record.framing`).

    Raises:
        VerificationError: MALFORMED, a relayed dispute does not hold (the aggregator relays only those that held at
            its own check).
    """
    verdicts = {}
    for dispute in tag_set.disputes:
        party = dispute.sender
        try:
            verdicts[party] = framing(context, record, dispute, site_keys[party])
        except (AuthenticationError, ProtocolError, KeyError) as error:
            raise VerificationError(
                context.round,
                VerifyReason.MALFORMED,
                f"the aggregator relayed a dispute from party {party} that does not hold: {error}",
            ) from None
    return verdicts


def check_past_total(past: PastBoundedRound, parameters: BoundedParameters) -> PastTotal:
    """The verified total of the bounded round `parameters` describe, which this party took no part in.

    `parameters` are the round's as this party derives them from its plan, its manifest's pins and the kept SHARE
    opening's public parameters (:func:`~.parameters.round_parameters`).

    Raises:
        VerificationError: FORGED, the auditor's round key is not signed by it for this round, or the record does not
            hold up against its evidence; BELOW_FLOOR, it accepts fewer sites than the floor; FRAMED, a relayed
            dispute shows the aggregator framed a site (the round was void, not applied); MALFORMED, a relayed
            dispute does not hold; then as an accepted site's check of the total (MISSING_TAG, BAD_TAG, MALFORMED,
            FORGED).
        VoidableRoundError: all of it checks, but the record names a liar: whether the round was applied is not for a
            site that missed it to tell (a dispute may have voided it).
    """
    round_number = parameters.round_number
    try:
        context = parameters.context(past.opening.round_key.checked(parameters.auditor_key, parameters.binding))
        findings = check_round_evidence(context, past.record, parameters.site_keys)
    except (AuthenticationError, ProtocolError) as error:
        if isinstance(error, VerificationError):
            raise  # BELOW_FLOOR, named as an accepted site names it
        raise VerificationError(
            round_number, VerifyReason.FORGED, f"the verdict record does not hold up against its evidence: {error}"
        ) from None
    framed = framings(context, past.record, past.tag_set, parameters.site_keys)
    if framed:
        raise VerificationError(
            round_number,
            VerifyReason.FRAMED,
            f"the aggregator kept the round as applied, but it framed part{'ies' if len(framed) > 1 else 'y'} "
            f"{', '.join(map(str, sorted(framed)))}: a round with a dispute that holds is void",
        )
    digest = record_digest(past.record.to_bytes(context))
    total = verified_total(
        context,
        digest,
        findings.accepted,
        past.record.total,
        past.record.noise_commitment,
        past.tag_set,
        parameters.site_keys,
    )
    if findings.liars:
        liars = tuple(sorted(findings.liars))
        raise VoidableRoundError(
            round_number,
            tuple(findings.accepted),
            liars,
            f"its verdict record names part{'ies' if len(liars) > 1 else 'y'} {', '.join(map(str, liars))} a liar: a "
            "dispute relayed at VERIFY, which no signature covers, may have made the round void at every accepted "
            "site, so a site that missed it cannot tell whether it was applied",
        )
    return PastTotal(total, findings)
