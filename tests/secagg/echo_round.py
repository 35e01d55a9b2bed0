"""A test-only stage, added to the secure round in one place: each survivor echoes the server's broadcast.

The echo proves the round is declared once: this module adds a stage (one :class:`StageSpec`, its client
step and its server's receive) to a round declaration of its own, :data:`ECHO_ROUND`, and every runner loops
over it unchanged. The server broadcasts a fresh nonce after the survivors' verdicts; each survivor answers
SHA-256 of the session, its party id and the nonce, which the server checks: so the echo also shows that
party and server still share the session.
"""

from __future__ import annotations

import hashlib
import logging
import os
from dataclasses import dataclass, replace


from fedfair.core.errors import ProtocolError
from fedfair.pki.identity import CredentialVerifier
from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.round import NO_INPUT, SECURE_ROUND, Opening, SecureRound, StageSpec, small_upload
from fedfair.secagg.server import Server
from fedfair.secagg.verify_messages import TagSet
from fedfair.secagg.wire import Stage

NONCE_BYTES = 16
DIGEST_BYTES = 32


@dataclass(frozen=True)
class EchoCall:
    """The server's broadcast: a fresh nonce."""

    nonce: bytes

    def to_bytes(self) -> bytes:
        return self.nonce

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> EchoCall:
        if len(data) != NONCE_BYTES:
            raise ProtocolError(f"an echo call is {NONCE_BYTES} bytes, not {len(data)}")
        return cls(bytes(data))


@dataclass(frozen=True)
class Echo:
    """A party's answer: its id and the digest of the session, its id and the nonce."""

    sender: int
    digest: bytes

    def to_bytes(self) -> bytes:
        return self.sender.to_bytes(4, "big") + self.digest

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Echo:
        if len(data) != 4 + DIGEST_BYTES:
            raise ProtocolError(f"an echo is {4 + DIGEST_BYTES} bytes, not {len(data)}")
        return cls(int.from_bytes(data[:4], "big"), bytes(data[4:]))


def echo_digest(session: bytes, party: int, nonce: bytes) -> bytes:
    """What party `party` of session `session` answers to `nonce`."""
    return hashlib.sha256(b"fedfair/test/echo" + session + party.to_bytes(4, "big") + nonce).digest()


class EchoServer(Server):
    """The round's server, which also calls for the echo and checks each answer."""

    def __init__(self, config: SecAggConfig, verify_credential: CredentialVerifier) -> None:
        super().__init__(config, verify_credential)
        self.nonce = os.urandom(NONCE_BYTES)
        self.taggers: tuple[int, ...] = ()
        self.echoed: set[int] = set()

    def tag_set(self) -> TagSet:
        tags = super().tag_set()
        self.taggers = tuple(tag.sender for tag in tags.tags)
        return tags

    def echo_call(self) -> Opening:
        """Close the verdicts: call every survivor that tagged the sum for its echo."""
        return Opening(self.taggers, EchoCall(self.nonce))

    def receive_echo(self, message: Echo) -> None:
        """Take one survivor's echo; refuse one from a stranger, a repeat, or a wrong digest."""
        if message.sender not in self.taggers or message.sender in self.echoed:
            raise ProtocolError(f"party {message.sender} may not echo now")
        if message.digest != echo_digest(self.session_id, message.sender, self.nonce):
            raise ProtocolError(f"party {message.sender}'s echo does not match the call")
        self.echoed.add(message.sender)
        if self.echoed == set(self.taggers):
            names = ", ".join(self.config.name_of(party) for party in sorted(self.echoed))
            logging.getLogger("fedfair.aggregator").info("session %d: echoed by %s", self.config.round, names)


def echo(client: Client, call: EchoCall, _own: object) -> Echo:
    """A party's step: echo the call under its session."""
    return Echo(client.party, echo_digest(client.session_id, client.party, call.nonce))


ECHO = StageSpec(
    Stage.VERIFY,
    "EXTENSION",
    "echoes",
    "evaluation echoes",
    received=EchoCall.from_bytes,
    step=echo,
    upload=Echo.from_bytes,
    receive=EchoServer.receive_echo,
    close=None,
    upload_bytes=small_upload,
    unready=NO_INPUT,
)
"""The echo stage: the one place it is declared."""

_claim, _verdicts = SECURE_ROUND.verify_stages
ECHO_ROUND: SecureRound = replace(
    SECURE_ROUND,
    name="secagg-v3-echo",
    verify_stages=(_claim, replace(_verdicts, close=EchoServer.echo_call), ECHO),
    server=lambda config, setup: EchoServer(config, setup.verify),
)
"""The secure round with the echo after the survivors' verdicts."""
