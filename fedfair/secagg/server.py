"""The aggregator's side of secure aggregation (protocol v3): collect, forward, check, sum, unmask.

:class:`Server` is a state machine over plain messages with no I/O. Each stage has a ``receive_*``
step per arriving message, which raises a :class:`~fedfair.core.errors.ProtocolError` subclass
for a message it refuses, and a closing step (``key_directory``, ``share_bundles``,
``masking_set``, ``survivor_set``, ``unmask_request``, ``finish``) that fixes who survived and
raises :class:`~fedfair.core.errors.ThresholdError` when fewer than t parties remain.
:meth:`Server.ready` says when UNMASK may close early. Masked inputs are summed as they arrive,
so only the sum is ever unmasked; how culprits are named is in docs/design.md ("Inside secure
aggregation").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import (
    AuthenticationError,
    ProtocolError,
    StaleMessageError,
    SumOutOfRangeError,
    ThresholdError,
    UnmaskRefusedError,
)
from fedfair.pki.identity import CredentialVerifier, is_valid_signature
from fedfair.secagg import keys, prg
from fedfair.secagg.credentials import verify_advertisement
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded
from fedfair.secagg.graph import check_survivors
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    Dealing,
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
from fedfair.secagg.verify import TAG_BYTES, Challenge, aggregate_digest, check_sum, tag_payload
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.payloads import (
    consistency_payload,
    dealing_lines,
    dealing_payload,
    session_id,
    share_check_payload,
)
from fedfair.secagg.recovery import Recovery, check_range, unmasking_streams
from fedfair.secagg.shares import Kind
from fedfair.secagg.wire import Header, Stage, check_header, check_ids


@dataclass(frozen=True, eq=False)
class AggregateResult:
    """The outcome of a round.

    encoded_sum: the unmasked sum modulo 2^k (d + 1 words, the last one the weight).
    decoded: the float64 weighted sum, total weight and error bound.
    contributors: the parties whose inputs are in the sum (U3).
    dropped: per stage, the parties that went silent in it (never advertised, never
        shared, never checked their shares, never sent a masked input, never signed the
        survivor set, never answered the unmask request).
    culprits: party -> why the server names it: accused at CHECK (with the accusers), a
        revealed share that does not match its owner's dealing, or shares it dealt that do
        not rebuild its committed secret.
    accusations: accused party -> the parties that accused it at CHECK.
    """

    encoded_sum: np.ndarray
    decoded: Decoded
    contributors: tuple[int, ...]
    dropped: Mapping[Stage, tuple[int, ...]]
    culprits: Mapping[int, str]
    accusations: Mapping[int, tuple[int, ...]]


class _Phase(enum.Enum):
    COLLECT_KEYS = "ADVERTISE"
    COLLECT_SHARES = "SHARE"
    COLLECT_CHECKS = "CHECK"
    COLLECT_MASKED = "MASK"
    COLLECT_CONSISTENCY = "CONSISTENCY"
    COLLECT_UNMASK = "UNMASK"
    DONE = "finished"
    COLLECT_TAGS = "VERIFY"
    VERIFIED = "tags relayed"
    ABORTED = "aborted"


class Server:
    """The aggregator's state for one round.

    verify_credential checks each advertisement's credential against the roster name, so a
    forged or swapped key is refused at the door (peers check again themselves).
    """

    def __init__(self, config: SecAggConfig, verify_credential: CredentialVerifier) -> None:
        self.config = config
        self._verify_credential = verify_credential
        self._phase = _Phase.COLLECT_KEYS
        self._session = b""
        self._advertisements: dict[int, AdvertiseKeys] = {}
        self._identities: dict[int, ec.EllipticCurvePublicKey] = {}
        self._share_messages: dict[int, ShareKeys] = {}
        self._dealings: dict[int, Dealing] = {}
        self._checks: dict[int, tuple[int, ...]] = {}
        self._accusations: dict[int, tuple[int, ...]] = {}
        self._masking: tuple[int, ...] = ()
        self._masked: set[int] = set()
        self._sum = np.zeros(config.dimension + 1, dtype=config.encoder.dtype)
        self._survivors: tuple[int, ...] = ()
        self._signatures: dict[int, bytes] = {}
        self._request: UnmaskRequest | None = None
        self._needed: list[tuple[Kind, int]] = []
        self._recovery: Recovery | None = None
        """The shares revealed at UNMASK and what they rebuild (from the unmask request on)."""
        self._responders: set[int] = set()
        self._culprits: dict[int, list[str]] = {}
        self._proven: set[int] = set()
        self._digest = b""
        self._tags: dict[int, AggregateTag] = {}

    @property
    def session_id(self) -> bytes:
        """The session id, fixed by :meth:`key_directory` (empty before)."""
        return self._session

    @property
    def culprits(self) -> dict[int, str]:
        """Party -> why the server names it so far (also after an abort)."""
        return {party: "; ".join(reasons) for party, reasons in sorted(self._culprits.items())}

    @property
    def proven(self) -> frozenset[int]:
        """Culprits whose fault follows from what the server saw, not only from others' accusations.

        Proof is a share off the verified polynomial or a bad dealing; a party only accused by others
        cannot be told from a lying accuser, so it is not in this set.
        """
        return frozenset(self._proven)

    @property
    def accusations(self) -> dict[int, tuple[int, ...]]:
        """Accused party -> its accusers, once the CHECK stage is closed."""
        return dict(self._accusations)

    def receive_advertisement(self, message: AdvertiseKeys) -> None:
        """Accept one party's signed keys.

        Refuses a forged signature, a stranger, a repeat or a key no agreement could use (malformed or of low
        order).
        """
        self._expect(_Phase.COLLECT_KEYS, message)
        identity = verify_advertisement(message, self.config, self._verify_credential)
        for public in (message.cipher_public_key, message.mask_public_key):
            keys.check_public_key(public)
        if message.sender in self._advertisements:
            raise ProtocolError(f"party {message.sender} already advertised keys this round")
        self._advertisements[message.sender] = message
        self._identities[message.sender] = identity

    def key_directory(self) -> KeyDirectory:
        """Close ADVERTISE: fix the session over the accepted keys and list them for everyone."""
        self._expect(_Phase.COLLECT_KEYS)
        self._require_quorum(len(self._advertisements), "advertised keys")
        advertisements = tuple(self._advertisements[party] for party in sorted(self._advertisements))
        self._session = session_id(self.config.digest, advertisements)
        self._phase = _Phase.COLLECT_SHARES
        return KeyDirectory(self._header(Stage.ADVERTISE), advertisements)

    def receive_shares(self, message: ShareKeys) -> None:
        """Accept one party's encrypted shares.

        Exactly one entry for each neighbour that advertised, in order, under the party's one signature (its
        dealing, checked here once and relayed to every recipient).
        """
        self._expect(_Phase.COLLECT_SHARES, message)
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._advertisements:
            raise ProtocolError(f"party {sender} sent shares without advertised keys in this session")
        if sender in self._share_messages:
            raise ProtocolError(f"party {sender} already sent its shares this round")
        expected = self.config.graph[sender] & self._advertisements.keys()
        recipients = [entry.recipient for entry in message.shares]
        # Pairwise masks only cancel if every pair exchanged shares both ways, so a party
        # that skips a neighbour is refused rather than half-included.
        if recipients != sorted(expected):
            raise ProtocolError(
                f"party {sender} must send exactly one share to each of its {len(expected)} neighbours, in order"
            )
        if any(entry.sender != sender for entry in message.shares):
            raise ProtocolError(f"party {sender} sent shares labelled with another sender")
        holders, lines = dealing_lines(self._session, sender, message.shares)
        if not is_valid_signature(
            self._identities[sender], message.signature, dealing_payload(self._session, sender, holders, lines)
        ):
            raise AuthenticationError(f"party {sender}'s share entries are not signed by it")
        self._share_messages[sender] = message
        self._dealings[sender] = Dealing(sender, holders, lines, message.signature)

    def share_bundles(self) -> dict[int, ShareBundle]:
        """Close SHARE: forward to each party the shares addressed to it, each with its sender's dealing."""
        self._expect(_Phase.COLLECT_SHARES)
        self._require_quorum(len(self._share_messages), "shared keys")
        bundles: dict[int, list[EncryptedShares]] = {party: [] for party in self._share_messages}
        for sender in sorted(self._share_messages):
            for entry in self._share_messages[sender].shares:
                if entry.recipient in bundles:
                    bundles[entry.recipient].append(entry)
        self._phase = _Phase.COLLECT_CHECKS
        header = self._header(Stage.SHARE)
        return {
            party: ShareBundle(header, party, tuple(entries), tuple(self._dealings[e.sender] for e in entries))
            for party, entries in bundles.items()
        }

    def receive_share_check(self, message: ShareCheck) -> None:
        """Accept one party's signed share check and record whom it accuses."""
        self._expect(_Phase.COLLECT_CHECKS, message)
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._share_messages:
            raise ProtocolError(f"party {sender} sent a share check without sharing keys in this session")
        if sender in self._checks:
            raise ProtocolError(f"party {sender} already sent its share check this round")
        check_ids(message.accused, f"party {sender}'s share check")
        strangers = set(message.accused) - (self.config.graph[sender] & self._share_messages.keys())
        if strangers:
            raise ProtocolError(f"party {sender} accuses party {min(strangers)}, which sent it no shares")
        payload = share_check_payload(self._session, sender, message.accused)
        if not is_valid_signature(self._identities[sender], message.signature, payload):
            raise AuthenticationError(f"party {sender}'s share check is not signed by it")
        self._checks[sender] = message.accused

    def masking_set(self) -> MaskingSet:
        """Close CHECK: U2' is every party that sent a share check, minus every accused party."""
        self._expect(_Phase.COLLECT_CHECKS)
        accusers: dict[int, list[int]] = {}
        for accuser, accused in sorted(self._checks.items()):
            for party in accused:
                accusers.setdefault(party, []).append(accuser)
        self._accusations = {party: tuple(names) for party, names in sorted(accusers.items())}
        for party, names in self._accusations.items():
            self._name(party, f"accused by parties {list(names)} at CHECK")
        self._masking = tuple(sorted(self._checks.keys() - self._accusations.keys()))
        self._require_quorum(len(self._masking), "checked their shares unaccused")
        self._phase = _Phase.COLLECT_MASKED
        return MaskingSet(self._header(Stage.MASK), self._masking)

    def receive_masked_input(self, message: MaskedInput) -> None:
        """Add one party's masked input to the running sum (it is never stored on its own)."""
        self._expect(_Phase.COLLECT_MASKED, message)
        check_header(message, self.config, self._session)
        if message.sender not in self._masking:
            raise ProtocolError(f"party {message.sender} sent a masked input but is not in the masking set")
        if message.sender in self._masked:
            raise ProtocolError(f"party {message.sender} already sent its masked input this round")
        if message.vector.dtype.itemsize != self._sum.dtype.itemsize or message.vector.shape != self._sum.shape:
            raise ProtocolError(f"party {message.sender}'s masked input has the wrong word size or length")
        np.add(self._sum, message.vector, out=self._sum)
        self._masked.add(message.sender)

    def survivor_set(self) -> SurvivorSet:
        """Close MASK: U3 is every party whose masked input arrived; every survivor is asked to sign (U2', U3)."""
        self._expect(_Phase.COLLECT_MASKED)
        self._require_quorum(len(self._masked), "sent masked inputs")
        try:
            # Every survivor refuses to sign a view that colluders could cut; say so once, here.
            check_survivors(self.config.graph, self._masked, self.config.max_colluding)
        except UnmaskRefusedError as error:
            self._phase = _Phase.ABORTED
            raise ThresholdError(f"{error}; round aborted") from None
        self._survivors = tuple(sorted(self._masked))
        self._phase = _Phase.COLLECT_CONSISTENCY
        return SurvivorSet(self._header(Stage.CONSISTENCY), self._masking, self._survivors)

    def receive_consistency(self, message: ConsistencySignature) -> None:
        """Accept one survivor's signature over the view (U2', U3) this server sent."""
        self._expect(_Phase.COLLECT_CONSISTENCY, message)
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._masked:
            raise ProtocolError(f"party {sender} is not a survivor and cannot sign the survivor set")
        if sender in self._signatures:
            raise ProtocolError(f"party {sender} already signed the survivor set")
        payload = consistency_payload(self._session, self._masking, self._survivors)
        if not is_valid_signature(self._identities[sender], message.signature, payload):
            raise AuthenticationError(f"party {sender}'s consistency signature does not verify over this view")
        self._signatures[sender] = message.signature

    def unmask_request(self) -> UnmaskRequest:
        """Close CONSISTENCY: ask the survivors for their shares, with the t or more signatures they need."""
        self._expect(_Phase.COLLECT_CONSISTENCY)
        self._require_quorum(len(self._signatures), "signed the survivor set")
        dropped = tuple(sorted(set(self._masking) - self._masked))
        self._request = UnmaskRequest(
            self._header(Stage.UNMASK), self._survivors, dropped, tuple(sorted(self._signatures.items()))
        )
        self._needed = [(Kind.SEED, owner) for owner in self._survivors]
        # A dropped party's mask key matters only if some survivor masked with it.
        self._needed += [(Kind.MASK_KEY, owner) for owner in dropped if self.config.graph[owner] & self._masked]
        dealt = {sender: message.shares for sender, message in self._share_messages.items()}
        self._recovery = Recovery(self.config, self._session, dealt, self._advertisements)
        self._phase = _Phase.COLLECT_UNMASK
        return self._request

    def receive_unmask_response(self, message: UnmaskResponse) -> None:
        """Accept one survivor's shares: seed shares of survivors, mask-key shares of dropped parties."""
        self._expect(_Phase.COLLECT_UNMASK, message)
        check_header(message, self.config, self._session)
        assert self._request is not None  # set when the phase began
        responder = message.sender
        if responder not in self._masked:
            raise ProtocolError(f"party {responder} is not a survivor and cannot answer the unmask request")
        if responder in self._responders:
            raise ProtocolError(f"party {responder} already answered the unmask request")
        recovery = self._recovering()
        seeds = recovery.parse_revealed(responder, message.seed_shares, set(self._request.survivors))
        mask_keys = recovery.parse_revealed(responder, message.key_shares, set(self._request.dropped))
        recovery.add(responder, Kind.SEED, seeds)
        recovery.add(responder, Kind.MASK_KEY, mask_keys)
        self._responders.add(responder)

    def ready(self) -> bool:
        """Whether every secret the sum needs can already be rebuilt and verified (UNMASK stage only).

        Rebuilt secrets are kept, so calling this after each response costs little; a
        runtime may close the stage as soon as it says True.
        """
        if self._phase is not _Phase.COLLECT_UNMASK:
            return False
        recovery = self._recovering()
        return all(recovery.rebuild(kind, owner) is not None for kind, owner in self._needed)

    def finish(self) -> AggregateResult:
        """Close UNMASK: rebuild and verify the secrets, strip the masks from the sum, decode and check it.

        Any error aborts the round: no result exists to apply.

        Raises:
            ThresholdError: too few valid shares of a secret, naming the culprits.
            ProtocolError: signed shares that do not rebuild the committed secret, naming the culprits.
            SumOutOfRangeError: the decoded sum is impossible for honest inputs.
        """
        self._expect(_Phase.COLLECT_UNMASK)
        recovery = self._recovering()
        secrets, suspects = recovery.rebuild_all(self._needed)
        failed = [key for key in self._needed if key not in secrets]
        for kind, owner in (key for key in self._needed if key in suspects):
            for party, reason in recovery.audit(kind, owner).items():
                self._name(party, reason)
                self._proven.add(party)
        if failed:
            self._phase = _Phase.ABORTED
            raise recovery.failure(failed, self.culprits)
        masks = unmasking_streams(
            secrets, session=self._session, config=self.config, masked=self._masked, advertisements=self._advertisements
        )
        prg.apply_masks(self._sum, masks)
        contributors = self._survivors
        decoded = self.config.encoder.decode(self._sum, len(contributors))
        try:
            check_range(decoded, len(contributors), self.config.encoding)
        except SumOutOfRangeError:
            self._phase = _Phase.ABORTED
            raise
        self._phase = _Phase.DONE
        roster = set(range(1, self.config.size + 1))
        dropped = {
            Stage.ADVERTISE: roster - self._advertisements.keys(),
            Stage.SHARE: self._advertisements.keys() - self._share_messages.keys(),
            Stage.CHECK: self._share_messages.keys() - self._checks.keys(),
            Stage.MASK: set(self._masking) - self._masked,
            Stage.CONSISTENCY: self._masked - self._signatures.keys(),
            Stage.UNMASK: self._masked - self._responders,
        }
        return AggregateResult(
            encoded_sum=self._sum,
            decoded=decoded,
            contributors=contributors,
            dropped={stage: tuple(sorted(parties)) for stage, parties in dropped.items()},
            culprits=self.culprits,
            accusations=self.accusations,
        )

    def claim(self) -> AggregateClaim:
        """Open VERIFY (after :meth:`finish`): show the survivors the unmasked sum, which commits the server to it."""
        self._expect(_Phase.DONE)
        self._digest = aggregate_digest(self._session, self._survivors, self._sum)
        self._phase = _Phase.COLLECT_TAGS
        return AggregateClaim(self._header(Stage.VERIFY), self._sum)

    def receive_tag(self, message: AggregateTag) -> None:
        """Accept one survivor's tags, signed by it over the digest of the aggregate this server claimed."""
        self._expect(_Phase.COLLECT_TAGS, message)
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._masked:
            raise ProtocolError(f"party {sender} is not a survivor and cannot tag the aggregate")
        if sender in self._tags:
            raise ProtocolError(f"party {sender} already tagged the aggregate")
        payload = tag_payload(self._session, self._digest, sender, message.tags)
        if len(message.tags) != TAG_BYTES or not is_valid_signature(
            self._identities[sender], message.signature, payload
        ):
            raise AuthenticationError(f"party {sender}'s tag is not signed by it over the claimed aggregate")
        self._tags[sender] = message

    @property
    def untagged(self) -> tuple[int, ...]:
        """The survivors whose tags have not arrived (VERIFY stage): every party will refuse the aggregate without them."""
        return tuple(sorted(self._masked - self._tags.keys()))

    def tags_add_up(self) -> bool:
        """Whether the tags received sum to the claimed aggregate's challenge dots, as every survivor will check.

        For a server that claimed the true sum, False means a survivor tagged something other than its input
        (which nobody can tell apart from a forged sum): relaying the tags would only make every survivor
        refuse the aggregate, so the runtime aborts the round instead. Costs one challenge over the d + 1 words.
        """
        self._expect(_Phase.COLLECT_TAGS)
        if self.untagged:
            return False
        challenge = Challenge(self._session, self._digest, self._sum.size)
        return check_sum(challenge.dots(self._sum), (self._tags[party].tags for party in sorted(self._tags)))

    def tag_set(self) -> TagSet:
        """Close VERIFY: relay every tag received to every survivor, which then checks them (:meth:`Client.verify`)."""
        self._expect(_Phase.COLLECT_TAGS)
        self._phase = _Phase.VERIFIED
        return TagSet(self._header(Stage.VERIFY), tuple(self._tags[party] for party in sorted(self._tags)))

    def _recovering(self) -> Recovery:
        """The UNMASK stage's shares (the stage has begun: the unmask request built them)."""
        if self._recovery is None:
            raise ProtocolError("no unmask request was made; the UNMASK stage has not begun")
        return self._recovery

    def _name(self, party: int, reason: str) -> None:
        reasons = self._culprits.setdefault(party, [])
        if reason not in reasons:
            reasons.append(reason)

    def _require_quorum(self, count: int, what: str) -> None:
        if count < self.config.t:
            self._phase = _Phase.ABORTED
            accused = f" (accused at CHECK: {dict(self._accusations)})" if self._accusations else ""
            raise ThresholdError(
                f"only {count} of {self.config.size} parties {what}, below the threshold {self.config.t}; "
                f"round aborted{accused}"
            )

    def _expect(self, phase: _Phase, message: object = None) -> None:
        if self._phase is phase:
            return
        if self._phase is _Phase.ABORTED:
            raise ProtocolError("this round was aborted; start a new round")
        if message is not None:
            raise StaleMessageError(
                f"{type(message).__name__} arrived while the server is in stage {self._phase.value}; it was dropped"
            )
        raise ProtocolError(f"called out of order: the server is in stage {self._phase.value}")

    def _header(self, stage: Stage) -> Header:
        session = b"" if stage is Stage.ADVERTISE else self._session
        return Header(self.config.federation_id, self.config.round, stage, session)
