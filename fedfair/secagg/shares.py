"""The shares a party holds of its peers' secrets.

Opening a dealer's entry, revealing one share, and the signatures that must come before any share is revealed.

Each peer deals this party a share of its self-mask seed and of its mask key, sealed for it,
with a commitment to each share in the line of its signed dealing addressed to this party
(so the server can check a share revealed later against what its dealer dealt). A party
reveals a share only for the one view it signed, and only once t distinct survivors signed
that same view (:func:`check_view_signatures`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError, ProtocolError, UnmaskRefusedError
from fedfair.pki.identity import is_valid_signature
from fedfair.secagg import keys, shamir
from fedfair.secagg.codec import Reader
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import Dealing, EncryptedShares, RevealedShare
from fedfair.secagg.payloads import View, consistency_payload, dealing_line, dealing_payload, share_commitment

SECRET_BYTES = 32
"""Length of the two shared secrets: the self-mask seed and the raw X25519 mask key."""

SHARE_CHUNKS = -(-SECRET_BYTES // shamir.CHUNK_BYTES)
"""Field elements per share of a secret."""


class Kind(enum.Enum):
    """Which secret of a peer a share is of."""

    SEED = "self-mask seed"
    MASK_KEY = "mask key"

    def commitment(self, session: bytes, owner: int, holder: int, share: bytes) -> bytes:
        """The 32-byte commitment to ``holder``'s share of ``owner``'s secret of this kind.

        It is :func:`~fedfair.secagg.payloads.share_commitment`, with this kind's name bound in.
        """
        return share_commitment(session, owner, holder, self.name, share)


@dataclass(frozen=True)
class Held:
    """The two shares a dealer gave this party (serialised), as received and checked against its dealing."""

    seed: bytes
    key: bytes

    def reveal(self, owner: int, kind: Kind) -> RevealedShare:
        """The UNMASK answer revealing this party's share of ``owner``'s secret ``kind``."""
        return RevealedShare(owner, self.seed if kind is Kind.SEED else self.key)


def open_entry(
    entry: EncryptedShares,
    dealing: Dealing,
    *,
    session: bytes,
    party: int,
    identity: ec.EllipticCurvePublicKey,
    share_key: bytes,
) -> Held | str:
    """The checked shares in one bundle entry addressed to `party`, or why its sender is accused.

    `dealing` is the sender's signed dealing as the server relayed it, `identity` the sender's
    verified identity key and `share_key` the key this party agreed with the sender for sealing
    shares. The entry must be the dealing's line for `party` (one signature check per sender),
    and the shares inside must match the line's commitments, so that the shares this party
    keeps are the ones the server will check its reveals against.
    """
    sender = entry.sender
    if dealing.line(party) != dealing_line(session, sender, entry):
        return "its share entry does not match its signed dealing"
    signed = dealing_payload(session, sender, dealing.holders, dealing.lines)
    if not is_valid_signature(identity, dealing.signature, signed):
        return "its dealing's signature does not verify"
    associated_data = keys.share_associated_data(session, sender, party)
    try:
        plaintext = keys.open_sealed(share_key, entry.ciphertext, associated_data)
    except AuthenticationError:
        return "its encrypted shares fail authentication"
    try:
        reader = Reader(plaintext)
        claimed_sender, claimed_recipient = reader.u32(), reader.u32()
        seed_bytes, key_bytes = reader.blob(), reader.blob()
        reader.finish()
        seed_share, key_share = shamir.Share.from_bytes(seed_bytes), shamir.Share.from_bytes(key_bytes)
    except ProtocolError:
        return "its shares are malformed"
    if (claimed_sender, claimed_recipient) != (sender, party) or seed_share.x != party or key_share.x != party:
        return "its shares are labelled for another sender or recipient"
    if len(seed_share.values) != SHARE_CHUNKS or len(key_share.values) != SHARE_CHUNKS:
        return "its shares have the wrong length"
    if (
        Kind.SEED.commitment(session, sender, party, seed_bytes) != entry.seed_commitment
        or Kind.MASK_KEY.commitment(session, sender, party, key_bytes) != entry.key_commitment
    ):
        return "its shares do not match the commitments in its signed dealing"
    return Held(seed_bytes, key_bytes)


def revealed_for_view(
    held: Mapping[int, Held],
    signatures: tuple[tuple[int, bytes], ...],
    view: View,
    *,
    session: bytes,
    identities: Mapping[int, ec.EllipticCurvePublicKey],
    config: SecAggConfig,
) -> tuple[tuple[RevealedShare, ...], tuple[RevealedShare, ...]]:
    """The shares a party reveals for the one `view` (U2', U3, input digests) it signed: (seed shares, mask-key shares).

    Of each survivor's seed and each dropped party's mask key it holds a share of, once
    :func:`check_view_signatures` accepts the relayed `signatures`; the view alone decides which kind each owner
    gets, so no later request can obtain the other.
    """
    masking_set, survivors, _inputs = view
    dropped = set(masking_set) - set(survivors)
    wanted = {owner: Kind.SEED for owner in set(survivors) & held.keys()}
    wanted.update({owner: Kind.MASK_KEY for owner in dropped & held.keys()})
    check_view_signatures(signatures, view, session=session, identities=identities, config=config, wanted=wanted)

    def of(kind: Kind) -> tuple[RevealedShare, ...]:
        return tuple(held[owner].reveal(owner, kind) for owner in sorted(wanted) if wanted[owner] is kind)

    return of(Kind.SEED), of(Kind.MASK_KEY)


def check_view_signatures(
    signatures: tuple[tuple[int, bytes], ...],
    view: View,
    *,
    session: bytes,
    identities: Mapping[int, ec.EllipticCurvePublicKey],
    config: SecAggConfig,
    wanted: Mapping[int, Kind],
) -> None:
    """Refuse unless t distinct survivors of `view` (t holders of every owner in `wanted`) signed it.

    `view` is the (U2', U3, input digests) this party signed; `signatures` are the (party, signature) pairs the
    server relayed. Signatures of non-survivors, repeats and forgeries do not count.
    """
    payload = consistency_payload(session, *view)
    survivors = set(view[1])
    t = config.t
    holders = {owner: config.holders_of(owner) for owner in wanted}
    counted = dict.fromkeys(holders, 0)
    short = set(holders)  # owners with fewer than t of their holders among the signers
    signers: set[int] = set()

    def enough() -> bool:
        return len(signers) >= t and not short

    # The signers that hold the most of the secrets asked for first: fewer signatures to check.
    weight = {party: sum(party in group for group in holders.values()) for party, _ in signatures}
    for party, signature in sorted(signatures, key=lambda pair: (-weight[pair[0]], pair[0])):
        if enough():
            break
        if party not in survivors or party in signers:
            continue
        # On a SecAgg+ graph most survivors hold none of the secrets asked for: once t have
        # signed, a signature counts only for an owner still short, and only that one is checked.
        helps = [owner for owner in short if party in holders[owner]]
        if (len(signers) >= t and not helps) or not is_valid_signature(identities[party], signature, payload):
            continue
        signers.add(party)
        for owner in helps:
            counted[owner] += 1
            if counted[owner] >= t:
                short.discard(owner)
    if not enough():
        raise UnmaskRefusedError(
            f"only {len(signers)} distinct survivors signed the view this party signed (t = {t} needed, "
            "from the holders of every secret asked for); the server may be showing different views, refused"
        )
