"""The aggregator's side of secure aggregation: collect, forward, sum, unmask.

:class:`Server` is a state machine over plain messages with no I/O. Each stage has
a ``receive_*`` step, called once per arriving message, and a closing step, called
when every party answered or the stage's deadline passed; the closing step fixes
who survived and returns what to send next:

    receive_advertisement(AdvertiseKeys)*   key_directory()   -> KeyDirectory  (to all)
    receive_shares(ShareKeys)*              share_bundles()   -> {party: ShareBundle}
    receive_masked_input(MaskedInput)*      unmask_request()  -> UnmaskRequest (to survivors)
    receive_unmask_response(UnmaskResponse)* finish()         -> AggregateResult

A ``receive_*`` step raises a :class:`~fedfair.secagg.errors.ProtocolError` subclass
for a message it refuses (the runtime drops it); a closing step raises
:class:`~fedfair.secagg.errors.ThresholdError` when fewer than t parties remain, which
aborts the round: nothing is unmasked and every later call is refused.

What the server learns: masked inputs arrive and are summed at once (memory O(d)),
so only the sum is ever unmasked. For a survivor it rebuilds the self-mask seed; for
a party that dropped before masking it rebuilds the mask key and cancels the pairwise
masks the survivors added for it. It never asks for both secrets of one party, and
honest parties would refuse if it did.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedfair.pki.identity import CredentialVerifier
from fedfair.secagg import keys, prg, shamir
from fedfair.secagg.client import SECRET_BYTES, verify_advertisement
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded
from fedfair.secagg.errors import ProtocolError, StaleMessageError, ThresholdError
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
    check_header,
    session_id,
)


@dataclass(frozen=True, eq=False)
class AggregateResult:
    """The outcome of a round.

    encoded_sum: the unmasked sum modulo 2^k (d + 1 words, the last one the weight).
    decoded: the float64 weighted sum, total weight and error bound.
    contributors: the parties whose inputs are in the sum.
    dropped: per stage, the parties that went silent in it (never advertised, never
        shared, never sent a masked input, never answered the unmask request).
    """

    encoded_sum: np.ndarray
    decoded: Decoded
    contributors: tuple[int, ...]
    dropped: Mapping[Stage, tuple[int, ...]]


class _Phase(enum.Enum):
    COLLECT_KEYS = "ADVERTISE"
    COLLECT_SHARES = "SHARE"
    COLLECT_MASKED = "MASK"
    COLLECT_UNMASK = "UNMASK"
    DONE = "finished"
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
        self._share_messages: dict[int, ShareKeys] = {}
        self._masked: set[int] = set()
        self._sum = np.zeros(config.dimension + 1, dtype=config.encoder.dtype)
        self._request: UnmaskRequest | None = None
        self._seed_shares: dict[int, list[shamir.Share]] = {}
        self._key_shares: dict[int, list[shamir.Share]] = {}
        self._responders: set[int] = set()

    @property
    def session_id(self) -> bytes:
        """The session id, fixed by :meth:`key_directory` (empty before)."""
        return self._session

    def receive_advertisement(self, message: AdvertiseKeys) -> None:
        """Accept one party's signed keys; refuses a forged signature, a stranger or a repeat."""
        self._expect(_Phase.COLLECT_KEYS, message)
        verify_advertisement(message, self.config, self._verify_credential)
        if message.sender in self._advertisements:
            raise ProtocolError(f"party {message.sender} already advertised keys this round")
        self._advertisements[message.sender] = message

    def key_directory(self) -> KeyDirectory:
        """Close ADVERTISE: fix the session over the accepted keys and list them for everyone."""
        self._expect(_Phase.COLLECT_KEYS)
        self._require_quorum(len(self._advertisements), "advertised keys")
        advertisements = tuple(self._advertisements[party] for party in sorted(self._advertisements))
        self._session = session_id(self.config.digest, advertisements)
        self._phase = _Phase.COLLECT_SHARES
        return KeyDirectory(self._header(Stage.ADVERTISE), advertisements)

    def receive_shares(self, message: ShareKeys) -> None:
        """Accept one party's encrypted shares: exactly one for each neighbour that advertised."""
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
        if len(set(recipients)) != len(recipients) or set(recipients) != expected:
            raise ProtocolError(f"party {sender} must send exactly one share to each of its {len(expected)} neighbours")
        if any(entry.sender != sender for entry in message.shares):
            raise ProtocolError(f"party {sender} sent shares labelled with another sender")
        self._share_messages[sender] = message

    def share_bundles(self) -> dict[int, ShareBundle]:
        """Close SHARE: forward to each party the shares addressed to it."""
        self._expect(_Phase.COLLECT_SHARES)
        self._require_quorum(len(self._share_messages), "shared keys")
        bundles: dict[int, list[EncryptedShares]] = {party: [] for party in self._share_messages}
        for sender in sorted(self._share_messages):
            for entry in self._share_messages[sender].shares:
                if entry.recipient in bundles:
                    bundles[entry.recipient].append(entry)
        self._phase = _Phase.COLLECT_MASKED
        header = self._header(Stage.SHARE)
        return {party: ShareBundle(header, party, tuple(entries)) for party, entries in bundles.items()}

    def receive_masked_input(self, message: MaskedInput) -> None:
        """Add one party's masked input to the running sum (it is never stored on its own)."""
        self._expect(_Phase.COLLECT_MASKED, message)
        check_header(message, self.config, self._session)
        if message.sender not in self._share_messages:
            raise ProtocolError(f"party {message.sender} sent a masked input without sharing keys in this session")
        if message.sender in self._masked:
            raise ProtocolError(f"party {message.sender} already sent its masked input this round")
        if message.vector.dtype.itemsize != self._sum.dtype.itemsize or message.vector.shape != self._sum.shape:
            raise ProtocolError(f"party {message.sender}'s masked input has the wrong word size or length")
        np.add(self._sum, message.vector, out=self._sum)
        self._masked.add(message.sender)

    def unmask_request(self) -> UnmaskRequest:
        """Close MASK: tell the survivors who is in the sum and who dropped after sharing keys."""
        self._expect(_Phase.COLLECT_MASKED)
        self._require_quorum(len(self._masked), "sent masked inputs")
        dropped = self._share_messages.keys() - self._masked
        self._request = UnmaskRequest(self._header(Stage.UNMASK), tuple(sorted(self._masked)), tuple(sorted(dropped)))
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
        seeds = self._parse_revealed(responder, message.seed_shares, set(self._request.survivors))
        mask_keys = self._parse_revealed(responder, message.key_shares, set(self._request.dropped))
        for owner, share in seeds.items():
            self._seed_shares.setdefault(owner, []).append(share)
        for owner, share in mask_keys.items():
            self._key_shares.setdefault(owner, []).append(share)
        self._responders.add(responder)

    def finish(self) -> AggregateResult:
        """Close UNMASK: rebuild the secrets, strip the masks from the sum and decode it."""
        self._expect(_Phase.COLLECT_UNMASK)
        assert self._request is not None  # set when the phase began
        try:
            masks = self._unmasking_streams(self._request)
        except ProtocolError:
            self._phase = _Phase.ABORTED
            raise
        prg.apply_masks(self._sum, masks)
        contributors = self._request.survivors
        self._phase = _Phase.DONE
        roster = set(range(1, self.config.size + 1))
        dropped = {
            Stage.ADVERTISE: roster - self._advertisements.keys(),
            Stage.SHARE: self._advertisements.keys() - self._share_messages.keys(),
            Stage.MASK: set(self._request.dropped),
            Stage.UNMASK: self._masked - self._responders,
        }
        return AggregateResult(
            encoded_sum=self._sum,
            decoded=self.config.encoder.decode(self._sum, len(contributors)),
            contributors=contributors,
            dropped={stage: tuple(sorted(parties)) for stage, parties in dropped.items()},
        )

    def _unmasking_streams(self, request: UnmaskRequest) -> list[prg.Mask]:
        """Every keystream to subtract from the sum.

        That is each survivor's self mask, and the pairwise masks survivors added for the
        parties that dropped before masking.
        """
        masks: list[prg.Mask] = []
        for owner in request.survivors:
            seed = self._rebuild(self._seed_shares.get(owner, []), owner, "self-mask seed")
            masks.append((keys.self_mask_key(seed, self._session, owner), -1))
        for owner in request.dropped:
            masked_with_owner = sorted(self.config.graph[owner] & self._masked)
            if not masked_with_owner:
                continue
            raw = self._rebuild(self._key_shares.get(owner, []), owner, "mask key")
            mask_key = keys.load_private(raw)
            if keys.public_bytes(mask_key) != self._advertisements[owner].mask_public_key:
                raise ProtocolError(f"the shares of party {owner}'s mask key rebuild a key it never advertised")
            for survivor in masked_with_owner:
                pair_key = keys.pair_mask_key(
                    mask_key, self._advertisements[survivor].mask_public_key, self._session, owner, survivor
                )
                # The survivor added the stream if its id is the smaller one; undo whichever it did.
                masks.append((pair_key, -1 if survivor < owner else 1))
        return masks

    def _rebuild(self, shares: list[shamir.Share], owner: int, what: str) -> bytes:
        """Combine ``owner``'s shares of one secret, aborting the round if too few arrived."""
        if len(shares) < self.config.t:
            raise ThresholdError(
                f"only {len(shares)} shares of party {owner}'s {what} arrived, below the threshold {self.config.t}; "
                "round aborted"
            )
        return shamir.combine(shares, self.config.t, SECRET_BYTES)

    def _parse_revealed(
        self, responder: int, revealed: tuple[RevealedShare, ...], owners: set[int]
    ) -> dict[int, shamir.Share]:
        """Check and parse one kind of revealed share; ``owners`` are the parties the request named."""
        parsed: dict[int, shamir.Share] = {}
        for entry in revealed:
            if entry.owner not in owners or entry.owner in parsed:
                raise ProtocolError(
                    f"party {responder} revealed an unrequested or repeated share of party {entry.owner}"
                )
            if responder not in self.config.holders_of(entry.owner):
                raise ProtocolError(f"party {responder} cannot hold a share of party {entry.owner}")
            share = shamir.Share.from_bytes(entry.share)
            if share.x != responder:
                raise ProtocolError(f"party {responder} revealed a share with another party's x")
            parsed[entry.owner] = share
        return parsed

    def _require_quorum(self, count: int, what: str) -> None:
        if count < self.config.t:
            self._phase = _Phase.ABORTED
            raise ThresholdError(
                f"only {count} of {self.config.size} parties {what}, below the threshold {self.config.t}; round aborted"
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
