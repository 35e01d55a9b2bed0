"""A party's side of secure aggregation (Bonawitz et al. 2017, active-adversary variant, protocol v3).

:class:`Client` is a state machine over the messages of :mod:`fedfair.secagg.messages`, with no I/O: one step per
stage, ``advertise``, ``share_keys``, ``check_shares``, ``masked_input``, ``consistency`` and ``unmask`` (the last
two may be repeated), then in a verified round ``tag`` and ``verify`` (their checks:
:mod:`fedfair.secagg.verify_client`). It keeps no order of its own: its runner takes each step in the round's order
(:class:`~fedfair.secagg.round_order.PartyOrder`). A step that receives a bad message raises a
:class:`~fedfair.core.errors.ProtocolError` subclass and leaves the state unchanged; a peer's bad shares are accused,
not raised. The checks by which a party keeps a lying server from both secrets of one party are listed in
docs/design.md ("Inside secure aggregation").
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import AuthenticationError, ConfigError, ProtocolError, ThresholdError, UnmaskRefusedError
from fedfair.pki.identity import CredentialVerifier, sign
from fedfair.secagg import keys, prg, shamir
from fedfair.secagg.codec import Writer
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.credentials import advertised_identity, verify_advertisement
from fedfair.secagg.graph import check_survivors
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    EncryptedShares,
    KeyDirectory,
    MaskedInput,
    MaskingSet,
    ShareBundle,
    ShareCheck,
    ShareKeys,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.payloads import (
    View,
    advertisement_payload,
    consistency_payload,
    dealing_lines,
    dealing_payload,
    masked_input_digest,
    seed_commitment,
    session_id,
    share_check_payload,
)
from fedfair.secagg.shares import Held, Kind, SECRET_BYTES, open_entry, revealed_for_view
from fedfair.secagg.verify_client import PLAIN_PIECE, Tagged, check_tags, tag_claim
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.wire import Header, Stage, check_header, check_ids

__all__ = ["PLAIN_PIECE", "Client"]


class Client:
    """One party's state for one round, and its step of each stage.

    config: the round's public parameters (the same at every party and the server).
    name: this party's roster name.
    identity_key: its ECDSA P-256 identity private key (the one its certificate certifies).
    credential: what peers verify that key with: its certificate (DER) or, without a PKI,
        its DER public key.
    verify_credential: turns a peer's name and relayed credential into its trusted public key.
    verified: keep a copy of the plain encoded input at MASK, so the party can tag and verify the aggregate
        in the VERIFY stage (``tag``, ``verify``; one copy of the d + 1 words more). A caller that keeps those
        words itself leaves it False and hands them to ``tag`` instead.
    """

    def __init__(
        self,
        config: SecAggConfig,
        name: str,
        identity_key: ec.EllipticCurvePrivateKey,
        credential: bytes,
        verify_credential: CredentialVerifier,
        *,
        verified: bool = False,
    ) -> None:
        self.config = config
        self._verified = verified
        self._plain: np.ndarray | None = None
        self._tag_keys: dict[int, bytes] = {}
        self._tagged: Tagged | None = None
        self.party = config.party_id(name)
        self._identity_key = identity_key
        self._credential = credential
        self._verify_credential = verify_credential
        # Fresh secrets every round: nothing learnt in one round helps unmask another.
        self._cipher_key = keys.generate_key_pair()
        self._mask_key = keys.generate_key_pair()
        self._seed = os.urandom(SECRET_BYTES)
        self._advertisement: AdvertiseKeys | None = None
        self._directory: dict[int, AdvertiseKeys] = {}
        self._identities: dict[int, ec.EllipticCurvePublicKey] = {}
        self._session = b""
        self._share_keys: dict[int, bytes] = {}
        self._pair_keys: dict[int, bytes] = {}
        self._held: dict[int, Held] = {}
        self._accused: frozenset[int] = frozenset()
        self._masking_set: tuple[int, ...] | None = None
        self._signed: ConsistencySignature | None = None
        self._view: View | None = None
        self._input_digest = b""
        self._answered: tuple[UnmaskRequest, UnmaskResponse] | None = None
        self.excluded: dict[int, str] = {}
        """Peers whose advertisements were refused, with the reason; they take no part."""
        self.accusations: dict[int, str] = {}
        """Peers this party accused in its share check, with the reason."""

    @property
    def session_id(self) -> bytes:
        """The session id, known once the key directory is accepted (empty before)."""
        return self._session

    @property
    def signed_view(self) -> View | None:
        """The view (U2', U3, the survivors' masked-input digests) this party signed at CONSISTENCY, or None before."""
        return self._view

    def _header(self, stage: Stage) -> Header:
        return Header(
            self.config.federation_id, self.config.round, stage, b"" if stage is Stage.ADVERTISE else self._session
        )

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

    def masked_input(self, masking_set: MaskingSet, encoded: np.ndarray) -> MaskedInput:
        """Stage MASK: mask the encoded update against exactly this party's neighbours in U2'.

        ``encoded`` comes from ``config.encoder.encode(weight * delta, weight)``. It is masked
        in place and becomes the message's vector, which saves a copy of d words; pass a copy
        to keep the plain encoding. A refused masking set leaves ``encoded`` untouched.

        Raises:
            UnmaskRefusedError: the masking set contains a party this party accused, or a neighbour
                whose checked shares it does not hold.
            ProtocolError: this party is not in the masking set (it was accused, or its check was lost:
                it takes no further part).
            ThresholdError: the masking set leaves fewer than t of this party's holders (itself included).
        """
        check_header(masking_set, self.config, self._session)
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
        check_ids(masking_set.parties, "the masking set")
        members = set(masking_set.parties)
        unknown = members - self._directory.keys()
        if unknown:
            raise ProtocolError(f"the masking set names party {min(unknown)}, which is not in this session")
        if self.party not in members:
            raise ProtocolError(
                "the masking set leaves this party out (it was accused or its share check was lost); "
                "it takes no further part in this round"
            )
        accused = members & self._accused
        if accused:
            raise UnmaskRefusedError(
                f"the masking set includes party {min(accused)}, which this party accused at CHECK; refused"
            )
        maskers = members & self.config.graph[self.party]
        missing = maskers - self._held.keys()
        if missing:
            raise UnmaskRefusedError(
                f"the masking set includes neighbour {min(missing)}, whose checked shares this party does not hold; "
                "refused"
            )
        if len(maskers) + 1 < self.config.t:
            raise ThresholdError(
                f"the masking set leaves {len(maskers) + 1} holders of this party's secrets, below the threshold "
                f"{self.config.t}; round aborted"
            )
        masks: list[prg.Mask] = [(keys.self_mask_key(self._seed, self._session, self.party), 1)]
        # The smaller id adds, the larger subtracts: each pair cancels in the sum.
        masks += [(self._pair_keys[peer], 1 if self.party < peer else -1) for peer in sorted(maskers)]
        if self._verified is True:
            self._plain = encoded.copy()
        prg.apply_masks(encoded, masks)
        self._input_digest = masked_input_digest(self._session, self.party, encoded)
        self._masking_set = masking_set.parties
        return MaskedInput(self._header(Stage.MASK), self.party, encoded)

    def consistency(self, survivor_set: SurvivorSet) -> ConsistencySignature:
        """Stage CONSISTENCY: sign the server's view (U2', U3, the survivors' masked-input digests), once.

        The same view asked again gets the same signature again.

        Raises:
            UnmaskRefusedError: a view whose U2' differs from the masking set this party masked for,
                whose U3 is not within U2' or leaves this party out, that names no digest for some survivor
                or another one for this party's own masked input, any view other than the one it
                already signed, and, on a SecAgg+ graph, survivors whose subgraph max_colluding of them
                could cut (the aggregator would unmask the sum of a piece:
                :func:`~fedfair.secagg.graph.check_survivors`).
            ThresholdError: U3 has fewer than t parties.
        """
        if self._signed is not None:
            check_header(survivor_set, self.config, self._session)
            if self._view != (survivor_set.masking_set, survivor_set.survivors, survivor_set.inputs):
                raise UnmaskRefusedError("this party already signed another view of the round; refused")
            return self._signed
        check_header(survivor_set, self.config, self._session)
        check_ids(survivor_set.masking_set, "the survivor set's masking set")
        check_ids(survivor_set.survivors, "the survivor set")
        if survivor_set.masking_set != self._masking_set:
            raise UnmaskRefusedError("the survivor set's masking set differs from the one this party masked for")
        survivors = set(survivor_set.survivors)
        if not survivors <= set(survivor_set.masking_set):
            raise UnmaskRefusedError("the survivor set names a party outside the masking set; refused")
        if self.party not in survivors:
            raise UnmaskRefusedError(
                "the survivor set leaves this party out although it sent its masked input; refused"
            )
        if len(survivors) < self.config.t:
            raise ThresholdError(f"only {len(survivors)} survivors, below the threshold {self.config.t}; round aborted")
        check_survivors(self.config.graph, survivors, self.config.security.max_colluding)
        if len(survivor_set.inputs) != len(survivor_set.survivors):
            raise UnmaskRefusedError("the survivor set does not name one masked-input digest per survivor; refused")
        if survivor_set.inputs[survivor_set.survivors.index(self.party)] != self._input_digest:
            raise UnmaskRefusedError("the survivor set names another masked input for this party than it sent; refused")
        view = (survivor_set.masking_set, survivor_set.survivors, survivor_set.inputs)
        signature = sign(self._identity_key, consistency_payload(self._session, *view))
        self._view = view
        self._signed = ConsistencySignature(self._header(Stage.CONSISTENCY), self.party, signature)
        return self._signed

    def unmask(self, request: UnmaskRequest) -> UnmaskResponse:
        """Stage UNMASK: reveal seed shares of survivors and mask-key shares of dropped peers.

        Which kind of share each peer gets follows from the one view this party signed, so no
        later request can obtain the other kind. The same request again gets the same answer.

        Raises:
            UnmaskRefusedError: the request's survivors and dropped are not exactly the view this party
                signed, or it carries valid consistency signatures of fewer than t distinct survivors on
                that view (fewer than t of an owner's holders on a SecAgg+ graph).
        """
        if self._view is None:
            raise ProtocolError("unmask() called before this party signed the survivor set")
        check_header(request, self.config, self._session)
        if self._answered is not None and self._answered[0] == request:
            return self._answered[1]
        check_ids(request.survivors, "the unmask request's survivors")
        check_ids(request.dropped, "the unmask request's dropped parties")
        masking_set, survivors, _inputs = self._view
        if request.survivors != survivors or request.masking_set != masking_set:
            raise UnmaskRefusedError(
                "the unmask request's survivors or dropped parties differ from the view this party signed; refused"
            )
        seed_shares, key_shares = revealed_for_view(
            self._held,
            request.signatures,
            self._view,
            session=self._session,
            identities=self._identities,
            config=self.config,
        )
        response = UnmaskResponse(self._header(Stage.UNMASK), self.party, seed_shares, key_shares)
        self._answered = (request, response)
        return response

    def tag(self, claim: AggregateClaim, own: Iterable[np.ndarray] | None = None) -> AggregateTag:
        """Stage VERIFY: tag this party's input under the challenge of the aggregate the server claims, signed.

        Derives the challenge from the claim's digest (:func:`~fedfair.secagg.verify.aggregate_digest` over the
        survivors this party signed), computes <r, S'> for :meth:`verify` and the masked tags of its own input.
        The same claim again gets the same tag; a party tags one aggregate per round.

        `own` is this party's plain encoded input where the caller keeps it (a party built without ``verified``):
        its words in pieces of :data:`PLAIN_PIECE`, the last shorter. None: the copy kept at MASK.

        Raises:
            VerificationError: reason MALFORMED for a claim of the wrong shape (or a party given no input: built
                without ``verified`` and no `own`), EQUIVOCATED for a second, different aggregate; where the round
                re-sums, FORGED or MALFORMED for a claim that is not the sum of the inputs the party's view fixes
                (:func:`~fedfair.secagg.resum.check_resummed`).
            ProtocolError: called before this party signed the survivor set; StaleMessageError for a claim of
                another federation, round or session.
        """
        if self._view is None:
            raise ProtocolError("tag() called before this party signed the survivor set")
        check_header(claim, self.config, self._session)
        self._tagged = tag_claim(
            claim,
            self._tagged,
            self._plain if own is None else own,
            config=self.config,
            session=self._session,
            view=self._view,
            advertisements=self._directory,
            identities=self._identities,
            party=self.party,
            tag_keys=self._tag_keys,
            identity_key=self._identity_key,
            header=self._header(Stage.VERIFY),
        )
        self._plain = None  # tagged once: the copy of the input is no longer needed
        return self._tagged.message

    def verify(self, tag_set: TagSet) -> np.ndarray:
        """Stage VERIFY: accept the claimed aggregate only if every survivor's signed tags sum to its challenge's dots.

        Returns the verified aggregate (d + 1 words, the encoded sum); decode it with ``config.encoder.decode``
        and refuse it unless it passes :func:`~fedfair.secagg.recovery.check_range`, as for any sum. Every
        survivor this party signed must have signed tags over the digest this party computed, so an aggregate
        shown differently to different parties fails everywhere.

        Raises:
            VerificationError: naming the round and the reason: MISSING_TAG (a survivor's tag is absent, where
                the tags check the sum: :func:`~fedfair.secagg.resum.resum_decides`, or above RESUMMED_WORDS where
                the tag set carries nothing to re-sum), MALFORMED (such material incomplete),
                BAD_TAG (a tag not signed by its survivor over this aggregate, or from a stranger, or twice),
                FORGED (the tags do not sum to the aggregate's, or the material re-sums to another: it is not the
                sum of the survivors' inputs).
            ProtocolError: called before :meth:`tag`.
        """
        if self._tagged is None or self._view is None:
            raise ProtocolError("verify() called before tag(): this party has no claimed aggregate to check")
        check_header(tag_set, self.config, self._session)
        return check_tags(
            tag_set,
            self._tagged,
            config=self.config,
            session=self._session,
            view=self._view,
            advertisements=self._directory,
            identities=self._identities,
        )
