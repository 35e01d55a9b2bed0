"""A test-only stage, added to the secure round in one place: each survivor echoes the server's call.

The echo proves the round is declared once: this module adds a stage (one :class:`StageSpec`, its client step and
its server's receive) to a round declaration of its own, :data:`ECHO_ROUND`, between the survivors' signatures and
the unmasking (before VERIFY), and every runner loops over it unchanged: the in-process round
(tests/secagg/test_one_place_stage.py) and a real federation over gRPC, where it travels as its place in the
declaration (tests/runtime/test_plugged_round_kind.py). The server calls every survivor that signed with a fresh
nonce; each answers SHA-256 of its session, its party id and the nonce, which the server checks: so the echo also
shows that party and server still share the session.
"""

from __future__ import annotations

import enum
import hashlib
import os
import threading
from dataclasses import dataclass, replace

from fedfair.core.errors import ProtocolError
from fedfair.pki.identity import CredentialVerifier
from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.messages import ConsistencySignature
from fedfair.secagg.round import Opening, SecureRound, StageSpec, small_upload
from fedfair.secagg.masked_round import NO_INPUT, SECURE_ROUND
from fedfair.secagg.server import Server
from fedfair.secagg.wire import Stage

NONCE_BYTES = 16
DIGEST_BYTES = 32


class EchoStage(enum.IntEnum):
    """The echo kind's own stage (the others are the masked round's :class:`~fedfair.secagg.wire.Stage`)."""

    ECHO = 1


@dataclass(frozen=True)
class EchoCall:
    """The aggregator's call: a fresh nonce."""

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
    """A survivor's answer: its party id and the digest of its session, its id and the nonce."""

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


ECHOED: list[tuple[int, tuple[str, ...]]] = []
"""(session round, the names that echoed) of every echo stage a server of this module closed, for a test to read."""
ECHOED_LOCK = threading.Lock()


class EchoServer(Server):
    """The masked round's server, which also calls the survivors that signed for their echo and checks each."""

    def __init__(self, config: SecAggConfig, verify_credential: CredentialVerifier) -> None:
        super().__init__(config, verify_credential)
        self.nonce = os.urandom(NONCE_BYTES)
        self.signers: list[int] = []
        self.echoed: set[int] = set()

    def receive_consistency(self, message: ConsistencySignature) -> None:
        super().receive_consistency(message)
        self.signers.append(message.sender)

    def echo_call(self) -> Opening:
        """Close the signatures: call every survivor that signed for its echo."""
        return Opening(tuple(sorted(self.signers)), EchoCall(self.nonce))

    def receive_echo(self, message: Echo) -> None:
        """Take one survivor's echo; refuse one from a party not called, a repeat, or a wrong digest."""
        if message.sender not in self.signers or message.sender in self.echoed:
            raise ProtocolError(f"party {message.sender} may not echo now")
        if message.digest != echo_digest(self.session_id, message.sender, self.nonce):
            raise ProtocolError(f"party {message.sender}'s echo does not match the call")
        self.echoed.add(message.sender)

    def unmask_after_echo(self) -> Opening:
        """Close the echoes: ask the survivors for their shares, as the masked round's signatures would."""
        with ECHOED_LOCK:
            ECHOED.append((self.config.round, tuple(self.config.name_of(party) for party in sorted(self.echoed))))
        request = self.unmask_request()
        return Opening(request.survivors, request)


def echo(client: Client, call: EchoCall, _own: object) -> Echo:
    """A survivor's step: echo the call under its session."""
    return Echo(client.party, echo_digest(client.session_id, client.party, call.nonce))


ECHO = StageSpec[Client, EchoServer, EchoCall, Echo](
    EchoStage.ECHO,
    "ECHO_TEST_ECHO",
    "echoes",
    "evaluation echoes",
    received=EchoCall.from_bytes,
    step=echo,
    upload=Echo.from_bytes,
    receive=EchoServer.receive_echo,
    close=EchoServer.unmask_after_echo,
    upload_bytes=small_upload,
    unready=NO_INPUT,
    words="echoing the call",
)
"""The echo stage: the one place it is declared."""


*_BEFORE, _CONSISTENCY, _UNMASK = SECURE_ROUND.sum_stages
assert _CONSISTENCY.stage is Stage.CONSISTENCY and _UNMASK.stage is Stage.UNMASK
ECHO_ROUND: SecureRound = replace(
    SECURE_ROUND,
    name="secagg-v3-echo-test",
    sum_stages=(
        *_BEFORE,
        replace(_CONSISTENCY, receive=EchoServer.receive_consistency, close=EchoServer.echo_call),
        ECHO,
        _UNMASK,
    ),
    server=lambda config, setup: EchoServer(config, setup.verify),
)
"""The masked round with :data:`ECHO` between the survivors' signatures and the unmasking (not registered: a test
that runs it in a federation registers it, tests/runtime/test_plugged_round_kind.py)."""
