"""The aggregator's key stages of secure aggregation: ADVERTISE, SHARE and CHECK, each a receive and a close.

Each ``receive_*`` step takes one arriving message and raises a :class:`~fedfair.core.errors.ProtocolError`
subclass for one it refuses; each close fixes who goes on and raises
:class:`~fedfair.core.errors.ThresholdError` when fewer than t parties remain.
"""

from __future__ import annotations

from fedfair.core.errors import (
    AuthenticationError,
    ProtocolError,
)
from fedfair.pki.identity import is_valid_signature
from fedfair.secagg import keys
from fedfair.secagg.credentials import verify_advertisement
from fedfair.secagg.messages import (
    AdvertiseKeys,
    Dealing,
    EncryptedShares,
    KeyDirectory,
    MaskingSet,
    ShareBundle,
    ShareCheck,
    ShareKeys,
)
from fedfair.secagg.payloads import (
    dealing_lines,
    dealing_payload,
    session_id,
    share_check_payload,
)
from fedfair.secagg.server_state import ServerState
from fedfair.secagg.wire import Stage, check_header, check_ids


class KeyStages(ServerState):
    """The server's ADVERTISE, SHARE and CHECK stages: keys, then encrypted shares, then the parties' checks."""

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
