"""A party's side of secure aggregation (Bonawitz et al. 2017, signed-key variant).

:class:`Client` is a state machine over the plain messages of
:mod:`fedfair.secagg.messages`; it performs no I/O. A runtime calls its steps in
order, carrying each returned message to the server and each server message back:

    advertise()                          -> AdvertiseKeys
    share_keys(KeyDirectory)             -> ShareKeys
    masked_input(ShareBundle, encoded)   -> MaskedInput
    unmask(UnmaskRequest)                -> UnmaskResponse   (may be repeated)

A step that receives a bad message raises a :class:`~fedfair.secagg.errors.ProtocolError`
subclass and leaves the state unchanged, so the runtime may wait for a correct one.

What the party protects. Its input y = x + PRG(b) + sum_v +-PRG(k_uv) reaches the
server masked twice. It reveals a share of a peer's self-mask seed b only if the
server says that peer's masked input arrived, and a share of a peer's mask key only
if the server says it did not, and it remembers what it revealed: a request that
would give out the other kind for the same peer is refused, so the server never
holds both and can never strip both masks from one input.
"""

from __future__ import annotations

import enum
import os

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ConfigError
from fedfair.pki.identity import (
    CredentialVerifier,
    IdentityError,
    is_valid_signature,
    sign,
)
from fedfair.secagg import keys, prg, shamir
from fedfair.secagg.codec import Reader, Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.errors import (
    AuthenticationError,
    ProtocolError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.secagg.messages import (
    AdvertiseKeys,
    EncryptedShares,
    Header,
    KeyDirectory,
    MaskedInput,
    RevealedShare,
    ShareBundle,
    ShareKeys,
    Stage,
    UnmaskRequest,
    UnmaskResponse,
    advertisement_payload,
    check_header,
    session_id,
)

SECRET_BYTES = 32
"""Length of the two shared secrets: the self-mask seed and the raw X25519 mask key."""


class _Kind(enum.Enum):
    """Which secret of a peer this party has revealed a share of."""

    SEED = "self-mask seed"
    MASK_KEY = "mask key"


def verify_advertisement(
    advertisement: AdvertiseKeys, config: SecAggConfig, verify_credential: CredentialVerifier
) -> None:
    """Check that an advertisement is for this round and signed by the roster party it names.

    Raises :class:`~fedfair.secagg.errors.StaleMessageError` for another round,
    :class:`ProtocolError` for a party outside the roster, and :class:`AuthenticationError`
    for an unusable X25519 key or when the credential or the signature does not verify
    (a forged or swapped key).
    """
    check_header(advertisement, config, b"")
    if not config.is_party(advertisement.sender):
        raise ProtocolError(f"advertisement names party {advertisement.sender}, which is not in the roster")
    for public in (advertisement.cipher_public_key, advertisement.mask_public_key):
        keys.check_public_key(public)
    try:
        identity = verify_credential(config.name_of(advertisement.sender), advertisement.credential)
    except IdentityError as error:
        raise AuthenticationError(f"party {advertisement.sender}'s credential is not trusted: {error}") from None
    payload = advertisement_payload(
        config.digest, advertisement.sender, advertisement.cipher_public_key, advertisement.mask_public_key
    )
    if not is_valid_signature(identity, advertisement.signature, payload):
        raise AuthenticationError(
            f"party {advertisement.sender}'s advertised keys do not match its signature (forged or swapped keys)"
        )


class Client:
    """One party's state for one round.

    config: the round's public parameters (the same at every party and the server).
    name: this party's roster name.
    identity_key: its ECDSA P-256 identity private key (the one its certificate certifies).
    credential: what peers verify that key with: its certificate (DER) or, without a PKI,
        its DER public key.
    verify_credential: turns a peer's name and relayed credential into its trusted public key.
    """

    def __init__(
        self,
        config: SecAggConfig,
        name: str,
        identity_key: ec.EllipticCurvePrivateKey,
        credential: bytes,
        verify_credential: CredentialVerifier,
    ) -> None:
        self.config = config
        self.party = config.party_id(name)
        self._identity_key = identity_key
        self._credential = credential
        self._verify_credential = verify_credential
        # Fresh secrets every round: nothing learnt in one round helps unmask another.
        self._cipher_key = keys.generate_key_pair()
        self._mask_key = keys.generate_key_pair()
        self._seed = os.urandom(SECRET_BYTES)
        self._next = Stage.ADVERTISE
        self._advertisement: AdvertiseKeys | None = None
        self._directory: dict[int, AdvertiseKeys] = {}
        self._session = b""
        self._share_keys: dict[int, bytes] = {}
        self._pair_keys: dict[int, bytes] = {}
        self._held: dict[int, tuple[shamir.Share, shamir.Share]] = {}
        self._revealed: dict[int, _Kind] = {}
        self.excluded: dict[int, str] = {}
        """Peers whose advertisements were refused, with the reason; they take no part."""

    @property
    def session_id(self) -> bytes:
        """The session id, known once the key directory is accepted (empty before)."""
        return self._session

    def advertise(self) -> AdvertiseKeys:
        """Stage ADVERTISE: publish this round's two public keys, signed with the identity key."""
        self._expect(Stage.ADVERTISE, "advertise")
        cipher_public, mask_public = keys.public_bytes(self._cipher_key), keys.public_bytes(self._mask_key)
        signature = sign(
            self._identity_key, advertisement_payload(self.config.digest, self.party, cipher_public, mask_public)
        )
        self._advertisement = AdvertiseKeys(
            self._header(Stage.ADVERTISE), self.party, cipher_public, mask_public, self._credential, signature
        )
        self._next = Stage.SHARE
        return self._advertisement

    def share_keys(self, directory: KeyDirectory) -> ShareKeys:
        """Stage SHARE: check every peer's signed keys, fix the session, send encrypted shares.

        Peers whose advertisement fails verification are excluded (see :attr:`excluded`).
        Raises :class:`AuthenticationError` if the directory carries keys for this party
        other than the ones it advertised, and :class:`ThresholdError` if fewer than t
        holders remain for its secrets.
        """
        self._expect(Stage.SHARE, "share_keys")
        check_header(directory, self.config, b"")
        senders = [advertisement.sender for advertisement in directory.advertisements]
        if len(set(senders)) != len(senders):
            raise ProtocolError("the key directory lists a party twice")
        if self.party not in senders:
            raise ProtocolError("the key directory leaves this party out")
        accepted: dict[int, AdvertiseKeys] = {}
        excluded: dict[int, str] = {}
        for advertisement in directory.advertisements:
            if advertisement.sender == self.party:
                if advertisement != self._advertisement:
                    raise AuthenticationError("the key directory carries keys for this party that it never advertised")
                accepted[self.party] = advertisement
                continue
            try:
                verify_advertisement(advertisement, self.config, self._verify_credential)
            except ProtocolError as error:
                excluded[advertisement.sender] = str(error)
                continue
            accepted[advertisement.sender] = advertisement
        holders = (self.config.graph[self.party] & accepted.keys()) | {self.party}
        if len(holders) < self.config.t:
            raise ThresholdError(
                f"only {len(holders)} parties can hold this party's shares, below the threshold "
                f"{self.config.t}; round aborted"
            )
        session = session_id(self.config.digest, tuple(accepted.values()))
        seed_shares = shamir.split(self._seed, self.config.t, holders)
        key_shares = shamir.split(keys.private_bytes(self._mask_key), self.config.t, holders)
        encrypted = []
        share_keys: dict[int, bytes] = {}
        pair_keys: dict[int, bytes] = {}
        for peer in sorted(holders - {self.party}):
            plaintext = (
                Writer()
                .u32(self.party)
                .u32(peer)
                .blob(seed_shares[peer].to_bytes())
                .blob(key_shares[peer].to_bytes())
                .getvalue()
            )
            # Both directions use one key (the associated data tells them apart), so the key
            # that seals these shares also opens the peer's; the pairwise mask key depends only
            # on the directory too. Deriving both now keeps key agreement out of the MASK step.
            share_keys[peer] = keys.share_encryption_key(
                self._cipher_key, accepted[peer].cipher_public_key, session, self.party, peer
            )
            pair_keys[peer] = keys.pair_mask_key(
                self._mask_key, accepted[peer].mask_public_key, session, self.party, peer
            )
            sealed = keys.seal(share_keys[peer], plaintext, keys.share_associated_data(session, self.party, peer))
            encrypted.append(EncryptedShares(self.party, peer, sealed))
        self._directory, self.excluded, self._session = accepted, excluded, session
        self._share_keys, self._pair_keys = share_keys, pair_keys
        self._held[self.party] = (seed_shares[self.party], key_shares[self.party])
        self._next = Stage.MASK
        return ShareKeys(self._header(Stage.SHARE), self.party, tuple(encrypted))

    def masked_input(self, bundle: ShareBundle, encoded: np.ndarray) -> MaskedInput:
        """Stage MASK: store peers' shares and mask the encoded update.

        ``encoded`` comes from ``config.encoder.encode(weight * delta, weight)``. It is masked
        in place and becomes the message's vector, which saves a copy of d words; pass a copy
        to keep the plain encoding. The party masks against exactly the peers whose shares it
        received, with its self mask on top. A refused bundle leaves ``encoded`` untouched.
        """
        self._expect(Stage.MASK, "masked_input")
        check_header(bundle, self.config, self._session)
        encoder = self.config.encoder
        if (
            encoded.dtype != encoder.dtype
            or encoded.shape != (self.config.dimension + 1,)
            or not (encoded.flags.c_contiguous and encoded.flags.writeable)
        ):
            raise ConfigError(
                f"the encoded update must be a writeable {np.dtype(encoder.dtype).name} array of length "
                f"{self.config.dimension + 1}; "
                "encode it with config.encoder.encode(weighted_vector, weight)"
            )
        if bundle.recipient != self.party:
            raise ProtocolError("share bundle is addressed to another party")
        received = self._open_bundle(bundle)
        if len(received) + 1 < self.config.t:
            raise ThresholdError(
                f"only {len(received)} peers shared keys with this party, below the threshold {self.config.t}; "
                "round aborted"
            )
        masks: list[prg.Mask] = [(keys.self_mask_key(self._seed, self._session, self.party), 1)]
        # The smaller id adds, the larger subtracts: each pair cancels in the sum.
        masks += [(self._pair_keys[peer], 1 if self.party < peer else -1) for peer in sorted(received)]
        prg.apply_masks(encoded, masks)
        self._held.update(received)
        self._next = Stage.UNMASK
        return MaskedInput(self._header(Stage.MASK), self.party, encoded)

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Stage UNMASK: reveal seed shares of survivors and mask-key shares of dropped peers.

        Refuses (:class:`UnmaskRefusedError`) a request that lists a party as both, lists this
        party as dropped, names parties outside the session, or would reveal the other kind
        of share for a peer than an earlier request did.
        """
        self._expect(Stage.UNMASK, "unmask")
        check_header(request, self.config, self._session)
        survivors, dropped = set(request.survivors), set(request.dropped)
        if len(survivors) != len(request.survivors) or len(dropped) != len(request.dropped):
            raise ProtocolError("unmask request lists a party twice")
        both = survivors & dropped
        if both:
            raise UnmaskRefusedError(f"unmask request lists party {min(both)} as both survivor and dropped; refused")
        if self.party not in survivors:
            raise UnmaskRefusedError(
                "unmask request lists this party as dropped although it sent its masked input; refused"
            )
        unknown = (survivors | dropped) - self._directory.keys()
        if unknown:
            raise UnmaskRefusedError(
                f"unmask request names party {min(unknown)}, which is not in this session; refused"
            )
        if len(survivors) < self.config.t:
            raise ThresholdError(f"only {len(survivors)} survivors, below the threshold {self.config.t}; round aborted")
        wanted = {owner: _Kind.SEED for owner in survivors & self._held.keys()}
        wanted.update({owner: _Kind.MASK_KEY for owner in dropped & self._held.keys()})
        for owner, kind in wanted.items():
            earlier = self._revealed.get(owner)
            if earlier is not None and earlier is not kind:
                raise UnmaskRefusedError(
                    f"unmask request asks for party {owner}'s {kind.value} share after its {earlier.value} share "
                    "was revealed; revealing both would unmask its input, refused"
                )
        self._revealed.update(wanted)
        seed_shares = tuple(
            RevealedShare(owner, self._held[owner][0].to_bytes())
            for owner in sorted(wanted)
            if wanted[owner] is _Kind.SEED
        )
        key_shares = tuple(
            RevealedShare(owner, self._held[owner][1].to_bytes())
            for owner in sorted(wanted)
            if wanted[owner] is _Kind.MASK_KEY
        )
        return UnmaskResponse(self._header(Stage.UNMASK), self.party, seed_shares, key_shares)

    def _open_bundle(self, bundle: ShareBundle) -> dict[int, tuple[shamir.Share, shamir.Share]]:
        """Decrypt and check every share in ``bundle``; nothing is stored unless all are valid."""
        received: dict[int, tuple[shamir.Share, shamir.Share]] = {}
        for entry in bundle.shares:
            sender = entry.sender
            # _share_keys holds exactly the accepted neighbours.
            if sender not in self._share_keys or entry.recipient != self.party or sender in received:
                raise ProtocolError(f"share bundle has an unexpected or repeated entry from party {sender}")
            plaintext = keys.open_sealed(
                self._share_keys[sender],
                entry.ciphertext,
                keys.share_associated_data(self._session, sender, self.party),
            )
            reader = Reader(plaintext)
            claimed_sender, claimed_recipient = reader.u32(), reader.u32()
            seed_share, key_share = shamir.Share.from_bytes(reader.blob()), shamir.Share.from_bytes(reader.blob())
            reader.finish()
            if (
                (claimed_sender, claimed_recipient) != (sender, self.party)
                or seed_share.x != self.party
                or key_share.x != self.party
            ):
                raise AuthenticationError(f"shares from party {sender} are labelled for another sender or recipient")
            received[sender] = (seed_share, key_share)
        return received

    def _expect(self, stage: Stage, step: str) -> None:
        if self._next is not stage:
            raise ProtocolError(f"{step}() called out of order: this party is waiting for stage {self._next.name}")

    def _header(self, stage: Stage) -> Header:
        return Header(
            self.config.federation_id, self.config.round, stage, b"" if stage is Stage.ADVERTISE else self._session
        )
