"""A kind of round plugs in from outside the package: registered by name, run by the one simulator, named in reports.

The toy kind is a plain sum in two stages of its own (each party announces itself, then sends its encoded input
unmasked; a test kind, never a private one): nothing under fedfair/ is edited for it, and the round's order, the
in-process runner and the report's stage words all come from its declaration.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import pytest

from fedfair.core.errors import ConfigError, ProtocolError
from fedfair.runtime.report.data import stage_label
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.round import (
    ROUND_KINDS,
    Opening,
    RoundSetup,
    SecureRound,
    StageSpec,
    register_round_kind,
    small_upload,
    vector_upload,
)
from fedfair.secagg.round_order import PartyOrder
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.bounded.exchange import AUDITOR
from fedfair.secagg.bounded.layout import squared_bound
from fedfair.secagg.bounded.shares import encode_within_bound
from fedfair.secagg.bounded.simulate import bounded_cast
from fedfair.secagg.bounded.stages import BOUNDED_ROUND
from fedfair.secagg.server import AggregateResult
from fedfair.secagg.simulate import DropOut, run_round, simulate_round
from tests.secagg.bounded.roundkit import DIMENSION, FRACTIONAL_BITS, UPDATE_NORM, vector_at
from tests.secagg.helpers import encode_all, make_config, make_inputs


class ToyStage(enum.IntEnum):
    """The toy kind's stages, in order."""

    HELLO = 1
    SEND = 2


@dataclass(frozen=True)
class Hello:
    """A party's announcement: its id."""

    sender: int

    def to_bytes(self) -> bytes:
        return self.sender.to_bytes(4, "big")

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Hello:
        return cls(int.from_bytes(data, "big"))


@dataclass(frozen=True)
class Roll:
    """The server's call to send: who announced themselves."""

    parties: tuple[int, ...]

    def to_bytes(self) -> bytes:
        return b"".join(party.to_bytes(4, "big") for party in self.parties)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Roll:
        return cls(tuple(int.from_bytes(data[i : i + 4], "big") for i in range(0, len(data), 4)))


@dataclass(frozen=True, eq=False)
class Plain:
    """A party's input, unmasked: its id and its encoded words."""

    sender: int
    vector: np.ndarray

    def to_bytes(self) -> bytes:
        return self.sender.to_bytes(4, "big") + self.vector.astype("<u8").tobytes()

    def to_pieces(self) -> tuple[bytes, ...]:
        return (self.to_bytes(),)

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Plain:
        return cls(int.from_bytes(data[:4], "big"), np.frombuffer(data[4:], dtype="<u8").copy())


class ToyClient:
    """A party of the toy kind: it announces itself, then sends its input if the roll names it."""

    def __init__(
        self,
        config: SecAggConfig,
        _setup: RoundSetup,
        name: str,
        _identity_key: object,
        _credential: bytes,
        *,
        verified: bool = False,
    ) -> None:
        self.config, self.party = config, config.party_id(name)

    def hello(self) -> Hello:
        return Hello(self.party)

    def send(self, roll: Roll, encoded: np.ndarray) -> Plain:
        if self.party not in roll.parties:
            raise ProtocolError("the roll leaves this party out")
        return Plain(self.party, encoded.astype(np.uint64))


class ToyServer:
    """The toy kind's server: who said hello, then the sum of their inputs (the SecureSum interface)."""

    def __init__(self, config: SecAggConfig) -> None:
        self.config = config
        self.greeted: list[int] = []
        self.sum = np.zeros(config.dimension + 1, dtype=np.uint64)
        self.sent: list[int] = []

    def hello(self, message: Hello) -> None:
        self.greeted.append(message.sender)

    def roll(self) -> Opening:
        return Opening(tuple(self.greeted), Roll(tuple(self.greeted)))

    def take(self, message: Plain) -> None:
        np.add(self.sum, message.vector, out=self.sum)
        self.sent.append(message.sender)

    def finish(self) -> AggregateResult:
        words = self.sum.astype(self.config.encoder.dtype)
        decoded = self.config.encoder.decode(words, len(self.sent))
        return AggregateResult(words, decoded, tuple(sorted(self.sent)), {}, {}, {})

    culprits: dict[int, str] = {}
    proven: frozenset[int] = frozenset()
    accusations: dict[int, tuple[int, ...]] = {}

    def excluded(self) -> dict[int, str]:
        """Nobody: the toy kind names no culprit."""
        return {}


def toy_kind(name: str) -> SecureRound:
    """A toy kind of round named `name`, with stages named after it."""
    wire = name.upper().replace("-", "_")
    return SecureRound(
        name=name,
        sum_stages=(
            StageSpec(
                ToyStage.HELLO,
                f"{wire}_HELLO",
                "hellos",
                "evaluation hellos",
                received=None,
                step=lambda client, _nothing, _own: client.hello(),
                upload=Hello.from_bytes,
                receive=ToyServer.hello,
                close=ToyServer.roll,
                upload_bytes=small_upload,
                unready="this round's client was never started",
                words="saying hello",
            ),
            StageSpec(
                ToyStage.SEND,
                f"{wire}_SEND",
                "plain inputs",
                "plain evaluation sums",
                received=Roll.from_bytes,
                step=lambda client, roll, own: client.send(roll, own()),
                upload=Plain.from_bytes,
                receive=ToyServer.take,
                close=None,
                upload_bytes=vector_upload,
                unready="no hello was said this round",
            ),
        ),
        verify_stages=(),
        server=lambda config, _setup: ToyServer(config),
        client=ToyClient,
        open_sum=lambda server: Opening(tuple(map(server.config.party_id, server.config.parties)), None),
        open_verification=lambda _server, _result: Opening((), None),
        contribution=ToyStage.SEND,
        committed=ToyStage.SEND,
    )


@pytest.fixture
def registered() -> Iterator[Callable[[SecureRound], SecureRound]]:
    """register_round_kind, with every kind the test registers taken out again after it."""
    names: list[str] = []

    def register(kind: SecureRound) -> SecureRound:
        names.append(kind.name)
        return register_round_kind(kind)

    yield register
    for name in names:
        ROUND_KINDS.pop(name, None)


def test_a_registered_toy_kind_runs_in_the_one_simulator_and_its_words_reach_the_report(
    registered: Callable[[SecureRound], SecureRound],
) -> None:
    toy = registered(toy_kind("toy-plain"))
    assert ROUND_KINDS["toy-plain"] is toy and ROUND_KINDS[SECURE_ROUND.name] is SECURE_ROUND
    config = make_config(4)
    inputs = make_inputs(config, seed=5)
    encoded = encode_all(config, inputs)
    trace = simulate_round(config, lambda party: encoded[party].copy(), DropOut({ToyStage.SEND: [4]}), protocol=toy)
    # The plain sum of the three that sent: exact in the words, within the encoding's error once decoded.
    assert trace.result.contributors == (1, 2, 3)
    expected = sum(encoded[party].astype(np.uint64) for party in (1, 2, 3)).astype(config.encoder.dtype)
    assert np.array_equal(trace.result.encoded_sum, expected)
    truth = sum(inputs[party][0] for party in (1, 2, 3))
    decoded = trace.result.decoded
    assert np.max(np.abs(decoded.weighted_sum - truth)) <= decoded.error_bound
    assert set(trace.client_seconds) == set(ToyStage) and len(trace.client_seconds[ToyStage.SEND]) == 3
    assert stage_label("STAGE_TOY_PLAIN_HELLO") == "saying hello"
    assert stage_label("STAGE_EVAL_TOY_PLAIN_SEND") == "evaluation: eval toy plain send"  # no words: its name


def test_the_one_runner_keeps_the_toy_kinds_order() -> None:
    """The toy client keeps no order: a party's runner refuses its SEND before its HELLO, from the declaration."""
    toy = toy_kind("toy-order")
    hello, send = toy.sum_stages
    config = make_config(4)
    client = ToyClient(config, RoundSetup(lambda _credential, _name: None), config.parties[0], None, b"")  # type: ignore[arg-type,return-value]
    order = PartyOrder(toy.stages(False))
    words = np.zeros(config.dimension + 1, dtype=config.encoder.dtype)
    with pytest.raises(
        ProtocolError, match=r"stage SEND \(TOY_ORDER_SEND\) is out of order: .* waiting for stage HELLO"
    ):
        order.take(send, lambda: client.send(Roll((client.party,)), words))
    assert order.take(hello, client.hello) == Hello(client.party)
    assert order.take(send, lambda: client.send(Roll((client.party,)), words)).sender == client.party


def test_a_second_kind_of_a_registered_name_or_a_stage_said_otherwise_is_refused(
    registered: Callable[[SecureRound], SecureRound],
) -> None:
    registered(toy_kind("toy-once"))
    with pytest.raises(ConfigError, match="'toy-once' is registered already"):
        registered(toy_kind("toy-once"))
    hello, send = toy_kind("toy-once").sum_stages
    clash = replace(toy_kind("toy-twice"), sum_stages=(replace(hello, noun="greetings"), replace(send, words="x")))
    with pytest.raises(ConfigError, match=r"names stages another kind names \(TOY_ONCE_HELLO, TOY_ONCE_SEND\)"):
        registered(clash)
    first, *rest = SECURE_ROUND.sum_stages
    reworded = replace(SECURE_ROUND, name="secagg-reworded", sum_stages=(replace(first, words="other words"), *rest))
    with pytest.raises(ConfigError, match=r"names stages another kind names \(ADVERTISE_KEYS\)"):
        registered(reworded)
    assert "toy-twice" not in ROUND_KINDS and "secagg-reworded" not in ROUND_KINDS
    # A kind that reuses another's stages as they are said (the masked round with a stage more) plugs in.
    assert registered(replace(SECURE_ROUND, name="secagg-copy")) is ROUND_KINDS["secagg-copy"]


LEAVER = 4
"""The site that leaves, in every kind, just before the stage its contribution travels in."""


@pytest.mark.parametrize("kind_name", ["toy-faults", SECURE_ROUND.name, BOUNDED_ROUND.name])
def test_every_kind_runs_in_the_one_simulator_under_the_same_fault_strategy(
    kind_name: str, registered: Callable[[SecureRound], SecureRound]
) -> None:
    """DropOut at each kind's contribution stage: the sum is the three others', within the encoding's error bound.

    The runner branches on no kind: the toy kind's parties are its client's, made as every runner makes them, the
    bounded sum's (its auditor among them) :func:`bounded_cast`'s, and one strategy object, asked at each step,
    leaves site 4 out of each.
    """
    kind = registered(toy_kind(kind_name)) if kind_name == "toy-faults" else ROUND_KINDS[kind_name]
    leaves = DropOut({kind.contribution: [LEAVER]})
    verified = bool(kind.verify_stages)
    if kind is BOUNDED_ROUND:
        bound_sq = squared_bound(UPDATE_NORM, 1.0, FRACTIONAL_BITS)
        vectors = {party: vector_at(0.5, DIMENSION, party) for party in range(1, 5)}
        encoded = {
            party: encode_within_bound(vector, bound_sq, FRACTIONAL_BITS, bytes([party]) * 32)
            for party, vector in vectors.items()
        }
        cast = bounded_cast(
            dimension=DIMENSION,
            fractional_bits=FRACTIONAL_BITS,
            update_norm=UPDATE_NORM,
            weights=dict.fromkeys(vectors, 1.0),
        )
        trace = run_round(kind, cast, encoded.__getitem__, leaves, verified=verified)
        truth = sum(vectors[party] for party in (1, 2, 3))
        assert AUDITOR in trace.parties and trace.upload_bytes[AUDITOR] > 0  # the second verifier took its stages
    else:
        config = make_config(4)
        inputs = make_inputs(config, seed=7)
        encoded = encode_all(config, inputs)
        trace = simulate_round(config, lambda party: encoded[party].copy(), leaves, verified=verified, protocol=kind)
        truth = sum(inputs[party][0] for party in (1, 2, 3))
    assert trace.result.contributors == (1, 2, 3)
    assert LEAVER in trace.parties and LEAVER not in trace.stage_upload_bytes[kind.contribution]
    decoded = trace.result.decoded
    assert np.max(np.abs(decoded.weighted_sum - truth)) <= decoded.error_bound
    if verified:  # every site still there verified the sum the server applies, to the word
        assert sorted(trace.verdicts) == [1, 2, 3]
        for verdict in trace.verdicts.values():
            assert np.array_equal(verdict, trace.result.encoded_sum)
