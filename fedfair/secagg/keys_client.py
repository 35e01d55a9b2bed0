"""A party's key stages of secure aggregation: ADVERTISE, SHARE and CHECK.

Advertise fresh keys, deal the secrets' shares to the neighbours under one signature, check the shares dealt
to it and accuse bad senders. A step that receives a bad message raises a
:class:`~fedfair.core.errors.ProtocolError` subclass and leaves the state unchanged.
"""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import (
    AuthenticationError,
    ProtocolError,
    ThresholdError,
)
from fedfair.pki.identity import sign
from fedfair.secagg import keys, shamir
from fedfair.secagg.client_state import ClientState
from fedfair.secagg.codec import Writer
from fedfair.secagg.credentials import advertised_identity, verify_advertisement
from fedfair.secagg.messages import (
    AdvertiseKeys,
    EncryptedShares,
    KeyDirectory,
    ShareBundle,
    ShareCheck,
    ShareKeys,
)
from fedfair.secagg.payloads import (
    advertisement_payload,
    dealing_lines,
    dealing_payload,
    seed_commitment,
    session_id,
    share_check_payload,
)
from fedfair.secagg.shares import Held, Kind, open_entry
from fedfair.secagg.wire import Stage, check_header


class KeyStages(ClientState):
    """A party's ADVERTISE, SHARE and CHECK stages."""

    def advertise(self) -> AdvertiseKeys:
        """Stage ADVERTISE: publish this round's two public keys and seed commitment, signed."""
        cipher_public, mask_public = keys.public_bytes(self._cipher_key), keys.public_bytes(self._mask_key)
        commitment = seed_commitment(self.config.digest, self.party, self._seed)
        payload = advertisement_payload(self.config.digest, self.party, cipher_public, mask_public, commitment)
        self._advertisement = AdvertiseKeys(
            self._header(Stage.ADVERTISE),
            self.party,
            cipher_public,
            mask_public,
            commitment,
            self._credential,
            sign(self._identity_key, payload),
        )
        return self._advertisement

    def share_keys(self, directory: KeyDirectory) -> ShareKeys:
        """Stage SHARE: check every peer's signed keys, fix the session, send encrypted shares under one signature.

        Peers whose advertisement fails verification are excluded (see :attr:`excluded`).

        Raises:
            StaleMessageError: the directory is for another federation, round or stage.
            ProtocolError: the directory lists a party twice or leaves this party out.
            AuthenticationError: the directory carries keys for this party other than the ones it advertised.
            ThresholdError: fewer than t holders remain for this party's secrets.
        """
        check_header(directory, self.config, b"")
        senders = [advertisement.sender for advertisement in directory.advertisements]
        if len(set(senders)) != len(senders):
            raise ProtocolError("the key directory lists a party twice")
        if self.party not in senders:
            raise ProtocolError("the key directory leaves this party out")
        accepted: dict[int, AdvertiseKeys] = {}
        identities: dict[int, ec.EllipticCurvePublicKey] = {self.party: self._identity_key.public_key()}
        excluded: dict[int, str] = {}
        # X25519 secrets with each neighbour, (cipher, mask); the session id that salts them
        # is known only once every advertisement is judged.
        secrets: dict[int, tuple[bytes, bytes]] = {}
        neighbours = self.config.graph[self.party]
        for advertisement in directory.advertisements:
            sender = advertisement.sender
            if sender == self.party:
                if advertisement != self._advertisement:
                    raise AuthenticationError("the key directory carries keys for this party that it never advertised")
                accepted[self.party] = advertisement
                continue
            try:
                # A neighbour's keys are checked by using them (signature, then agreement). A
                # non-neighbour's are never used, so checking them would only cost every party
                # O(n) ECDSA checks and agreements a round: the server checks them all, and a bad
                # one it relays is refused by the owner's neighbours only, so the parties' session
                # ids differ and the round fails; nothing leaks.
                if sender in neighbours:
                    identity = verify_advertisement(advertisement, self.config, self._verify_credential)
                    secrets[sender] = (
                        keys.agree(self._cipher_key, advertisement.cipher_public_key),
                        keys.agree(self._mask_key, advertisement.mask_public_key),
                    )
                else:
                    identity = advertised_identity(advertisement, self.config, self._verify_credential)
            except ProtocolError as error:
                excluded[sender] = str(error)
                continue
            identities[sender] = identity
            accepted[sender] = advertisement
        holders = (neighbours & accepted.keys()) | {self.party}
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
        tag_keys: dict[int, bytes] = {}
        held: dict[int, Held] = {}
        for holder in sorted(holders):
            seed_bytes, key_bytes = seed_shares[holder].to_bytes(), key_shares[holder].to_bytes()
            if holder == self.party:
                held[self.party] = Held(seed_bytes, key_bytes)
                continue
            plaintext = Writer().u32(self.party).u32(holder).blob(seed_bytes).blob(key_bytes).getvalue()
            # Both directions use one key (the associated data tells them apart), so the key
            # that seals these shares also opens the peer's; the pairwise mask key depends only
            # on the directory too. Deriving both now keeps key agreement out of later steps.
            cipher_secret, mask_secret = secrets[holder]
            share_keys[holder] = keys.share_encryption_key(cipher_secret, session, self.party, holder)
            pair_keys[holder] = keys.pair_mask_key(mask_secret, session, self.party, holder)
            tag_keys[holder] = keys.pair_tag_key(mask_secret, session, self.party, holder)
            sealed = keys.seal(share_keys[holder], plaintext, keys.share_associated_data(session, self.party, holder))
            commitments = (
                Kind.SEED.commitment(session, self.party, holder, seed_bytes),
                Kind.MASK_KEY.commitment(session, self.party, holder, key_bytes),
            )
            encrypted.append(EncryptedShares(self.party, holder, sealed, *commitments))
        # One signature over every entry: a verification per dealer, not per share, for everyone.
        dealt_to, lines = dealing_lines(session, self.party, encrypted)
        signature = sign(self._identity_key, dealing_payload(session, self.party, dealt_to, lines))
        self._directory, self._identities, self.excluded, self._session = accepted, identities, excluded, session
        self._share_keys, self._pair_keys, self._tag_keys, self._held = share_keys, pair_keys, tag_keys, held
        return ShareKeys(self._header(Stage.SHARE), self.party, tuple(encrypted), signature)

    def check_shares(self, bundle: ShareBundle) -> ShareCheck:
        """Stage CHECK: verify, decrypt and store the shares addressed to this party; accuse bad senders.

        A sender is accused (see :attr:`accusations`) when its entry is not the line of its
        dealing for this party or the dealing's signature does not verify (the server altered
        it, or the sender signed garbage), the ciphertext fails authentication, or the
        plaintext is malformed, mislabelled or does not match the dealing's commitments.

        Raises:
            ProtocolError: the bundle is not this party's, lists an unexpected or repeated sender, or
                pairs an entry with another sender's dealing.
            ThresholdError: fewer than t holders of this party's secrets remain (itself and its valid senders).
        """
        check_header(bundle, self.config, self._session)
        if bundle.recipient != self.party:
            raise ProtocolError("share bundle is addressed to another party")
        seen: set[int] = set()
        for entry in bundle.shares:
            # _share_keys holds exactly the accepted neighbours.
            if entry.sender not in self._share_keys or entry.recipient != self.party or entry.sender in seen:
                raise ProtocolError(f"share bundle has an unexpected or repeated entry from party {entry.sender}")
            seen.add(entry.sender)
        if [dealing.dealer for dealing in bundle.dealings] != [entry.sender for entry in bundle.shares]:
            raise ProtocolError("share bundle does not pair each entry with its sender's dealing")
        valid: dict[int, Held] = {}
        accusations: dict[int, str] = {}
        for entry, dealing in zip(bundle.shares, bundle.dealings, strict=True):
            outcome = open_entry(
                entry,
                dealing,
                session=self._session,
                party=self.party,
                identity=self._identities[entry.sender],
                share_key=self._share_keys[entry.sender],
            )
            if isinstance(outcome, str):
                accusations[entry.sender] = outcome
            else:
                valid[entry.sender] = outcome
        if len(valid) + 1 < self.config.t:
            raise ThresholdError(
                f"only {len(valid) + 1} holders of this party's secrets remain (itself and {len(valid)} peers whose "
                f"shares check out), below the threshold {self.config.t}; round aborted"
            )
        accused = tuple(sorted(accusations))
        signature = sign(self._identity_key, share_check_payload(self._session, self.party, accused))
        self._held.update(valid)
        self._accused = frozenset(accused)
        self.accusations = accusations
        return ShareCheck(self._header(Stage.CHECK), self.party, accused, signature)
