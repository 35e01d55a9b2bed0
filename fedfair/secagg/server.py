"""The aggregator's side of secure aggregation (protocol v3): collect, forward, check, sum, unmask, verify.

:class:`Server` is a state machine over plain messages with no I/O. Each stage has a ``receive_*`` step per arriving
message, which raises a :class:`~fedfair.core.errors.ProtocolError` subclass for a message it refuses, and a closing
step (``key_directory``, ``share_bundles``, ``masking_set``, ``survivor_set``, ``unmask_request``, ``finish``, then
in a verified round ``claim`` and ``tag_set``) that fixes who survived and raises
:class:`~fedfair.core.errors.ThresholdError` when fewer than t parties remain. It keeps no order of its own: its
runner opens and closes the stages in the round's order (:class:`~fedfair.secagg.round_order.ServerOrder`), and a close
that raises aborts the round. Masked inputs are summed as they arrive, so only the sum is ever unmasked; how culprits
are named is in docs/design.md ("Inside secure aggregation"); the VERIFY construction is :mod:`fedfair.secagg.verify`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import (
    AuthenticationError,
    ProtocolError,
    ThresholdError,
    UnmaskRefusedError,
    VerificationError,
)
from fedfair.pki.identity import CredentialVerifier, is_valid_signature
from fedfair.secagg import config as config_module, keys, prg
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.credentials import verify_advertisement
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
from fedfair.secagg.payloads import (
    consistency_payload,
    dealing_lines,
    dealing_payload,
    masked_input_digest,
    session_id,
    share_check_payload,
)
from fedfair.secagg.recheck import carried_sum, check_reports, checked_peers, claimed_values, false_reports
from fedfair.secagg.recovery import Recovery, check_range, survivor_masks, unmasking_streams
from fedfair.secagg.resum import resum_decides
from fedfair.secagg.shares import Kind
from fedfair.secagg.verify import Challenge, aggregate_digest, check_sum, tag_payload
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, Material, TagSet
from fedfair.secagg.wire import Header, SUM_STAGES, Stage, check_header, check_ids

logger = logging.getLogger(__name__)


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


class Server:
    """The aggregator's state for one round, and every stage's steps.

    verify_credential checks each advertisement's credential against the roster name, so a
    forged or swapped key is refused at the door (peers check again themselves).
    """

    def __init__(self, config: SecAggConfig, verify_credential: CredentialVerifier) -> None:
        self.config = config
        self._verify_credential = verify_credential
        self._session = b""
        self._advertisements: dict[int, AdvertiseKeys] = {}
        self._identities: dict[int, ec.EllipticCurvePublicKey] = {}
        self._share_messages: dict[int, ShareKeys] = {}
        self._dealings: dict[int, Dealing] = {}
        self._checks: dict[int, tuple[int, ...]] = {}
        self._accusations: dict[int, tuple[int, ...]] = {}
        self._masking: tuple[int, ...] = ()
        self._masked: set[int] = set()
        self._input_digests: dict[int, bytes] = {}
        self._inputs: dict[int, np.ndarray] = {}
        """Each survivor's masked input, kept where the survivors may re-sum them (see ``receive_masked_input``)."""
        self._secrets: dict[tuple[Kind, int], bytes] = {}
        """The secrets rebuilt at UNMASK (survivors' seeds, dropped parties' mask keys), shown with a re-summed claim."""
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
        self._challenge: Challenge | None = None
        """The claimed aggregate's challenge, built once from the claim's digest (:meth:`_challenge_of_claim`)."""
        self._carries: np.ndarray | None = None
        self._tags: dict[int, AggregateTag] = {}
        self._reported_total: tuple[int, ...] | None = None
        """What a re-checked round's reported values must sum to, once computed (:meth:`_claimed_values`)."""
        self._reports_hold: bool | None = None
        """Whether the reports of the tags received pass :func:`~fedfair.secagg.recheck.check_reports`, once asked
        (:meth:`_reports_pass`); None before, and again once a tag arrives or is dropped."""

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

    def excluded(self) -> dict[int, str]:
        """The culprits to exclude from later rounds, with why (after a finish or an abort alike).

        Those the server proved at fault, and those accused by more than the round's collusion bound
        (:attr:`SecAggConfig.security`) of distinct parties, so that at least one accuser is honest. Fewer
        accusers could all be liars: their target only sits out this round.
        """
        bound = self.config.security.max_colluding
        return {
            party: why
            for party, why in self.culprits.items()
            if party in self._proven or len(self._accusations.get(party, ())) > bound
        }

    @property
    def survivors(self) -> tuple[int, ...]:
        """The survivors (U3, sorted party ids) once the masked inputs are in; empty before."""
        return self._survivors

    @property
    def running_sum(self) -> np.ndarray:
        """The sum of the masked inputs so far (d + 1 words modulo 2^k), unmasked in place by ``finish``, then claimed.

        The array itself, not a copy: a test or an attack that plays a cheating server alters it before ``finish``
        (a forged sum); an honest runner never needs it (``finish`` returns the sum).
        """
        return self._sum

    @property
    def _view_inputs(self) -> tuple[bytes, ...]:
        """The survivors' masked-input digests, in the survivors' order: the view's third part."""
        return tuple(self._input_digests[party] for party in self._survivors)

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
            accused = f" (accused at CHECK: {dict(self._accusations)})" if self._accusations else ""
            raise ThresholdError(
                f"only {count} of {self.config.size} parties {what}, below the threshold {self.config.t}; "
                f"round aborted{accused}"
            )

    def _header(self, stage: Stage) -> Header:
        session = b"" if stage is Stage.ADVERTISE else self._session
        return Header(self.config.federation_id, self.config.round, stage, session)

    def receive_advertisement(self, message: AdvertiseKeys) -> None:
        """Accept one party's signed keys.

        Refuses a forged signature, a stranger, a repeat or a key no agreement could use (malformed or of low
        order).
        """
        identity = verify_advertisement(message, self.config, self._verify_credential)
        for public in (message.cipher_public_key, message.mask_public_key):
            keys.check_public_key(public)
        if message.sender in self._advertisements:
            raise ProtocolError(f"party {message.sender} already advertised keys this round")
        self._advertisements[message.sender] = message
        self._identities[message.sender] = identity

    def key_directory(self) -> KeyDirectory:
        """Close ADVERTISE: fix the session over the accepted keys and list them for everyone."""
        self._require_quorum(len(self._advertisements), "advertised keys")
        advertisements = tuple(self._advertisements[party] for party in sorted(self._advertisements))
        self._session = session_id(self.config.digest, advertisements)
        return KeyDirectory(self._header(Stage.ADVERTISE), advertisements)

    def receive_shares(self, message: ShareKeys) -> None:
        """Accept one party's encrypted shares.

        Exactly one entry for each neighbour that advertised, in order, under the party's one signature (its
        dealing, checked here once and relayed to every recipient).
        """
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
        self._require_quorum(len(self._share_messages), "shared keys")
        bundles: dict[int, list[EncryptedShares]] = {party: [] for party in self._share_messages}
        for sender in sorted(self._share_messages):
            for entry in self._share_messages[sender].shares:
                if entry.recipient in bundles:
                    bundles[entry.recipient].append(entry)
        header = self._header(Stage.SHARE)
        return {
            party: ShareBundle(header, party, tuple(entries), tuple(self._dealings[e.sender] for e in entries))
            for party, entries in bundles.items()
        }

    def receive_share_check(self, message: ShareCheck) -> None:
        """Accept one party's signed share check and record whom it accuses."""
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
        accusers: dict[int, list[int]] = {}
        for accuser, accused in sorted(self._checks.items()):
            for party in accused:
                accusers.setdefault(party, []).append(accuser)
        self._accusations = {party: tuple(names) for party, names in sorted(accusers.items())}
        for party, names in self._accusations.items():
            self._name(party, f"accused by parties {list(names)} at CHECK")
        self._masking = tuple(sorted(self._checks.keys() - self._accusations.keys()))
        self._require_quorum(len(self._masking), "checked their shares unaccused")
        return MaskingSet(self._header(Stage.MASK), self._masking)

    def receive_masked_input(self, message: MaskedInput) -> None:
        """Add one party's masked input to the running sum, and keep its digest for the survivors to sign.

        The input itself is kept where the survivors may re-sum the inputs to check the sum: every round up to
        RESUMMED_WORDS (:attr:`~fedfair.secagg.config.SecAggConfig.resummed`), and above it, on the complete graph, a
        round whose tags do not all arrive (:func:`~fedfair.secagg.resum.resum_decides`), or where survivors re-check
        each other's inputs (:attr:`~fedfair.secagg.config.SecAggConfig.rechecked`). Otherwise it is never stored
        on its own.
        """
        check_header(message, self.config, self._session)
        if message.sender not in self._masking:
            raise ProtocolError(f"party {message.sender} sent a masked input but is not in the masking set")
        if message.sender in self._masked:
            raise ProtocolError(f"party {message.sender} already sent its masked input this round")
        if message.vector.dtype.itemsize != self._sum.dtype.itemsize or message.vector.shape != self._sum.shape:
            raise ProtocolError(f"party {message.sender}'s masked input has the wrong word size or length")
        np.add(self._sum, message.vector, out=self._sum)
        self._input_digests[message.sender] = masked_input_digest(self._session, message.sender, message.vector)
        if self.config.resummed or resum_decides(self.config) or self.config.rechecked:
            self._inputs[message.sender] = message.vector
        self._masked.add(message.sender)

    def survivor_set(self) -> SurvivorSet:
        """Close MASK: U3 is every party whose masked input arrived; every survivor is asked to sign the view."""
        self._require_quorum(len(self._masked), "sent masked inputs")
        try:
            # Every survivor refuses to sign a view that colluders could cut; say so once, here.
            check_survivors(self.config.graph, self._masked, self.config.security.max_colluding)
        except UnmaskRefusedError as error:
            raise ThresholdError(f"{error}; round aborted") from None
        self._survivors = tuple(sorted(self._masked))
        return SurvivorSet(self._header(Stage.CONSISTENCY), self._masking, self._survivors, self._view_inputs)

    def receive_consistency(self, message: ConsistencySignature) -> None:
        """Accept one survivor's signature over the view (U2', U3, masked-input digests) this server sent."""
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._masked:
            raise ProtocolError(f"party {sender} is not a survivor and cannot sign the survivor set")
        if sender in self._signatures:
            raise ProtocolError(f"party {sender} already signed the survivor set")
        payload = consistency_payload(self._session, self._masking, self._survivors, self._view_inputs)
        if not is_valid_signature(self._identities[sender], message.signature, payload):
            raise AuthenticationError(f"party {sender}'s consistency signature does not verify over this view")
        self._signatures[sender] = message.signature

    def unmask_request(self) -> UnmaskRequest:
        """Close CONSISTENCY: ask the survivors for their shares, with the t or more signatures they need."""
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
        return self._request

    def receive_unmask_response(self, message: UnmaskResponse) -> None:
        """Accept one survivor's shares: seed shares of survivors, mask-key shares of dropped parties."""
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
        """Whether every secret the sum needs can already be rebuilt and verified (False before the unmask request).

        Rebuilt secrets are kept, so calling this after each response costs little; a
        runtime may close the stage as soon as it says True.
        """
        recovery = self._recovery
        if recovery is None:
            return False
        return all(recovery.rebuild(kind, owner) is not None for kind, owner in self._needed)

    def finish(self) -> AggregateResult:
        """Close UNMASK: rebuild and verify the secrets, strip the masks from the sum, decode and check it.

        Any error aborts the round (its runner's :class:`~fedfair.secagg.round_order.ServerOrder`): no result exists to apply.

        Raises:
            ThresholdError: too few valid shares of a secret, naming the culprits.
            ProtocolError: signed shares that do not rebuild the committed secret, naming the culprits.
            SumOutOfRangeError: the decoded sum is impossible for honest inputs.
        """
        recovery = self._recovering()
        secrets, suspects = recovery.rebuild_all(self._needed)
        failed = [key for key in self._needed if key not in secrets]
        for kind, owner in (key for key in self._needed if key in suspects):
            for party, reason in recovery.audit(kind, owner).items():
                self._name(party, reason)
                self._proven.add(party)
        if failed:
            raise recovery.failure(failed, self.culprits)
        masks = unmasking_streams(
            secrets, session=self._session, config=self.config, masked=self._masked, advertisements=self._advertisements
        )
        prg.apply_masks(self._sum, masks)
        self._secrets = secrets
        contributors = self._survivors
        decoded = self.config.encoder.decode(self._sum, len(contributors))
        check_range(decoded, len(contributors), self.config.encoding)
        roster = set(range(1, self.config.size + 1))
        # Who went silent in each stage of the sum, in the stages' order.
        silent = (
            roster - self._advertisements.keys(),
            self._advertisements.keys() - self._share_messages.keys(),
            self._share_messages.keys() - self._checks.keys(),
            set(self._masking) - self._masked,
            self._masked - self._signatures.keys(),
            self._masked - self._responders,
        )
        dropped = dict(zip(SUM_STAGES, silent, strict=True))
        return AggregateResult(
            encoded_sum=self._sum,
            decoded=decoded,
            contributors=contributors,
            dropped={stage: tuple(sorted(parties)) for stage, parties in dropped.items()},
            culprits=self.culprits,
            accusations=self.accusations,
        )

    def claim(self) -> AggregateClaim:
        """Open VERIFY (after :meth:`finish`): show the survivors the unmasked sum, which commits the server to it.

        Where the round re-sums (``config.resummed``) the claim also carries the survivors' masked inputs, the
        secrets rebuilt at UNMASK and the consistency signatures the unmask request carried. Where it is re-checked
        (``config.rechecked``) it carries the sum's carries, the secrets and the signatures: what every survivor is
        sent alike; each is sent its own, with the inputs it re-checks (:meth:`claims`).
        """
        if self.config.rechecked:
            survivors = self._survivors
            parts = (self._unmasked_input(party) for party in survivors)
            # The carries of the z_j's sum, which is the sum unmasked at finish (the same masks, taken off one
            # input at a time).
            _total, self._carries = carried_sum(parts)
            self._digest = aggregate_digest(self._session, survivors, self._view_inputs, self._sum, self._carries)
            _inputs, seeds, mask_keys, signatures = self._material()
            return AggregateClaim(
                self._header(Stage.VERIFY), self._sum, (), seeds, mask_keys, signatures, carries=self._carries
            )
        self._digest = aggregate_digest(self._session, self._survivors, self._view_inputs, self._sum)
        if not self.config.resummed:
            return AggregateClaim(self._header(Stage.VERIFY), self._sum)
        return AggregateClaim(self._header(Stage.VERIFY), self._sum, *self._material())

    def claims(self) -> dict[int, AggregateClaim]:
        """Open a re-checked VERIFY: each survivor's claim, :meth:`claim` with the masked inputs it re-checks.

        Each input is shared with the survivor's claim, never copied (:func:`~fedfair.secagg.recheck.checked_peers`).
        """
        common = self.claim()
        colluding = self.config.security.max_colluding
        return {
            party: replace(
                common,
                inputs=tuple(self._inputs[peer] for peer in checked_peers(self._survivors, party, colluding)),
            )
            for party in self._survivors
        }

    def _unmasked_input(self, party: int) -> np.ndarray:
        """``party``'s masked input less its own masks (:func:`~fedfair.secagg.recovery.survivor_masks`), a copy."""
        unmasked = np.array(self._inputs[party], copy=True)
        masks = survivor_masks(
            party,
            self._secrets,
            session=self._session,
            config=self.config,
            masked=self._masked,
            advertisements=self._advertisements,
        )
        prg.apply_masks(unmasked, masks)
        return unmasked

    def _material(self) -> Material:
        """What this server unmasked the sum from, for every survivor to unmask it again (:class:`ResumMaterial`)."""
        seeds = sorted((owner, secret) for (kind, owner), secret in self._secrets.items() if kind is Kind.SEED)
        mask_keys = sorted((owner, secret) for (kind, owner), secret in self._secrets.items() if kind is Kind.MASK_KEY)
        inputs = tuple(self._inputs[party] for party in self._survivors)
        assert self._request is not None  # the unmask request was made before the sum was finished
        return inputs, tuple(seeds), tuple(mask_keys), self._request.signatures

    def receive_tag(self, message: AggregateTag) -> None:
        """Accept one survivor's tags, signed by it over the digest of the aggregate this server claimed.

        ``message`` is as :meth:`AggregateTag.read <fedfair.secagg.verify_messages.AggregateTag.read>` parsed it, so
        its fields have their lengths; one that did not parse never arrives, and the round goes on as without it.
        """
        check_header(message, self.config, self._session)
        sender = message.sender
        if sender not in self._masked:
            raise ProtocolError(f"party {sender} is not a survivor and cannot tag the aggregate")
        if sender in self._tags:
            raise ProtocolError(f"party {sender} already tagged the aggregate")
        payload = tag_payload(self._session, self._digest, sender, message.tags, message.values)
        if not is_valid_signature(self._identities[sender], message.signature, payload):
            raise AuthenticationError(f"party {sender}'s tag is not signed by it over the claimed aggregate")
        self._tags[sender] = message
        self._reports_hold = None

    @property
    def untagged(self) -> tuple[int, ...]:
        """The survivors whose tags have not arrived (VERIFY stage).

        Every party refuses the aggregate without them, unless its own re-sum decides the sum
        (:func:`~fedfair.secagg.resum.resum_decides`: on the complete graph, re-summed from the claim or, above
        RESUMMED_WORDS, from the tag set).
        """
        return tuple(sorted(self._masked - self._tags.keys()))

    def refuse_false_reports(self) -> tuple[int, ...]:
        """In a re-checked round with every tag in, name each survivor whose signed report is false, and drop its tag.

        Only where the reports fail :func:`~fedfair.secagg.recheck.check_reports` (every survivor would refuse
        them) does this server compute every true <r^c, z_j> itself: it rebuilt each z_j for the carries
        (:meth:`claim`) and does so once more, one input at a time. Each checker whose report names other peers or
        another value (:func:`~fedfair.secagg.recheck.false_reports`) is a culprit this server proved
        (:meth:`excluded`), and its tag counts as missing: the round goes on as without it (:meth:`tag_set`), so
        re-summed from the tag set on the complete graph and void on a SecAgg+ graph. Elsewhere it does nothing.

        Returns:
            The survivors named, sorted.
        """
        if self._carries is None or self.untagged:
            return ()
        if self._reports_pass():
            return ()
        challenge = self._challenge_of_claim()
        reports = {party: tag.values for party, tag in self._tags.items()}
        truth = {party: challenge.dots(self._unmasked_input(party)) for party in self._survivors}
        false = false_reports(reports, truth, config=self.config, survivors=self._survivors)
        for checker, why in false.items():
            self._name(checker, why)
            self._proven.add(checker)
            del self._tags[checker]
            self._reports_hold = None
        return tuple(false)

    def _challenge_of_claim(self) -> Challenge:
        """The challenge of the aggregate this server claimed, derived from the claim's digest once a round."""
        if self._challenge is None:
            self._challenge = Challenge(self._session, self._digest, self._sum.size)
        return self._challenge

    def _reports_pass(self) -> bool:
        """Whether the reports of the tags received pass :func:`~fedfair.secagg.recheck.check_reports`, checked once.

        Both :meth:`refuse_false_reports` and :meth:`tags_add_up` ask, in the same round over the same tags; the
        answer is kept until a tag arrives or is dropped.
        """
        if self._reports_hold is None:
            reports = {party: tag.values for party, tag in self._tags.items()}
            try:
                check_reports(reports, self._claimed_values(), config=self.config, survivors=self._survivors)
            except VerificationError:
                self._reports_hold = False
            else:
                self._reports_hold = True
        return self._reports_hold

    def _claimed_values(self) -> tuple[int, ...]:
        """:func:`~fedfair.secagg.recheck.claimed_values` of this re-checked claim, computed once (two d-word passes).

        S', K and so r are fixed from :meth:`claim` on; the reports are checked against it again only once a false
        reporter's tag is dropped (:meth:`_reports_pass`).
        """
        if self._reported_total is None:
            assert self._carries is not None  # a re-checked claim was made
            self._reported_total = claimed_values(self._challenge_of_claim(), self._sum, self._carries)
        return self._reported_total

    def tags_add_up(self) -> bool:
        """Whether the tags received sum to the claimed aggregate's challenge dots, as every survivor will check.

        For a server that claimed the true sum, False means a survivor tagged something other than its input
        (which nobody can tell apart from a forged sum), or, in a re-checked round, reported values that every
        survivor would refuse (:func:`~fedfair.secagg.recheck.check_reports`; the runtime names and drops false
        ones first, :meth:`refuse_false_reports`): relaying the tags would only make every survivor refuse the
        aggregate, so the runtime aborts the round instead. Costs a challenge over the d + 1 words (two more in a
        re-checked round, once).
        """
        if self.untagged:
            return False
        if self._carries is not None and not self._reports_pass():
            return False
        return check_sum(
            self._challenge_of_claim().dots(self._sum), (self._tags[party].tags for party in sorted(self._tags))
        )

    def tag_set(self) -> TagSet:
        """Close VERIFY: relay every tag received to every survivor, which then checks them (:meth:`Client.verify`).

        Where a tag is missing and the claim carried no re-sum material (above RESUMMED_WORDS, on the complete graph:
        :func:`~fedfair.secagg.resum.resum_decides`), the tag set carries it, for every survivor to re-sum the sum
        it tagged; with every tag in, or where the claim carried it, it carries none.
        """
        tags = tuple(self._tags[party] for party in sorted(self._tags))
        if self.untagged and resum_decides(self.config) and not self.config.resummed:
            names = ", ".join(map(self.config.name_of, self.untagged))
            logger.info(
                "session %d: no tag from %s; the tag set carries the survivors' %d masked inputs, for every survivor to "
                "re-sum the sum (above %d words, this round only)",
                self.config.round,
                names,
                len(self._survivors),
                config_module.RESUMMED_WORDS,
            )
            return TagSet(self._header(Stage.VERIFY), tags, *self._material())
        return TagSet(self._header(Stage.VERIFY), tags)
