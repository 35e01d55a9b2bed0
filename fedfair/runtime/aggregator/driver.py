"""One aggregation over the network: a secure (or plain) sum of the participants' vectors.

The round driver of the aggregator. For a training round it opens STAGE_TRAIN
(collaborators download (theta_t, c_t) and train; nothing is uploaded), then at once
the secure-aggregation stages, each of which closes as soon as every expected
collaborator has uploaded, withdrawn or disconnected, or at its deadline. The key
stages before MASKED_INPUT run while the collaborators train (they need nothing of
the update), so with real training their round trips hide behind it:

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from fedfair.core.errors import ConfigError, ProtocolError, Refusal, RefusedError, RoundAbortedError
from fedfair.pki.identity import CredentialVerifier
from fedfair.runtime.aggregator.board import Board
from fedfair.runtime.aggregator.checks import SumOutcome, UploadScreen, decode_plain
from fedfair.runtime.aggregator.kept_inputs import in_file, kept_in_files
from fedfair.runtime.aggregator.secure_uploads import SecureUpload
from fedfair.runtime.aggregator.stages import HELD_UP_SECONDS, RoundGrace, StageReady, UploadHandler
from fedfair.runtime.aggregator.progress_line import report_progress
from fedfair.runtime.aggregator.round_identities import RoundIdentities, aggregator_setup, relayed_identities
from fedfair.runtime.contract import (
    ACCEPTED,
    RoundParameters,
    Stages,
    model_digest,
)
from fedfair.runtime.faults import maybe_die
from fedfair.runtime.transport import TRAIN, InPieces, Pieces, StageGate, WireStage, make_binding, pb
from fedfair.runtime.transport.chunks import plain_rounding, plain_upload_size
from fedfair.secagg import EncodingConfig, SecAggConfig, SecurityParameters
from fedfair.secagg.credentials import remembered
from fedfair.secagg.round import AnyStage, Opening, PartyNames, SecureSum
from fedfair.secagg.round_order import ServerOrder

logger = logging.getLogger("fedfair.aggregator")


@dataclass(frozen=True)
class DriverSettings:
    """What the driver needs of the plan."""

    federation_id: str
    secure: bool
    security: SecurityParameters
    """The plan's, held to the manifest at load: every round's parameters carry it whole."""
    stage_timeout: float
    graph_roster: tuple[str, ...] = ()
    """The plan's whole roster, which the masking graph is drawn over (empty: each round's parties)."""
    grace: float | None = None
    """[quorum] grace_factor: a stage waits at most this times its median answer time (StageTiming)."""
    tolerates_dropouts: bool = True
    """[secure_aggregation] dropouts: whether a site past the grace is dropped (True) or aborts the round."""
    folder: Path | None = None
    """Where large masked inputs kept for a re-sum go (:mod:`.kept_inputs`); None: the system's temporary folder."""
    identities: RoundIdentities | None = None
    """What a round whose parties need identity keys up front takes (the bounded sum); None: no such round runs."""


class SumDriver:
    """Runs aggregations over a Board and a StageGate (one at a time, from one thread)."""

    def __init__(self, board: Board, gate: StageGate, settings: DriverSettings, verify: CredentialVerifier) -> None:
        self.board = board
        self.gate = gate
        self.settings = settings
        # The same certificates advertise every round: each is checked in full once, then by its window.
        self.verify = remembered(verify)
        self.answers: dict[str, dict[str, float | None]] = {}
        """The last aggregation's answer times: stage name -> peer -> seconds after the stage opened (None: no
        answer). Kept after a RoundAbortedError too, so an aborted round still names who held it up."""
        self.held_up: dict[str, float] = {}
        """The last aggregation's wait for each peer past its stages' median answers (StageTiming.held_up), summed."""
        self.grace = RoundGrace(-1, settings.grace)
        """The grace of the round in progress, across its aggregations (training, then evaluation)."""
        self.bound_inputs: frozenset[str] = frozenset()
        """Whom the last aggregation bound every site's input on its model to (empty: nobody yet): the survivors of a
        masked sum once it was unmasked (verified aggregation), a bounded sum's roster once its shares were asked for
        (:attr:`~fedfair.secagg.round.SecureRound.binds_roster_at`). A round void after that leaves the next round on
        the same model to exactly them."""

    def run(
        self,
        round_number: int,
        stages: Stages,
        participants: frozenset[str],
        dimension: int,
        encoding: EncodingConfig,
        model: tuple[np.ndarray, float],
        *,
        kind: str | None = None,
        start_input: bytes = b"",
        screen: UploadScreen | None = None,
    ) -> SumOutcome:
        """Open the start stage with `model` for download, then aggregate `dimension`-long vectors.

        `kind` names the aggregation in its public parameters (default: "train" or "evaluate" by `stages`; the
        statistics aggregation passes its own), and `start_input` is what every participant may fetch at the
        start stage (the federation's encoder under a [schema]). `screen(peer, values, weight)` sees each plain
        upload (w * x and w) once it passed the encoding's bounds and raises RefusedError to refuse it; secure
        sums hide the uploads, so it is not called for them. `model` is dropped once the board has cut it.
        """
        roster = tuple(sorted(participants))
        self.answers, self.held_up = {}, {}
        self.bound_inputs = frozenset[str]()
        if self.grace.round != round_number:
            self.grace = RoundGrace(round_number, self.settings.grace)
        # The statistics aggregation (its own kind) answers no model; every other binds its session to one.
        digest = "" if kind is not None else model_digest(*model)
        parameters = self.parameters(round_number, stages, roster, dimension, encoding, kind or stages.kind, digest)
        start = self.gate.open(
            round_number, stages.start, timeout_seconds=self.settings.stage_timeout, participants=roster
        )
        self.board.offers.set_model(start, *model)
        del model  # cut into the board's parts: the caller hands it over, so no copy outlives the cut
        self.board.offers.set_start_input(start, roster, start_input)
        self.board.publish(
            roster,
            start,
            pb.ACTION_RUN,
            deadline_seconds=self.settings.stage_timeout,
            inputs=dict.fromkeys(roster, start_input),
        )
        try:
            if self.settings.secure:
                return self._secure(round_number, stages, parameters)
            return self._plain(round_number, stages, parameters, screen)
        except (RoundAbortedError, ProtocolError, ConfigError) as error:
            self.gate.close()
            self.board.close_stage()
            # Bound to the round's last stage, so it comes after whatever a collaborator did last.
            aborted = make_binding(self.settings.federation_id, round_number, stages.last(self.settings.secure))
            self.board.publish(roster, aborted, pb.ACTION_ABORTED)
            culprits = error.culprits if isinstance(error, RoundAbortedError) else {}
            raise RoundAbortedError(str(error), culprits) from None

    def parameters(
        self,
        round_number: int,
        stages: Stages,
        roster: tuple[str, ...],
        dimension: int,
        encoding: EncodingConfig,
        kind: str,
        model: str,
    ) -> RoundParameters:
        """The public parameters of an aggregation of `roster` over `stages`, answering the model of digest `model`.

        Every one the plan fixes, the graph seed they imply, the secure round's name and the certificates it relays.
        """
        parameters = RoundParameters(
            kind=kind,
            round=round_number,
            secure=self.settings.secure,
            parties=roster,
            dimension=dimension,
            encoding=encoding,
            security=self.settings.security,
            graph_roster=self.settings.graph_roster or roster,
            model=model,
        )
        return replace(
            parameters,
            graph_seed=parameters.implied_graph_seed(self.settings.federation_id, stages),
            protocol=stages.protocol.name,
            identities=relayed_identities(self.settings.identities, stages, roster),
        )

    # ------------------------------------------------------------ one stage

    def _stage(
        self,
        round_number: int,
        stages: Stages,
        stage: WireStage,
        expected: frozenset[str],
        inputs: bytes | Mapping[str, bytes | Pieces],
        handler: UploadHandler,
        max_upload_bytes: int,
        outcome: SumOutcome,
        *,
        ready: StageReady | None = None,
        kept: bytes | None = None,
        rejoinable: bool = False,
    ) -> frozenset[str]:
        """Run one stage (until everyone answered, `ready` says the protocol has enough, or the deadline).

        `kept`: where each party is sent its own input, the part they are all sent alike, kept for a site that
        missed the round (:attr:`~fedfair.secagg.round.Opening.shared`); `rejoinable`: a restarted site may take the
        stage up (:attr:`~fedfair.secagg.round.StageSpec.rejoinable`). Return who uploaded to it.
        """
        started = time.perf_counter()
        timeout = self.settings.stage_timeout
        binding = self.gate.open(round_number, stage, timeout_seconds=timeout, participants=expected)
        handler = self._with_fault_points(round_number, stages, stage, handler)
        timing = self.grace.timing(expected)
        self.board.open_stage(
            binding,
            expected,
            inputs,
            handler,
            max_upload_bytes=max_upload_bytes,
            timeout=timeout,
            ready=ready,
            timing=timing,
            rejoinable=rejoinable,
        )
        # Kept for a site that misses a training round, once it applies (.past_rounds), where the round's kind lets
        # it check one afterwards (SecureRound.keeps_past_rounds): written while the sites work.
        if stages.start == TRAIN and stages.protocol.keeps_past_rounds:
            self.board.past_rounds.opened(binding, inputs if kept is None else kept)
        self.board.wait_stage(partial(report_progress, self.settings.secure, stages, self.board.events))
        self.gate.close()
        uploaded, received = self.board.close_stage()
        if self.board.closed:
            raise RoundAbortedError("the aggregator is shutting down")
        name = stages.name(stage)
        # Milliseconds are enough, and keep rounds.jsonl small.
        self.answers[name] = {peer: _ms(timing.answers.get(peer)) for peer in sorted(expected)}
        for peer, seconds in self.grace.closed(timing, expected).items():
            self.held_up[peer] = self.held_up.get(peer, 0.0) + seconds
        why = timing.past_grace(name, expected)
        if why is not None and not self.settings.tolerates_dropouts:
            raise RoundAbortedError(f'{why}; dropouts = "none" lets no round finish without them')
        if why is not None:
            logger.warning("round %d: %s; dropped from the round", round_number, why)
        outcome.stage_seconds[name] = time.perf_counter() - started
        outcome.received_bytes += received
        missing = sorted(expected - uploaded)
        if missing:
            outcome.dropped[name] = missing
            # Usual when t is below the roster (a stage closes with enough answers); the round's INFO line and
            # rounds.jsonl say who contributed.
            logger.debug("round %d %s: %d of %d uploaded", round_number, name, len(uploaded), len(expected))
        return uploaded

    def laggards(self, round_number: int) -> dict[str, float]:
        """The peers the last aggregation waited on HELD_UP_SECONDS or more past its stages' median answers.

        Returns peer -> seconds held up (rounded to ms), longest first; each is named in one INFO log line.
        """
        late = sorted(((s, peer) for peer, s in self.held_up.items() if s >= HELD_UP_SECONDS), reverse=True)
        for seconds, peer in late:
            logger.info(
                "round %d waited %.1f s for %s past the median answer of its stages", round_number, seconds, peer
            )
        return {peer: round(seconds, 3) for seconds, peer in late}

    def _with_fault_points(
        self, round_number: int, stages: Stages, stage: WireStage, handler: UploadHandler
    ) -> UploadHandler:
        """`handler`, with the test-only aggregator kill points of `stage` (see :mod:`fedfair.runtime.faults`).

        ``aggregator-stage:R:STAGE`` kills the aggregator mid-stage: as soon as the first
        upload to STAGE of round R has been absorbed (so the stage holds part of the
        round and its sender has not yet been answered). The start stages (TRAIN,
        EVALUATE) take no uploads; theirs fires as the first upload of the masked stage
        arrives, before it is absorbed (the key stages before it run while collaborators
        train, so an upload to them says nothing of training): every participant has been
        sent the model, at least one has computed its contribution, and nothing is summed yet.
        """
        start = stages.start if stage == stages.masked else None

        def absorb(peer: str, payload: bytes) -> None:
            if start is not None:
                maybe_die("aggregator-stage", round_number, stages.name(start))
            handler(peer, payload)
            maybe_die("aggregator-stage", round_number, stages.name(stage))

        return absorb

    # ------------------------------------------------------------ secure aggregation

    def _secure(self, round_number: int, stages: Stages, parameters: RoundParameters) -> SumOutcome:
        """Run every stage of the aggregation's secure round (:attr:`Stages.protocol`), in its order."""
        protocol = stages.protocol
        try:
            config = parameters.secagg_config(self.settings.federation_id, stages)
            setup = aggregator_setup(self.settings.identities, self.verify, parameters, stages)
            server = protocol.server(config, setup)
            names = protocol.names(config, setup)
        except ConfigError as error:
            raise RoundAbortedError(f"secure aggregation cannot run with these participants: {error}") from None
        outcome = SumOutcome(np.zeros(0), 0.0, 0.0, ())
        order = ServerOrder(protocol, verified=True)

        def run(specs: tuple[AnyStage, ...], opening: Opening | None) -> None:
            for spec in specs:
                assert opening is not None  # every stage of a round but the last of its sum and its own opens the next
                if spec.stage is protocol.binds_roster_at:
                    # A site binds its input to the roster before it shares: from here on a void round leaves the
                    # next round on this model to exactly the roster, as the sites will only share it with that one.
                    self.bound_inputs = frozenset(config.parties)
                self._secure_stage(
                    round_number, stages, spec, order, server, opening, parameters, outcome, config, names
                )
                hooks = spec.hooks(server)
                why = hooks.withheld() if hooks.withheld is not None else None
                if why is not None:  # a culprit the hook found (a false re-checked report) is named all the same
                    raise RoundAbortedError(why, self._named(round_number, config, server))
                opening = order.close(spec, hooks.close) if hooks.close is not None else None

        try:
            order.begin()
            run(protocol.sum_stages, protocol.open_sum(server))
            result = order.close(protocol.sum_stages[-1], server.finish)
            # From here on, a void round leaves every survivor bound to the sum's contributors.
            if protocol.binds_roster_at is None:
                self.bound_inputs = frozenset(map(config.name_of, result.contributors))
            if protocol.verify_stages:
                order.verify()
            run(protocol.verify_stages, protocol.open_verification(server, result))
        except ProtocolError as error:
            # Whoever the protocol could prove misbehaved is named, even when the round is void.
            raise RoundAbortedError(str(error), self._named(round_number, config, server)) from None
        outcome.culprits = self._named(round_number, config, server)
        if protocol.evidence is not None:  # what a party can later show for whom the sum names
            outcome.verdict_record_sha256 = hashlib.sha256(protocol.evidence(server)).hexdigest()
        outcome.weighted_sum = result.decoded.weighted_sum
        outcome.total_weight = result.decoded.total_weight
        outcome.error_bound = result.decoded.error_bound
        outcome.noise_std = result.decoded.noise_std
        outcome.contributors = tuple(config.name_of(party) for party in result.contributors)
        return outcome

    def _secure_stage(
        self,
        round_number: int,
        stages: Stages,
        spec: AnyStage,
        order: ServerOrder,
        server: SecureSum,
        opening: Opening,
        parameters: RoundParameters,
        outcome: SumOutcome,
        config: SecAggConfig,
        names: PartyNames,
    ) -> None:
        """Run one stage of a secure round: send each party `opening` addressed it and take its upload.

        The first stage's input is the round's public parameters. A stage whose parties upload a verdict
        (:data:`~fedfair.runtime.contract.ACCEPTED`) takes nothing else. `names` maps the opening's party ids to
        the peers' names (a round's auditor included).
        """
        expected = frozenset(map(names.name_of, opening.among))
        if opening.inputs is None:
            inputs: bytes | dict[str, bytes | Pieces] = parameters.to_bytes()
        elif isinstance(opening.inputs, Mapping):
            # Each party's own message in pieces where it travels so, views of the server's vectors (a re-checked
            # claim's peers' inputs, kept in files): copied as a party fetches it, a chunk at a time, never n
            # messages whole at once (n (max_colluding + 3) (d + 1) words).
            inputs = {
                names.name_of(party): message.to_pieces() if isinstance(message, InPieces) else message.to_bytes()
                for party, message in opening.inputs.items()
            }
        else:
            inputs = opening.inputs.to_bytes()
        hooks = spec.hooks(server)
        if spec.upload is None:
            handler: UploadHandler = _verdict
        else:
            parse, receive = spec.upload, hooks.receive
            assert receive is not None  # a stage whose parties upload a message has a server that takes it
            if spec.stage is stages.protocol.kept and kept_in_files(config):
                parse = in_file(parse, self.settings.folder)
            handler = SecureUpload(parse, partial(_receive, order, spec, receive)).handler(names)
        ready = hooks.ready
        size = spec.upload_bytes(config)
        kept = None if opening.shared is None else opening.shared.to_bytes()
        uploaded = self._stage(
            round_number,
            stages,
            stages.wire(spec),
            expected,
            inputs,
            handler,
            size,
            outcome,
            ready=ready,
            kept=kept,
            rejoinable=spec.rejoinable,
        )
        del inputs, kept  # a claimed sum's d + 1 words: the board's parts hold them no longer than the stage
        refused = sorted(expected - uploaded)
        if spec.upload is None:
            outcome.verified_by = uploaded
        if spec.upload is None and refused:
            # With the true sum claimed and its tags adding up, an honest survivor accepts it: one that did not
            # answer dropped out (or lies); the model is the survivors' sum all the same.
            logger.warning("round %d: no verdict on the verified sum from %s", round_number, ", ".join(refused))

    def _named(self, round_number: int, config: SecAggConfig, server: SecureSum) -> dict[str, str]:
        """The collaborators to exclude from later rounds, with why: the protocol's rule (:meth:`SecureSum.excluded`).

        A party only accused, by too few to be sure one accuser is honest, is logged: it already sat out this round.
        """
        names = server.excluded()
        for party in sorted(server.culprits.keys() - names.keys()):
            logger.warning(
                "round %d: %s was accused by %s; left out of this round, not excluded (at most %d accusers may lie)",
                round_number,
                config.name_of(party),
                ", ".join(config.name_of(accuser) for accuser in server.accusations.get(party, ())),
                config.security.max_colluding,
            )
        return {config.name_of(party): why for party, why in names.items()}

    # ------------------------------------------------------------ plain sums

    def _plain(
        self,
        round_number: int,
        stages: Stages,
        parameters: RoundParameters,
        screen: UploadScreen | None,
    ) -> SumOutcome:
        dimension, encoding = parameters.dimension, parameters.encoding
        outcome = SumOutcome(np.zeros(0), 0.0, 0.0, ())
        uploads: dict[str, tuple[np.ndarray, float]] = {}
        stage = stages.masked

        def absorb(peer: str, payload: bytes) -> None:
            values, weight = decode_plain(payload, dimension, encoding, stages.plain_values)
            if screen is not None:
                screen(peer, values, weight)
            uploads[peer] = values, weight

        size, roster = plain_upload_size(dimension, stages.plain_values), frozenset(parameters.parties)
        contributors = self._stage(round_number, stages, stage, roster, parameters.to_bytes(), absorb, size, outcome)
        if not contributors:
            raise RoundAbortedError("no collaborator sent its update")
        # Float addition is not associative: a fixed order (not arrival order) makes the sum,
        # and so the model, the same bits however the uploads raced, in a re-run round too.
        total, total_weight = np.zeros(dimension, dtype=np.float64), 0.0
        for name in sorted(contributors):
            values, weight = uploads.pop(name)  # each upload's bytes go as soon as they are summed
            np.add(total, values, out=total)
            total_weight += weight
            # Its values lie within clip * w, and the wire type moved each by at most plain_rounding of that.
            outcome.error_bound += plain_rounding(encoding.clip * weight, stages.plain_values)
        outcome.weighted_sum, outcome.total_weight = total, total_weight
        outcome.contributors = tuple(sorted(contributors))
        return outcome


def _receive(order: ServerOrder, spec: AnyStage, receive: Callable[[object], None], message: object) -> None:
    """The server's `receive` of `message` in `spec`, taken only while that stage is open (:class:`ServerOrder`)."""
    order.receive(spec, message, partial(receive, message))


def _verdict(peer: str, payload: bytes) -> None:
    """Take a survivor's verdict on the verified sum: the word accepted, or no upload."""
    if payload != ACCEPTED:
        raise RefusedError(Refusal.INVALID_UPLOAD, "a verdict is the word accepted, or no upload")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)
