"""A party's side of the VERIFY stage: tag the aggregate the server claims, then check every survivor's tags.

:meth:`Client.tag <fedfair.secagg.client.Client.tag>` and :meth:`Client.verify
<fedfair.secagg.client.Client.verify>` call :func:`tag_claim` and :func:`check_tags`: the client keeps
the round's order and its state, these hold the stage's checks, each refusal a
:class:`~fedfair.core.errors.VerificationError` naming its reason. The construction they apply
(challenge, masked tags, their sum) is :mod:`fedfair.secagg.verify`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import VerificationError, VerifyReason
from fedfair.pki.identity import is_valid_signature, sign
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.verify import TAG_BYTES, Challenge, aggregate_digest, check_sum, masked_tags, tag_payload
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import Header


@dataclass(frozen=True, eq=False)
class Tagged:
    """What a party keeps of the aggregate it tagged: to verify it, and to answer the same claim again."""

    digest: bytes
    """The claimed aggregate's digest (:func:`~fedfair.secagg.verify.aggregate_digest`), signed with the tag."""
    message: AggregateTag
    """The tag this party sent."""
    expected: tuple[int, ...]
    """The challenge's dots of the claimed aggregate: what the survivors' tags must sum to."""
    vector: np.ndarray
    """The claimed aggregate, as this party tagged it."""


def tag_claim(
    claim: AggregateClaim,
    tagged: Tagged | None,
    plain: np.ndarray | Iterable[np.ndarray] | None,
    *,
    config: SecAggConfig,
    session: bytes,
    survivors: tuple[int, ...],
    party: int,
    tag_keys: Mapping[int, bytes],
    identity_key: ec.EllipticCurvePrivateKey,
    header: Header,
) -> Tagged:
    """What ``party`` keeps of ``claim`` once tagged: its signed tag of ``plain`` under the claim's challenge.

    ``tagged`` is what the party kept of an earlier claim this round (None: none yet), returned again for
    the same aggregate; ``plain`` its plain encoded input, whole or in pieces (None: it kept none); ``survivors`` the U3 it
    signed; ``tag_keys`` its pairwise tag keys by neighbour; ``header`` the tag's. The refusals are
    :meth:`Client.tag <fedfair.secagg.client.Client.tag>`'s.
    """
    vector = claim.vector
    if vector.dtype.itemsize != np.dtype(config.encoder.dtype).itemsize or vector.shape != (config.dimension + 1,):
        raise VerificationError(
            config.round, VerifyReason.MALFORMED, "the claimed aggregate has the wrong word size or length"
        )
    digest = aggregate_digest(session, survivors, vector)
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
    challenge = Challenge(session, digest, vector.size)
    neighbours = set(survivors) & tag_keys.keys()
    keys = {peer: tag_keys[peer] for peer in sorted(neighbours)}
    tags = masked_tags(challenge, plain, party, keys, session, digest)
    signature = sign(identity_key, tag_payload(session, digest, party, tags))
    message = AggregateTag(header, party, tags, signature)
    # A received claim is a read-only view of its bytes: kept as it is. A writeable one is copied, so
    # the aggregate this party verifies is the one it tagged whatever its caller does with the array.
    kept = vector.copy() if vector.flags.writeable else vector
    return Tagged(digest, message, challenge.dots(vector), kept)


def check_tags(
    tag_set: TagSet,
    tagged: Tagged,
    *,
    config: SecAggConfig,
    session: bytes,
    survivors: tuple[int, ...],
    identities: Mapping[int, ec.EllipticCurvePublicKey],
) -> np.ndarray:
    """The aggregate ``tagged`` holds, once every survivor's signed tag in ``tag_set`` checks out and they sum to it.

    ``survivors`` is the U3 the party signed, ``identities`` its peers' identity keys. The refusals are
    :meth:`Client.verify <fedfair.secagg.client.Client.verify>`'s.
    """
    round_number = config.round
    fields: dict[int, bytes] = {}
    for entry in tag_set.tags:
        name = _name(config, entry.sender)
        if entry.sender not in survivors or entry.sender in fields:
            raise VerificationError(round_number, VerifyReason.BAD_TAG, f"{name} is not a survivor or tagged twice")
        payload = tag_payload(session, tagged.digest, entry.sender, entry.tags)
        if len(entry.tags) != TAG_BYTES or not is_valid_signature(identities[entry.sender], entry.signature, payload):
            raise VerificationError(
                round_number,
                VerifyReason.BAD_TAG,
                f"{name}'s tag is not signed by it over the aggregate this party was shown "
                "(the aggregator showed survivors different aggregates, or altered the tag)",
            )
        fields[entry.sender] = entry.tags
    missing = sorted(set(survivors) - fields.keys())
    if missing:
        names = ", ".join(_name(config, party) for party in missing)
        raise VerificationError(round_number, VerifyReason.MISSING_TAG, f"no tag from {names}")
    if not check_sum(tagged.expected, fields.values()):
        names = ", ".join(_name(config, party) for party in survivors)
        raise VerificationError(
            round_number, VerifyReason.FORGED, f"the tags of {names} do not sum to the claimed aggregate's"
        )
    return tagged.vector


def _name(config: SecAggConfig, party: int) -> str:
    return config.name_of(party) if config.is_party(party) else f"party {party}"
