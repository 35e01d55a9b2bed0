"""Run one secure-aggregation round inside one process, without a network.

The parties and the server are the real state machines; every message goes through
its wire format (``to_bytes`` then ``from_bytes``) exactly as a transport would carry
it, so the demo, the benchmark, the tests and the in-process simulation exercise
the same code paths as a deployment. Identity keys are generated per call and
pinned (no PKI). Parties can be made to go silent at any of the six stages, and with ``verified``
the round ends with the VERIFY stage, after which every survivor holds the aggregate it verified.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from fedfair.pki.identity import (
    generate_identity_key,
    pinned_verifier,
    public_key_bytes,
)
from fedfair.secagg.client import Client
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    KeyDirectory,
    MaskedInput,
    MaskingSet,
    Message,
    ShareBundle,
    ShareCheck,
    ShareKeys,
    SurvivorSet,
    UnmaskRequest,
    UnmaskResponse,
)
from fedfair.secagg.wire import Stage
from fedfair.secagg.verify_messages import AggregateClaim, AggregateTag, TagSet
from fedfair.secagg.server import AggregateResult, Server

_M = TypeVar(
    "_M",
    AdvertiseKeys,
    KeyDirectory,
    ShareKeys,
    ShareBundle,
    ShareCheck,
    MaskingSet,
    MaskedInput,
    SurvivorSet,
    ConsistencySignature,
    UnmaskRequest,
    UnmaskResponse,
    AggregateClaim,
    AggregateTag,
    TagSet,
)


@dataclass
class RoundTrace:
    """What happened in a simulated round.

    result: the server's result.
    client_seconds: per stage, the time each party spent in its step.
    server_seconds: per stage, the server's time (receiving plus closing).
    upload_bytes: per party, the bytes of every message it sent.
    verified: with ``verified``, each survivor that ran the VERIFY stage -> the aggregate it verified.
    """

    result: AggregateResult
    client_seconds: dict[Stage, list[float]]
    server_seconds: dict[Stage, float]
    upload_bytes: dict[int, int]
    verified: dict[int, Decoded]


def simulate_round(
    config: SecAggConfig,
    encoded_input: Callable[[int], np.ndarray],
    drop: Mapping[Stage, Collection[int]] | None = None,
    observe: Callable[[Message], None] | None = None,
    *,
    verified: bool = False,
    clock: Callable[[], float] = time.perf_counter,
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
        no tag, so every survivor refuses the aggregate (a VerificationError, MISSING_TAG).
    clock: what the trace's seconds are read from (``time.process_time`` for CPU seconds).

    Raises whatever the protocol raises, e.g. ThresholdError when too many parties drop.
    """
    drop = drop or {}
    identities = {name: generate_identity_key() for name in config.parties}
    verify = pinned_verifier({name: key.public_key() for name, key in identities.items()})
    clients = {
        config.party_id(name): Client(config, name, key, public_key_bytes(key), verify, verified=verified)
        for name, key in identities.items()
    }
    server = Server(config, verify)
    client_seconds: dict[Stage, list[float]] = {stage: [] for stage in Stage}
    server_seconds: dict[Stage, float] = dict.fromkeys(Stage, 0.0)
    upload_bytes = dict.fromkeys(clients, 0)
    active = set(clients)

    def senders(stage: Stage) -> list[int]:
        active.difference_update(drop.get(stage, ()))
        return sorted(active)

    def client_timer(stage: Stage) -> _Timer:
        return _Timer(client_seconds[stage].append, clock)

    def server_timer(stage: Stage) -> _Timer:
        return _Timer(lambda seconds: server_seconds.__setitem__(stage, server_seconds[stage] + seconds), clock)

    def upload(party: int, message: _M) -> _M:
        wire = message.to_bytes()
        upload_bytes[party] += len(wire)
        received = type(message).from_bytes(wire)
        if observe is not None:
            observe(received)
        return received

    for party in senders(Stage.ADVERTISE):
        with client_timer(Stage.ADVERTISE):
            advertisement = clients[party].advertise()
        advertisement = upload(party, advertisement)
        with server_timer(Stage.ADVERTISE):
            server.receive_advertisement(advertisement)
    with server_timer(Stage.ADVERTISE):
        directory = _over_wire(server.key_directory())

    for party in senders(Stage.SHARE):
        with client_timer(Stage.SHARE):
            shares = clients[party].share_keys(directory)
        shares = upload(party, shares)
        with server_timer(Stage.SHARE):
            server.receive_shares(shares)
    with server_timer(Stage.SHARE):
        bundles = server.share_bundles()

    for party in senders(Stage.CHECK):
        bundle = _over_wire(bundles[party])
        with client_timer(Stage.CHECK):
            check = clients[party].check_shares(bundle)
        check = upload(party, check)
        with server_timer(Stage.CHECK):
            server.receive_share_check(check)
    with server_timer(Stage.CHECK):
        masking_set = _over_wire(server.masking_set())

    for party in senders(Stage.MASK):
        if party not in masking_set.parties:
            continue
        encoded = encoded_input(party)
        with client_timer(Stage.MASK):
            masked = clients[party].masked_input(masking_set, encoded)
        masked = upload(party, masked)
        with server_timer(Stage.MASK):
            server.receive_masked_input(masked)
    with server_timer(Stage.MASK):
        survivor_set = _over_wire(server.survivor_set())

    for party in senders(Stage.CONSISTENCY):
        if party not in survivor_set.survivors:
            continue
        with client_timer(Stage.CONSISTENCY):
            signature = clients[party].consistency(survivor_set)
        signature = upload(party, signature)
        with server_timer(Stage.CONSISTENCY):
            server.receive_consistency(signature)
    with server_timer(Stage.CONSISTENCY):
        request = _over_wire(server.unmask_request())

    for party in senders(Stage.UNMASK):
        if party not in request.survivors:
            continue
        with client_timer(Stage.UNMASK):
            response = clients[party].unmask(request)
        response = upload(party, response)
        with server_timer(Stage.UNMASK):
            server.receive_unmask_response(response)
    with server_timer(Stage.UNMASK):
        result = server.finish()
    accepted: dict[int, Decoded] = {}
    if verified:
        with server_timer(Stage.VERIFY):
            claim = _over_wire(server.claim())
        taggers = [party for party in senders(Stage.VERIFY) if party in result.contributors]
        for party in taggers:
            with client_timer(Stage.VERIFY):
                tag = clients[party].tag(claim)
            tag = upload(party, tag)
            with server_timer(Stage.VERIFY):
                server.receive_tag(tag)
        with server_timer(Stage.VERIFY):
            tags = _over_wire(server.tag_set())
        for party in taggers:
            started = clock()
            vector = clients[party].verify(tags)
            client_seconds[Stage.VERIFY][taggers.index(party)] += clock() - started
            accepted[party] = config.encoder.decode(vector, len(result.contributors))
    return RoundTrace(result, client_seconds, server_seconds, upload_bytes, accepted)


def _over_wire(message: _M) -> _M:
    """The message as its receiver gets it: serialised and parsed again."""
    return type(message).from_bytes(message.to_bytes())


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
