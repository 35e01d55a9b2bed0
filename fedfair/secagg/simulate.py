"""The one simulator: a secure round of any registered kind in one process, what goes wrong a fault strategy.

The parties and the server are the real state machines and every message goes through its bytes (a stage's input
parsed by its ``received``, an upload by its ``upload``), as a transport carries it, so the demo, the benchmarks and
the tests exercise a deployment's code paths. :func:`run_round` loops over a kind's stages, each party's steps taken
through its :class:`~fedfair.secagg.round_order.PartyOrder` and the server's through the
:class:`~fedfair.secagg.round_order.ServerOrder`, whoever takes part (:class:`Cast`: the roster's parties and a kind's
second verifier). What goes wrong is a strategy it asks at each step (:class:`Faults`, e.g. :class:`DropOut`), never
a branch on a stage. :func:`simulate_round` makes a kind's parties and server as every runner does
(:attr:`~fedfair.secagg.round.SecureRound.client`, :attr:`~fedfair.secagg.round.SecureRound.server`) from a setup
that holds the pinned verifier alone, with identity keys generated per call; the bounded sum, whose parties need
every key, weight and session up front, is cast by :func:`fedfair.secagg.bounded.simulate.bounded_cast`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from fedfair.core.errors import ProtocolError
from fedfair.pki.identity import generate_identity_key, pinned_verifier, public_key_bytes
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.encode import Decoded
from fedfair.secagg.messages import Message
from fedfair.secagg.round import AnyStage, Opening, RoundSetup, SecureRound, Uploaders
from fedfair.secagg.round_order import PartyOrder, ServerOrder
from fedfair.secagg.masked_round import SECURE_ROUND
from fedfair.secagg.server import AggregateResult


@dataclass
class RoundTrace:
    """What happened in a simulated round.

    result: the server's result.
    parties: every party of the round (the auditor under its party id).
    party_seconds: per stage, each party's seconds in its steps (the auditor's under its party id).
    server_seconds: per stage, the server's time (receiving plus closing).
    stage_upload_bytes: per stage, the bytes each party sent (what its step made, before a fault changed or lost it).
    stage_download_bytes: per stage, the bytes each party was sent.
    verdicts: each party that took a stage whose upload is its verdict -> what its step returned (the sum it
        verified).
    refusals: per party, why it refused a stage in which a refusal is kept (:func:`run_round`'s ``refusals``); it
        took no step after it.
    withheld: per stage, why an aggregator runtime would not have sent its outcome on (:attr:`StageSpec.withheld`):
        an in-process round sends it on regardless.
    verified: with :func:`simulate_round`'s ``verified``, each survivor that ran the VERIFY stage -> the aggregate it
        verified, decoded.
    """

    result: AggregateResult
    parties: tuple[int, ...]
    party_seconds: dict[enum.IntEnum, dict[int, float]]
    server_seconds: dict[enum.IntEnum, float]
    stage_upload_bytes: dict[enum.IntEnum, dict[int, int]]
    stage_download_bytes: dict[enum.IntEnum, dict[int, int]]
    verdicts: dict[int, Any] = field(default_factory=dict)
    refusals: dict[int, ProtocolError] = field(default_factory=dict)
    withheld: dict[enum.IntEnum, str] = field(default_factory=dict)
    verified: dict[int, Decoded] = field(default_factory=dict)

    @property
    def client_seconds(self) -> dict[enum.IntEnum, list[float]]:
        """Per stage, the seconds each party spent in its steps, in the order the parties first took one of it."""
        return {stage: list(seconds.values()) for stage, seconds in self.party_seconds.items()}

    @property
    def upload_bytes(self) -> dict[int, int]:
        """Per party, the bytes of every message it sent."""
        return self._per_party(self.stage_upload_bytes)

    @property
    def download_bytes(self) -> dict[int, int]:
        """Per party, the bytes of every message it was sent (a message sent to every party counts for each)."""
        return self._per_party(self.stage_download_bytes)

    def _per_party(self, per_stage: Mapping[enum.IntEnum, Mapping[int, int]]) -> dict[int, int]:
        totals = dict.fromkeys(self.parties, 0)
        for by_party in per_stage.values():
            for party, size in by_party.items():
                totals[party] += size
        return totals


@dataclass(frozen=True)
class Cast:
    """Who takes part in a simulated round: the server's state, and each party's by its party id.

    parties: the roster's parties and, for a kind with a second verifier (:attr:`SecureRound.auditor`), that
        verifier under its id; each takes the stages its :class:`~fedfair.secagg.round.Uploaders` upload in.
    identities: each party's identity key, by its party id, for a fault that signs as a party would.
    server_identity: the server's own identity key where it signs (the bounded sum's aggregator), for a fault that
        signs as a hostile server would; None where it signs nothing.
    """

    server: Any
    parties: Mapping[int, Any]
    identities: Mapping[int, ec.EllipticCurvePrivateKey] = field(default_factory=dict)
    server_identity: ec.EllipticCurvePrivateKey | None = None


class Faults:
    """What goes wrong in a simulated round, as a strategy the runner asks at each step; this one: nothing.

    A subclass overrides the hooks it needs; each is told the stage, so it acts where it means to, and the runner
    branches on no stage of any kind.
    """

    def silent(self, spec: AnyStage, party: int) -> bool:
        """Whether `party` goes silent at `spec` instead of taking it, and stays silent after it."""
        return False

    def opening(self, spec: AnyStage, opening: Opening, server: Any) -> Opening:
        """What the server sends for `spec` where it made `opening` (a hostile server's change)."""
        return opening

    def upload(self, spec: AnyStage, party: int, upload: Any, server: Any) -> Any | None:
        """`party`'s `upload` in `spec` as it reaches the server: changed on its way, or None where it never does."""
        return upload


class DropOut(Faults):
    """Parties that go silent at a stage, by the stage their kind declares (its member of the kind's stage enum).

    A party in ``stages[stage]`` sends nothing from that stage on (the masked round's CHECK: after sharing keys,
    so it is left out of the masking set; MASK: dropped before masking; CONSISTENCY and UNMASK: after masking, so
    its input is still in the sum).
    """

    def __init__(self, stages: Mapping[enum.IntEnum, Collection[int]]) -> None:
        self.stages = stages

    def silent(self, spec: AnyStage, party: int) -> bool:
        """Whether `party` is one that goes silent at `spec`'s stage."""
        return party in self.stages.get(spec.stage, ())


def run_round(
    protocol: SecureRound,
    cast: Cast,
    encoded_input: Callable[[int], np.ndarray],
    faults: Faults | None = None,
    observe: Callable[[Any], None] | None = None,
    *,
    verified: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    refusals: Collection[enum.IntEnum] = (),
) -> RoundTrace:
    """Run a round of `protocol` among `cast`, looping over its stages in order, and return its trace.

    encoded_input(party): a party's encoded input, called only when that party takes the stage its contribution
        travels in, so large inputs need not all be in memory at once.
    faults: what goes wrong (None: nothing).
    observe: called with every upload as the server receives it (after decoding).
    verified: run the verifying stages once the sum is finished.
    clock: what the trace's seconds are read from (``time.process_time`` for CPU seconds).
    refusals: the stages in which a party's refusal (a ProtocolError of its step) is kept in the trace, and the
        party then takes no further step, as a party that refuses a verdict record or a total applies nothing; in
        any other stage the refusal is raised.

    Raises whatever the protocol raises, e.g. ThresholdError when too many parties drop.
    """
    faults = faults or Faults()
    server = cast.server
    order = ServerOrder(protocol, verified)
    orders = {
        party: PartyOrder(protocol.taken_by(Uploaders.AUDITOR if party == protocol.auditor else Uploaders.PARTIES))
        for party in cast.parties
    }
    # Per stage, each party's seconds in its steps, in the order the parties first took a step of it.
    kinds_stages = tuple(dict.fromkeys(spec.stage for spec in protocol.stages(True)))
    party_seconds: dict[enum.IntEnum, dict[int, float]] = {stage: {} for stage in kinds_stages}
    server_seconds: dict[enum.IntEnum, float] = dict.fromkeys(kinds_stages, 0.0)
    upload_bytes: dict[enum.IntEnum, dict[int, int]] = {stage: {} for stage in kinds_stages}
    download_bytes: dict[enum.IntEnum, dict[int, int]] = {stage: {} for stage in kinds_stages}
    verdicts: dict[int, Any] = {}
    refused: dict[int, ProtocolError] = {}
    withheld: dict[enum.IntEnum, str] = {}
    active = set(cast.parties)

    def server_timer(stage: enum.IntEnum) -> _Timer:
        return _Timer(lambda seconds: server_seconds.__setitem__(stage, server_seconds[stage] + seconds), clock)

    def take(spec: AnyStage, party: int, received: Any) -> None:
        """`party` takes the stage's step; the server receives its upload (a verdict is kept in the trace)."""
        encoding = _Encoding(partial(encoded_input, party), clock)
        seconds = party_seconds[spec.stage]
        started = clock()
        try:
            outcome = orders[party].take(spec, partial(spec.take_step, cast.parties[party], received, encoding))
        except ProtocolError as error:
            if spec.stage not in refusals:
                raise
            refused[party] = error
            active.discard(party)
            return
        finally:
            # The party's time in its step, without the caller's encoding of its input.
            seconds[party] = seconds.get(party, 0.0) + clock() - started - encoding.seconds
        if spec.upload is None:  # the party's verdict: the sum it verified
            verdicts[party] = outcome
            return
        sent = faults.upload(spec, party, outcome, server)
        uploads = upload_bytes[spec.stage]
        uploads[party] = uploads.get(party, 0) + len(wire(outcome if sent is None else sent))
        if sent is None:
            return
        message = spec.upload(wire(sent))
        if observe is not None:
            observe(message)
        receive = spec.hooks(server).receive
        assert receive is not None  # a stage whose parties upload a message has a server that takes it
        with server_timer(spec.stage):
            order.receive(spec, message, partial(receive, message))

    def run(spec: AnyStage, opening: Opening) -> Opening | None:
        """Each party still there and addressed takes the stage's step and uploads; then the server closes it."""
        opening = faults.opening(spec, opening, server)
        active.difference_update([party for party in active if faults.silent(spec, party)])
        inputs, broadcast = opening.inputs, None
        if inputs is not None and not isinstance(inputs, Mapping):
            data = wire(inputs)
            broadcast = (len(data), _parsed(spec, data))
        downloads = download_bytes[spec.stage]
        for party in sorted(active.intersection(opening.among)):
            if isinstance(inputs, Mapping):
                data = wire(inputs[party])
                size, received = len(data), _parsed(spec, data)
            else:
                size, received = broadcast or (0, None)
            if size:
                downloads[party] = downloads.get(party, 0) + size
            take(spec, party, received)
        hooks = spec.hooks(server)
        if hooks.withheld is not None:
            with server_timer(spec.stage):
                why = hooks.withheld()
            if why is not None:
                withheld[spec.stage] = why
        if hooks.close is None:
            return None
        with server_timer(spec.stage):
            return order.close(spec, hooks.close)

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
    parties = tuple(cast.parties)
    return RoundTrace(
        result, parties, party_seconds, server_seconds, upload_bytes, download_bytes, verdicts, refused, withheld
    )


def simulate_round(
    config: SecAggConfig,
    encoded_input: Callable[[int], np.ndarray],
    faults: Faults | None = None,
    observe: Callable[[Message], None] | None = None,
    *,
    verified: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    protocol: SecureRound = SECURE_ROUND,
) -> RoundTrace:
    """Run a round of ``config`` among parties its kind makes (:func:`run_round`); return its trace.

    encoded_input(party) gives a party's encoded update (``config.encoder.encode``).
    faults: what goes wrong, e.g. :class:`DropOut` (None: nothing).
    observe: called with every message as the server receives it (after decoding).
    verified: run the VERIFY stages after UNMASK (an honest server's claim); parties that drop at Stage.VERIFY send
        no tag. Where each survivor's re-sum decides (:func:`~fedfair.secagg.resum.resum_decides`: the complete
        graph, above RESUMMED_WORDS too) the others accept the sum all the same; otherwise every survivor refuses
        it (a VerificationError, MISSING_TAG). The trace's ``verified`` holds each verified sum, decoded.
    clock: what the trace's seconds are read from (``time.process_time`` for CPU seconds).
    protocol: the kind of secure round to run, one whose parties and server need only the pinned verifier of the
        round's setup (the bounded sum's cast: :func:`~fedfair.secagg.bounded.simulate.bounded_cast`).

    Raises whatever the protocol raises, e.g. ThresholdError when too many parties drop.
    """
    identities = {name: generate_identity_key() for name in config.parties}
    verify = pinned_verifier({name: key.public_key() for name, key in identities.items()})
    setup = RoundSetup(verify)
    parties = {
        config.party_id(name): protocol.client(config, setup, name, key, public_key_bytes(key), verified=verified)
        for name, key in identities.items()
    }
    keys = {config.party_id(name): key for name, key in identities.items()}
    cast = Cast(protocol.server(config, setup), parties, keys)
    trace = run_round(protocol, cast, encoded_input, faults, observe, verified=verified, clock=clock)
    contributors = len(trace.result.contributors)
    trace.verified = {party: config.encoder.decode(vector, contributors) for party, vector in trace.verdicts.items()}
    return trace


def wire(message: Any) -> bytes:
    """A message's bytes, as a transport carries them."""
    data: bytes = message.to_bytes()
    return data


def _parsed(spec: AnyStage, data: bytes) -> Any:
    """The stage's input as its receiver gets it: parsed from its bytes (None for the first stage's own)."""
    return None if spec.received is None else spec.received(data)


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
