"""Run one secure-aggregation round inside one process, without a network.

The parties and the server are the real state machines; every message goes through
its wire format (``to_bytes`` then ``from_bytes``) exactly as a transport would carry
it, so the demo, the benchmark, the tests and the in-process simulation exercise
the same code paths as a deployment. Identity keys are generated per call and
pinned (no PKI). The round loops over the stages of :data:`~fedfair.secagg.round.SECURE_ROUND` (or the
``protocol`` given). Parties can be made to go silent at any stage, and with ``verified`` the round ends with
the VERIFY stages, after which every survivor holds the aggregate it verified.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from fedfair.pki.identity import (
    generate_identity_key,
    pinned_verifier,
    public_key_bytes,
)
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded
from fedfair.secagg.round import AnyStage, Opening, PartyOrder, RoundSetup, SECURE_ROUND, SecureRound, ServerOrder
from fedfair.secagg.server import AggregateResult
from fedfair.secagg.messages import Message


@dataclass
class RoundTrace:
    """What happened in a simulated round.

    result: the server's result.
    client_seconds: per stage, the time each party spent in its step.
    server_seconds: per stage, the server's time (receiving plus closing).
    upload_bytes: per party, the bytes of every message it sent.
    download_bytes: per party, the bytes of every message it was sent (a message sent to every party counts for each).
    verified: with ``verified``, each survivor that ran the VERIFY stage -> the aggregate it verified.
    """

    result: AggregateResult
    client_seconds: dict[enum.IntEnum, list[float]]
    server_seconds: dict[enum.IntEnum, float]
    upload_bytes: dict[int, int]
    download_bytes: dict[int, int]
    verified: dict[int, Decoded]


def simulate_round(
    config: SecAggConfig,
    encoded_input: Callable[[int], np.ndarray],
    drop: Mapping[enum.IntEnum, Collection[int]] | None = None,
    observe: Callable[[Message], None] | None = None,
    *,
    verified: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    protocol: SecureRound = SECURE_ROUND,
) -> RoundTrace:
    """Run a round of ``config`` and return its trace.

    encoded_input(party) gives a party's encoded update (``config.encoder.encode``); it is
    called only when that party reaches the MASK stage, so large inputs need not all be
    in memory at once.
    drop[stage]: parties that go silent instead of sending their message of that stage
        and stay silent after it (CHECK: after sharing keys, so they are left out of the
        masking set; MASK: dropped before masking; CONSISTENCY and UNMASK: after masking,
        so their inputs are still in the sum).
    observe: called with every message as the server receives it (after decoding).
    verified: run the VERIFY stage after UNMASK (an honest server's claim); drop[Stage.VERIFY] parties send
        no tag. Where each survivor's re-sum decides (:func:`~fedfair.secagg.resum.resum_decides`: the complete
        graph, above RESUMMED_WORDS too) the others accept the sum all the same; otherwise every survivor refuses
        it (a VerificationError, MISSING_TAG).
    clock: what the trace's seconds are read from (``time.process_time`` for CPU seconds).
    protocol: the kind of secure round to run (its stages, its client and server), looped over in order; its
        parties are made from :class:`~fedfair.secagg.client.Client`'s arguments (the bounded sum, whose auditor
        takes part beside them, runs in :func:`~fedfair.secagg.bounded.simulate.simulate_bounded_round`).

    Raises whatever the protocol raises, e.g. ThresholdError when too many parties drop.
    """
    drop = drop or {}
    identities = {name: generate_identity_key() for name in config.parties}
    verify = pinned_verifier({name: key.public_key() for name, key in identities.items()})
    clients = {
        config.party_id(name): protocol.client(config, name, key, public_key_bytes(key), verify, verified=verified)
        for name, key in identities.items()
    }
    server = protocol.server(config, RoundSetup(verify))
    order = ServerOrder(protocol, verified)
    orders = {party: PartyOrder(protocol.stages(verified)) for party in clients}
    # Per stage, each party's seconds in its steps, in the order the parties first took a step of it.
    kinds_stages = tuple(dict.fromkeys(spec.stage for spec in protocol.stages(True)))
    party_seconds: dict[enum.IntEnum, dict[int, float]] = {stage: {} for stage in kinds_stages}
    server_seconds: dict[enum.IntEnum, float] = dict.fromkeys(kinds_stages, 0.0)
    upload_bytes = dict.fromkeys(clients, 0)
    download_bytes = dict.fromkeys(clients, 0)
    active = set(clients)
    verified_sums: dict[int, np.ndarray] = {}

    def server_timer(stage: enum.IntEnum) -> _Timer:
        return _Timer(lambda seconds: server_seconds.__setitem__(stage, server_seconds[stage] + seconds), clock)

    def run(spec: AnyStage, opening: Opening) -> Opening | None:
        """Each party still there and addressed takes the stage's step and uploads; then the server closes it."""
        stage = spec.stage
        active.difference_update(drop.get(stage, ()))
        inputs = opening.inputs
        if inputs is not None and not isinstance(inputs, Mapping):
            inputs = _over_wire(inputs)
        for party in sorted(active.intersection(opening.among)):
            received = _over_wire(inputs[party]) if isinstance(inputs, Mapping) else inputs
            if received is not None:
                download_bytes[party] += len(received.to_bytes())
            encoding = _Encoding(partial(encoded_input, party), clock)
            seconds = party_seconds[stage]
            started = clock()
            outcome = orders[party].take(spec, partial(spec.step, clients[party], received, encoding))
            # The party's time in its step, without the caller's encoding of its input.
            seconds[party] = seconds.get(party, 0.0) + clock() - started - encoding.seconds
            if spec.upload is None:  # the party's verdict: the sum it verified
                verified_sums[party] = outcome
                continue
            wire = outcome.to_bytes()
            upload_bytes[party] += len(wire)
            message = spec.upload(wire)
            if observe is not None:
                observe(message)
            receive = spec.receive
            assert receive is not None  # a stage whose parties upload a message has a server that takes it
            with server_timer(stage):
                order.receive(spec, message, partial(receive, server, message))
        close = spec.close
        if close is None:
            return None
        with server_timer(stage):
            return order.close(spec, partial(close, server))

    order.begin()
    opening: Opening | None = protocol.open_sum(server)
    for spec in protocol.sum_stages:
        assert opening is not None  # every stage of the sum but its last opens the next
        opening = run(spec, opening)
    last = protocol.sum_stages[-1]
    with server_timer(last.stage):
        result: AggregateResult = order.close(last, server.finish)
    if verified:
        first = protocol.verify_stages[0].stage
        with server_timer(first):
            order.verify()
            opening = protocol.open_verification(server, result)
        for spec in protocol.verify_stages:
            assert opening is not None  # every verifying stage but the last opens the next
            opening = run(spec, opening)
    accepted = {
        party: config.encoder.decode(vector, len(result.contributors)) for party, vector in verified_sums.items()
    }
    client_seconds = {stage: list(seconds.values()) for stage, seconds in party_seconds.items()}
    return RoundTrace(result, client_seconds, server_seconds, upload_bytes, download_bytes, accepted)


def _over_wire(message: Any) -> Any:
    """The message as its receiver gets it: serialised and parsed again."""
    return type(message).from_bytes(message.to_bytes())


class _Encoding:
    """A party's encoded input, asked for by the stage that masks it; the seconds the caller took to encode it."""

    def __init__(self, encoded_input: Callable[[], np.ndarray], clock: Callable[[], float]) -> None:
        self._encoded_input = encoded_input
        self._clock = clock
        self.seconds = 0.0

    def __call__(self) -> np.ndarray:
        started = self._clock()
        encoded = self._encoded_input()
        self.seconds += self._clock() - started
        return encoded


class _Timer:
    """Context manager that reports the seconds spent inside it to ``record``."""

    def __init__(self, record: Callable[[float], None], clock: Callable[[], float]) -> None:
        self._record = record
        self._clock = clock
        self._start = 0.0

    def __enter__(self) -> None:
        self._start = self._clock()

    def __exit__(self, *exc_info: object) -> None:
        self._record(self._clock() - self._start)
