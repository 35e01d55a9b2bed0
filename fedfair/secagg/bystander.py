"""A roster party's check of a verified round it took no part in: what lets a site that missed a round catch up.

A site that was down (or shown a false view) during a round holds no client state, input or tag of it. It checks
what every survivor was sent (key directory, survivor set, unmask request, claim, tag set) as a survivor would, less
what only a survivor holds: every advertisement signed by its roster party, t survivors' signatures on the view,
then the re-sum where the round re-sums (sound up to ``max_colluding`` colluders) or else every survivor's signed
tags (sound against the aggregator alone). It learns no more than every survivor did. docs/security.md,
"Verified aggregation" (a site that missed a round).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ProtocolError, UnmaskRefusedError, VerificationError, VerifyReason
from fedfair.pki.identity import CredentialVerifier
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.credentials import verify_advertisement
from fedfair.secagg.messages import AdvertiseKeys, KeyDirectory, SurvivorSet, UnmaskRequest
from fedfair.secagg.payloads import View, session_id
from fedfair.secagg.resum import check_resummed
from fedfair.secagg.shares import check_view_signatures
from fedfair.secagg.verify import Challenge, aggregate_digest
from fedfair.secagg.recheck import claimed_values
from fedfair.secagg.verify_client import Claimed, check_claim_shape, check_tags
from fedfair.secagg.verify_messages import AggregateClaim, TagSet
from fedfair.secagg.wire import check_header


@dataclass(frozen=True)
class PastRound:
    """What every survivor of one masked round was sent, as the aggregator kept it: all a bystander checks."""

    directory: KeyDirectory
    survivor_set: SurvivorSet
    unmask_request: UnmaskRequest
    claim: AggregateClaim
    tag_set: TagSet

    @classmethod
    def parsed(cls, inputs: Sequence[bytes | memoryview]) -> PastRound:
        """The past round whose kept inputs are `inputs`, in this order, each parsed as its stage parses it.

        Raises:
            ValueError: `inputs` are not five.
            ProtocolError: one does not parse as its message.
        """
        directory, survivor_set, unmask_request, claim, tag_set = inputs
        return cls(
            KeyDirectory.from_bytes(directory),
            SurvivorSet.from_bytes(survivor_set),
            UnmaskRequest.from_bytes(unmask_request),
            AggregateClaim.from_bytes(claim),
            TagSet.from_bytes(tag_set),
        )


def check_past_sum(past: PastRound, config: SecAggConfig, verify_credential: CredentialVerifier) -> np.ndarray:
    """The verified aggregate (d + 1 encoded words) of the round `config` describes, which this party took no part in.

    `verify_credential` turns a roster name and a relayed credential into the identity key this party trusts for it.

    Raises:
        VerificationError: MALFORMED for a message of another round or session, a party listed twice, an
            advertisement that does not verify or a claim of the wrong shape; MALFORMED where fewer than t
            survivors signed the view; then as a survivor's own check (FORGED, BAD_TAG, MISSING_TAG).
    """
    round_number = config.round
    vector = past.claim.vector
    check_claim_shape(past.claim, config)
    try:
        advertisements, identities = _advertised(past.directory, config, verify_credential)
        session = session_id(config.digest, tuple(advertisements.values()))
        for message in (past.survivor_set, past.unmask_request, past.claim, past.tag_set):
            check_header(message, config, session)
    except ProtocolError as error:
        raise VerificationError(
            round_number, VerifyReason.MALFORMED, f"the round's keys do not check: {error}"
        ) from None
    view: View = (past.survivor_set.masking_set, past.survivor_set.survivors, past.survivor_set.inputs)
    if not set(view[1]) <= advertisements.keys():
        raise VerificationError(round_number, VerifyReason.MALFORMED, "a survivor advertised no keys this round")
    try:
        check_view_signatures(
            past.unmask_request.signatures, view, session=session, identities=identities, config=config, wanted={}
        )
    except UnmaskRefusedError as error:
        raise VerificationError(
            round_number, VerifyReason.MALFORMED, f"fewer than t survivors signed the round's view ({error})"
        ) from None
    if config.resummed:
        check_resummed(
            vector,
            past.claim,
            config=config,
            session=session,
            view=view,
            advertisements=advertisements,
            identities=identities,
        )
    carries = past.claim.carries
    digest = aggregate_digest(session, view[1], view[2], vector, carries)
    challenge = Challenge(session, digest, vector.size)
    # A re-checked round's reports are checked as a survivor checks them: one honest checker vouches for each value.
    rechecked = None if carries is None else claimed_values(challenge, vector, carries)
    claimed = Claimed(digest, challenge.dots(vector), vector, rechecked)
    return check_tags(
        past.tag_set,
        claimed,
        config=config,
        session=session,
        view=view,
        advertisements=advertisements,
        identities=identities,
    )


def _advertised(
    directory: KeyDirectory, config: SecAggConfig, verify_credential: CredentialVerifier
) -> tuple[dict[int, AdvertiseKeys], dict[int, ec.EllipticCurvePublicKey]]:
    """Every advertisement of `directory` by party, each checked against its signer; and their identity keys.

    Raises:
        ProtocolError: the directory is another round's, lists a party twice, or carries one that does not verify.
    """
    check_header(directory, config, b"")
    advertisements: dict[int, AdvertiseKeys] = {}
    identities: dict[int, ec.EllipticCurvePublicKey] = {}
    for advertisement in directory.advertisements:
        if advertisement.sender in advertisements:
            raise ProtocolError("the key directory lists a party twice")
        identities[advertisement.sender] = verify_advertisement(advertisement, config, verify_credential)
        advertisements[advertisement.sender] = advertisement
    return advertisements, identities
