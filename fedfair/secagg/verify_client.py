"""A party's checks in the VERIFY stage: tag the aggregate the server claims, then check every survivor's tags.

:meth:`Client.tag <fedfair.secagg.client.Client.tag>` and :meth:`Client.verify <fedfair.secagg.client.Client.verify>`
call :func:`tag_claim` and :func:`check_tags`: the client keeps its state (what it tagged: :class:`Tagged`), these
hold the stage's checks, each refusal a :class:`~fedfair.core.errors.VerificationError` naming its reason. The
construction they apply (challenge, masked tags, their sum) is :mod:`fedfair.secagg.verify`.
"""

from __future__ import annotations

from dataclasses import dataclass
import logging
from collections.abc import Iterable, Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import (
    VerificationError,
    VerifyReason,
)
from fedfair.pki.identity import is_valid_signature, sign
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import AdvertiseKeys
from fedfair.secagg.payloads import View
from fedfair.secagg.recheck import CARRY_DTYPE, check_reports, checked_peers, claimed_values, peer_values
from fedfair.secagg.resum import check_inputs, check_resummed, committed_secrets, resum_decides
from fedfair.secagg.verify import (
    BLOCK,
    Challenge,
    aggregate_digest,
    check_sum,
    encode_tags,
    masked_tags,
    tag_payload,
)
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import Header

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Claimed:
    """A claimed aggregate as a party checks it: its digest, what its tags must sum to, and its words."""

    digest: bytes
    """The claimed aggregate's digest (:func:`~fedfair.secagg.verify.aggregate_digest`), what every tag is signed over."""
    expected: tuple[int, ...]
    """The challenge's dots of the claimed aggregate: what the survivors' tags must sum to."""
    vector: np.ndarray
    """The claimed aggregate, as this party tagged (or, a round it took no part in, checks) it."""
    rechecked: tuple[int, ...] | None
    """Where the round is re-checked, what the survivors' re-checked values must sum to
    (:func:`~fedfair.secagg.recheck.claimed_values`); None otherwise."""


@dataclass(frozen=True, eq=False)
class Tagged(Claimed):
    """What a party keeps of the aggregate it tagged: to verify it, and to answer the same claim again."""

    message: AggregateTag
    """The tag this party sent."""


def tag_claim(
    claim: AggregateClaim,
    tagged: Tagged | None,
    plain: np.ndarray | Iterable[np.ndarray] | None,
    *,
    config: SecAggConfig,
    session: bytes,
    view: View,
    advertisements: Mapping[int, AdvertiseKeys],
    identities: Mapping[int, ec.EllipticCurvePublicKey],
    party: int,
    tag_keys: Mapping[int, bytes],
    identity_key: ec.EllipticCurvePrivateKey,
    header: Header,
) -> Tagged:
    """What ``party`` keeps of ``claim`` once tagged: its signed tag of ``plain`` under the claim's challenge.

    ``tagged`` is what the party kept of an earlier claim this round (None: none yet), returned again for
    the same aggregate; ``plain`` its plain encoded input, whole or in pieces (None: it kept none); ``view`` the
    view it signed (U3 and the survivors' masked-input digests); ``advertisements`` the ones it accepted;
    ``identities`` its peers' identity keys; ``tag_keys`` its pairwise tag keys by neighbour; ``header`` the tag's. Where the round re-sums
    (``config.resummed``) the party first unmasks the sum itself (:func:`~fedfair.secagg.resum.check_resummed`)
    and tags nothing else; where it is re-checked (``config.rechecked``) it recomputes the values of the peers it
    checks from the inputs its claim carries and reports them in its tag (:mod:`fedfair.secagg.recheck`). The refusals are :meth:`Client.tag <fedfair.secagg.client.Client.tag>`'s.
    """
    vector = claim.vector
    check_claim_shape(claim, config)
    survivors = view[1]
    digest = aggregate_digest(session, survivors, view[2], vector, claim.carries)
    if tagged is not None:
        if tagged.digest != digest:
            raise VerificationError(
                config.round,
                VerifyReason.EQUIVOCATED,
                "the aggregator showed this party a second, different aggregate for the round",
            )
        return tagged
    if plain is None:
        raise VerificationError(
            config.round, VerifyReason.MALFORMED, "this party kept no input to tag (built without verified)"
        )
    if config.resummed:
        check_resummed(
            vector,
            claim,
            config=config,
            session=session,
            view=view,
            advertisements=advertisements,
            identities=identities,
        )
    challenge = Challenge(session, digest, vector.size)
    values: tuple[tuple[int, bytes], ...] = ()
    rechecked = None
    if claim.carries is not None:
        # Above RESUMMED_WORDS, where colluders are allowed: this party re-checks its peers (fedfair.secagg.recheck).
        secrets = committed_secrets(
            claim, config=config, session=session, view=view, advertisements=advertisements, identities=identities
        )
        peers = checked_peers(survivors, party, config.security.max_colluding)
        check_inputs(claim.inputs, peers, vector, config=config, session=session, view=view)
        found = peer_values(
            challenge,
            zip(peers, claim.inputs, strict=True),
            secrets,
            session=session,
            config=config,
            survivors=survivors,
            advertisements=advertisements,
        )
        values = tuple((peer, encode_tags(value)) for peer, value in found)
        rechecked = claimed_values(challenge, vector, claim.carries)
    neighbours = set(survivors) & tag_keys.keys()
    keys = {peer: tag_keys[peer] for peer in sorted(neighbours)}
    tags = masked_tags(challenge, plain, party, keys, session, digest)
    signature = sign(identity_key, tag_payload(session, digest, party, tags, values))
    message = AggregateTag(header, party, tags, signature, values)
    # A writeable claim is copied, so the aggregate this party verifies is the one it tagged whatever its caller
    # does with the array; so is one that carried inputs, which then need not be held until the tags come.
    kept = vector.copy() if vector.flags.writeable or claim.inputs else vector
    return Tagged(digest, challenge.dots(vector), kept, rechecked, message)


def check_claim_shape(claim: AggregateClaim, config: SecAggConfig) -> None:
    """Refuse a claim whose aggregate has another word size or length than ``config``'s, or wrong carries.

    A re-checked round's claim (:attr:`~fedfair.secagg.config.SecAggConfig.rechecked`) carries one 16-bit carry
    per word of the aggregate; any other carries none.

    Raises:
        VerificationError: MALFORMED, naming which.
    """
    vector = claim.vector
    if vector.dtype.itemsize != np.dtype(config.encoder.dtype).itemsize or vector.shape != (config.dimension + 1,):
        raise VerificationError(
            config.round, VerifyReason.MALFORMED, "the claimed aggregate has the wrong word size or length"
        )
    carries = claim.carries
    if config.rechecked != (carries is not None) or (
        carries is not None and (carries.dtype != CARRY_DTYPE or carries.shape != vector.shape)
    ):
        wanted = "one 16-bit carry per word" if config.rechecked else "no carries"
        raise VerificationError(config.round, VerifyReason.MALFORMED, f"the claim must carry {wanted}")


def check_tags(
    tag_set: TagSet,
    tagged: Claimed,
    *,
    config: SecAggConfig,
    session: bytes,
    view: View,
    advertisements: Mapping[int, AdvertiseKeys],
    identities: Mapping[int, ec.EllipticCurvePublicKey],
) -> np.ndarray:
    """The aggregate ``tagged`` holds, once every signed tag in ``tag_set`` checks out and the tags sum to it.

    ``view`` is the one the party signed (U3 and the survivors' masked-input digests), ``advertisements`` the
    ones it accepted, ``identities`` its peers' identity keys. Where the party's own re-sum decides
    (:func:`~fedfair.secagg.resum.resum_decides`) a survivor's tag may be missing: every tag relayed must still be
    signed over this party's digest, and the sum of the tags is checked only when all of them arrived. The
    party re-summed the aggregate at :func:`tag_claim` where the round re-sums; above RESUMMED_WORDS it re-sums
    it here, from the material the tag set of such a round carries. The refusals are
    :meth:`Client.verify <fedfair.secagg.client.Client.verify>`'s.
    """
    round_number = config.round
    survivors = view[1]
    fields: dict[int, bytes] = {}
    reports: dict[int, tuple[tuple[int, bytes], ...]] = {}
    for entry in tag_set.tags:
        name = _name(config, entry.sender)
        if entry.sender not in survivors or entry.sender in fields:
            raise VerificationError(round_number, VerifyReason.BAD_TAG, f"{name} is not a survivor or tagged twice")
        payload = tag_payload(session, tagged.digest, entry.sender, entry.tags, entry.values)
        if not is_valid_signature(identities[entry.sender], entry.signature, payload):
            raise VerificationError(
                round_number,
                VerifyReason.BAD_TAG,
                f"{name}'s tag is not signed by it over the aggregate this party was shown "
                "(the aggregator showed survivors different aggregates, or altered the tag)",
            )
        fields[entry.sender] = entry.tags
        reports[entry.sender] = entry.values
    missing = sorted(set(survivors) - fields.keys())
    names = ", ".join(_name(config, party) for party in missing)
    if missing and resum_decides(config) and config.resummed:
        # The re-sum at tag_claim fixed the sum's value; a leaver's tag adds nothing to it (docs/security.md).
        logger.info("session %d: no tag from %s; the sum this party re-summed stands", round_number, names)
        return tagged.vector
    if missing and resum_decides(config) and tag_set.inputs:
        # Above RESUMMED_WORDS, for this round only: the same re-sum, from the tag set (docs/security.md).
        check_resummed(
            tagged.vector,
            tag_set,
            config=config,
            session=session,
            view=view,
            advertisements=advertisements,
            identities=identities,
        )
        logger.info("session %d: no tag from %s; this party re-summed the sum, and it stands", round_number, names)
        return tagged.vector
    if missing:
        material = ", and the tag set carries no masked inputs to re-sum" if resum_decides(config) else ""
        raise VerificationError(round_number, VerifyReason.MISSING_TAG, f"no tag from {names}{material}")
    if not check_sum(tagged.expected, fields.values()):
        names = ", ".join(_name(config, party) for party in survivors)
        raise VerificationError(
            round_number, VerifyReason.FORGED, f"the tags of {names} do not sum to the claimed aggregate's"
        )
    if tagged.rechecked is not None:
        check_reports(reports, tagged.rechecked, config=config, survivors=survivors)
    return tagged.vector


def _name(config: SecAggConfig, party: int) -> str:
    return config.name_of(party) if config.is_party(party) else f"party {party}"


PLAIN_PIECE = 16 * BLOCK
"""Words a party's input is read back a piece at a time to be tagged, when it keeps no copy (2 MiB of 16-bit words)."""
