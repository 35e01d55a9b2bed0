"""The collaborator's secure-aggregation steps of one aggregation (a training round or an evaluation), of any kind.

Each upload stage has one step function, ``step(participant, work, inputs) -> payload``, built from the round
kind's declaration in its order (:func:`~fedfair.runtime.collaborator.stage_steps.round_steps`): every kind's own
(:func:`kind_steps`: start the client, hand in the contribution), a kind's where it registered its own
(:func:`register_kind_steps`; the built-in kinds' are in :mod:`fedfair.runtime.collaborator.kinds`), else the
stage's client step.

A step raises a WITHDRAWN :class:`~fedfair.core.errors.RefusedError` (or the protocol's own errors) to withdraw
from the rest of the round; the process (:mod:`fedfair.runtime.collaborator.client`) uploads the empty withdrawal.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from typing import Any, TypeVar

import numpy as np
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePrivateKey

from fedfair.core.errors import (
    ConfigError,
    ManifestError,
    ProtocolError,
    Refusal,
    RefusedError,
    VerificationError,
)
from fedfair.datasets.statistics import statistics_dimension
from fedfair.fairness import sums
from fedfair.pki.identity import CredentialVerifier
from fedfair.runtime.collaborator.chain import InitialModel, ModelChain
from fedfair.runtime.collaborator.figures import EvaluationFigures
from fedfair.runtime.collaborator.input_record import SignedView
from fedfair.runtime.collaborator.outcome import OutcomeRecord
from fedfair.core.update import update_dimension
from fedfair.runtime.contract import (
    EVALUATION,
    RoundParameters,
    Stages,
)
from fedfair.runtime.manifest import Manifest
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.preprocessing import STATISTICS_KIND, STATISTICS_ROUND, statistics_encoding
from fedfair.runtime.transport import InPieces, Pieces
from fedfair.runtime.transport.chunks import plain_upload
from fedfair.secagg import EncodingConfig, SecurityParameters
from fedfair.secagg.credentials import remembered
from fedfair.secagg.graph import canonical_roster
from fedfair.secagg.round import AnyStage, Message, RoundSetup, SecureRound
from fedfair.secagg.round_order import PartyOrder
from fedfair.secagg.pieces import Pieces as SecAggPieces

_Upload = TypeVar("_Upload")


StageInput = bytes | memoryview
"""A stage's input: bytes, or for a claimed sum or a tag set (:data:`~fedfair.runtime.peer.uplink.CLAIMS`,
:data:`~fedfair.runtime.peer.uplink.TAG_SETS`) a read-only view of the buffer it arrived in."""


@dataclass(frozen=True)
class StartJob:
    """A start stage's job (train or evaluate, then encode) and the digest of the model it answers.

    The digest is known from the download before the job runs, so the key stages can bind the session to it.
    """

    run: Callable[[], Work]
    model: str


@dataclass
class Work:
    """What the collaborator contributes to one aggregation, and its secure-aggregation state.

    Under secure aggregation the start stage's job (train or evaluate, then encode) runs
    beside the key stages, which need none of its outcome: until it ends, ``pending`` holds
    it and ``vector`` is None; :meth:`settle` adopts what it produced.
    """

    round: int
    stages: Stages
    vector: np.ndarray | None
    weight: float
    client: Any = None
    """This round's party state, as its kind makes it (:attr:`~fedfair.secagg.round.SecureRound.client`), or as its
    kind's own steps keep it (the bounded sum's: its site with what its verdict record names)."""
    order: PartyOrder | None = None
    """Where this round's client stands in the round's stages, once it began the round."""
    withdrawn: bool = False
    encoded: np.ndarray | None = None
    """The fixed-point encoding of (vector, weight), made before the masking stage needs it."""
    view: SignedView = field(default_factory=SignedView)
    pending: Future[Work] | None = None
    """The start stage's job while it runs: it returns a Work holding the round's contribution."""
    model: str = ""
    """The digest of the model this aggregation answers (``contract.model_digest``; "" for statistics):
    the round's parameters must state the same, and it binds the secure-aggregation session."""
    released: bool = False
    """Whether ``vector`` was let go once its encoding was kept (secure aggregation): the round still has it."""
    stop: VerificationError | None = None
    """Why this process stops once its upload of this stage left (a framed site's dispute is its last word)."""

    def settle(self, wait: bool) -> None:
        """Adopt the start stage's outcome if its job has ended (or, with `wait`, once it ends).

        An exception the job raised is raised here, once, as it would have been had the job
        run in the task's handler; the round then has nothing to contribute.
        """
        job = self.pending
        if job is None or not (wait or job.done()):
            return
        self.pending = None
        outcome = job.result()
        self.vector, self.weight, self.released = outcome.vector, outcome.weight, outcome.released
        self.encoded, self.view = outcome.encoded, outcome.view


@dataclass(frozen=True)
class Participant:
    """This collaborator as the aggregations know it: its identity and its copy of the plan."""

    name: str
    shared: SharedSettings
    parameters: int
    """The model's number of parameters: a training update is this long, plus c."""
    identity_key: EllipticCurvePrivateKey
    credential: bytes
    verify: CredentialVerifier
    """Checks a peer's relayed certificate: against the CA, and against the manifest's pin when there is one."""
    manifest: Manifest | None = None
    """The roster the institutions agreed on out of band; without one the roster is trusted to the CA."""
    folder: Path | None = None
    """The site's own folder (beside its config), where its model chain keeps states too large for memory;
    None: the system's temporary folder."""
    initial: InitialModel | None = field(default=None, repr=False, compare=False)
    """This site's own build of the plan's initial model, round 1's only model (None: no model built yet)."""
    classes: int | None = None
    """The model's K, for the figures of a noised evaluation (None: no model built yet)."""
    ca_certificate: x509.Certificate | None = field(default=None, repr=False, compare=False)
    """The federation's CA, which certificates relayed with a bounded round are checked against (with the manifest)."""
    outcome: OutcomeRecord | None = field(default=None, repr=False, compare=False)
    """This site's outcome record, where the liars a bounded round's verdict record names are kept (None: not kept)."""
    chain: ModelChain = field(init=False, repr=False, compare=False)
    """The models this site verified: every training model and output model it is sent is checked against it."""
    figures: EvaluationFigures = field(init=False, repr=False, compare=False)
    """The figures of the evaluation sums this site verified: the only ones its kept bundle carries."""
    security: SecurityParameters = field(init=False, repr=False, compare=False)
    """The plan's security parameters (checked against the manifest at join): every round's must be these."""

    @property
    def survivor_floor(self) -> int:
        """The fewest survivors this collaborator signs for.

        Every collaborator of the plan under ``dropouts = "none"``; else the manifest's min_round_size, else the
        isolation bound max_colluding + 2, whatever the threshold and the masking graph would allow.
        """
        if not self.shared.secure_aggregation.tolerates_dropouts:
            return self.shared.collaborator_count
        isolating = self.security.isolating
        return max(isolating, self.manifest.min_round_size) if self.manifest is not None else isolating

    def __post_init__(self) -> None:
        # The same peers' certificates come back every round: each is checked in full once, then by
        # its validity window (fedfair.secagg.credentials.RememberedVerifier).
        object.__setattr__(self, "verify", remembered(self.verify))
        object.__setattr__(self, "chain", ModelChain(self.name, self.shared, self.folder, self.initial))
        object.__setattr__(self, "figures", EvaluationFigures(self.name, self.shared, self.folder, self.classes))
        shared = self.shared
        object.__setattr__(self, "security", shared.secure_aggregation.security(shared.collaborator_count))

    def expected(self, work: Work) -> tuple[str, int, EncodingConfig]:
        """The kind, vector length and encoding this aggregation must have (:meth:`aggregation`)."""
        return self.aggregation(work.stages, work.round)

    def aggregation(self, stages: Stages, round_number: int) -> tuple[str, int, EncodingConfig]:
        """The kind, vector length and encoding of round `round_number`'s aggregation over `stages`.

        A training update (2 (d + 1) long with drift correction, its control variates included), the
        evaluation's sums (at the final round with the plan's composition counts), or (round 0 of a plan with a
        [schema]) the table statistics.
        """
        if stages is EVALUATION:
            if self.shared.schema is not None and round_number == STATISTICS_ROUND:
                noised = self.shared.privacy.noised
                dimension = statistics_dimension(self.shared.schema, noised=noised)
                return STATISTICS_KIND, dimension, statistics_encoding(noised)
            # The length, composition counts included, is this plan's: no column name travels in a round.
            return "evaluate", self.shared.evaluation_length(round_number), sums.ENCODING
        dimension = update_dimension(self.parameters, self.shared.training.local.corrects_drift)
        encoding = self.shared.training_encoding(
            self.shared.federation_id, self.shared.collaborator_count, round_number, dimension
        )
        # A noised update is rotated, so its vector is padded to a power of two.
        return "train", encoding.noise.encoded_dimension if encoding.noise else dimension, encoding

    def graph_roster_fits(self, parameters: RoundParameters) -> bool:
        """Whether the masking graph is drawn over the plan's whole roster.

        The manifest's names, sorted (without a manifest, as many names as the plan's collaborators, the round's
        among them).
        """
        roster = parameters.graph_roster
        if self.manifest is not None:
            return roster == canonical_roster(self.manifest.collaborator_names)
        return (
            roster == canonical_roster(roster)
            and len(set(roster)) == self.shared.collaborator_count
            and set(parameters.parties) <= set(roster)
        )

    def check_parameters(self, work: Work, inputs: StageInput) -> RoundParameters:
        """The round's parameters, once checked against what this collaborator's plan implies.

        Raises:
            RefusedError: reason :attr:`Refusal.WITHDRAWN` when a parameter differs from the plan, or (with a
                manifest) the roster names a party the manifest does not list or is below its minimum round
                size (a Sybil roster).
        """
        return self.check_parameters_of(work.round, work.stages, inputs, work.model)

    def check_parameters_of(
        self, round_number: int, stages: Stages, inputs: StageInput, model: str | None = None
    ) -> RoundParameters:
        """:meth:`check_parameters` of round `round_number`'s aggregation over `stages`, answering the model `model`.

        `model` None: a round this site took no part in, which it catches up on
        (:mod:`~fedfair.runtime.collaborator.catch_up`): neither its place in the roster nor the model is checked.
        """
        parameters = RoundParameters.from_bytes(bytes(inputs))  # a few hundred bytes
        kind, dimension, encoding = self.aggregation(stages, round_number)
        problems = [
            what
            for what, wrong in (
                ("kind", parameters.kind != kind),
                ("round", parameters.round != round_number),
                ("secure aggregation", parameters.secure != self.shared.secure_aggregation.enabled),
                ("roster", model is not None and self.name not in parameters.parties),
                ("quorum", len(parameters.parties) < self.shared.quorum.min_collaborators),
                ("dimension", parameters.dimension != dimension),
                ("encoding", parameters.encoding != encoding),
                *((what, True) for what in self.security.differences(parameters.security)),
                ("graph roster", not self.graph_roster_fits(parameters)),
                ("model", model is not None and parameters.model != model),
                ("secure round", parameters.protocol != stages.protocol.name),
            )
            if wrong
        ]
        if not problems and parameters.graph_seed != parameters.implied_graph_seed(self.shared.federation_id, stages):
            problems.append("graph seed")
        if problems:
            raise RefusedError(
                Refusal.WITHDRAWN, f"the round's parameters differ from the plan ({', '.join(problems)})"
            )
        if self.manifest is not None:
            try:
                self.manifest.check_roster(parameters.parties)
            except ManifestError as error:
                raise RefusedError(Refusal.WITHDRAWN, str(error)) from None
        return parameters


def advertise(me: Participant, work: Work, inputs: StageInput) -> bytes:
    """Check the round's parameters (`inputs`) and start this round's client; return its first upload.

    Raises RefusedError (:attr:`Refusal.WITHDRAWN`) when the parameters differ from the plan
    (:meth:`Participant.check_parameters`).
    """
    parameters = me.check_parameters(work, inputs)
    config = parameters.secagg_config(me.shared.federation_id, work.stages)
    protocol = work.stages.protocol
    # No copy of the encoded input is kept for a verified aggregation: the tag step hands the client the words as
    # the record keeps them on disk (:func:`tag`).
    work.client = protocol.client(config, RoundSetup(me.verify), me.name, me.identity_key, me.credential)
    work.order = PartyOrder(protocol.stages(True))
    first = protocol.sum_stages[0]
    return uploaded(take(work, first, partial(first.take_step, work.client, None, not_asked)))


def masked(me: Participant, work: Work, inputs: StageInput) -> bytes | Pieces:
    """The round's contribution: the encoded update, as the kind's contribution stage takes it (masked, or plain).

    Any kind's step at its :attr:`~fedfair.secagg.round.SecureRound.contribution` stage, whose upload message
    travels in pieces (``to_pieces``). Without secure aggregation: the plain update
    (:func:`~fedfair.runtime.transport.chunks.plain_upload`: a training update's values in float32, an evaluation's
    in float64, then the weight) once the parameters check. Raises RefusedError (:attr:`Refusal.WITHDRAWN`) when
    this party did not take the stages before, or its encoding was masked already (a retried stage: the words are
    never masked twice, nor encoded anew).
    """
    if not me.shared.secure_aggregation.enabled:
        assert work.vector is not None  # the process withdraws before any step when it has nothing
        me.check_parameters(work, inputs)
        return plain_upload(work.vector, work.weight, work.stages.plain_values)
    protocol = work.stages.protocol
    spec = protocol.spec(protocol.contribution)
    client = started(work, spec)
    if work.encoded is not None:
        encoded = work.encoded
    elif work.vector is not None:
        encoded = client.config.encoder.encode(work.vector, work.weight)
    else:
        raise RefusedError(Refusal.WITHDRAWN, "this round's encoding was masked already; it is not masked twice")
    work.encoded = None  # masked in place: never reuse it
    message = received(spec, inputs)
    # In pieces: the masked words travel from their own memory, never copied whole into one message.
    upload = take(work, spec, partial(spec.take_step, client, message, lambda: encoded))
    assert isinstance(upload, InPieces)  # a contribution the runtime hands in is a message that travels in pieces
    return upload.to_pieces()


def client_step(spec: AnyStage) -> Step:
    """The step of a stage that asks nothing of the runtime: the round's client takes the stage's input."""

    def step(me: Participant, work: Work, inputs: StageInput) -> bytes:
        """The client's upload for the stage's input (`inputs`).

        Raises RefusedError (:attr:`Refusal.WITHDRAWN`) when this party did not take the stages before it.
        """
        client = started(work, spec)
        return uploaded(take(work, spec, partial(spec.take_step, client, received(spec, inputs), not_asked)))

    return step


Step = Callable[[Participant, Work, StageInput], bytes | Pieces]

KindSteps = Callable[[SecureRound], dict[AnyStage, Step]]
"""A kind of round's own collaborator steps: for each stage where the runtime adds to its client's step, the step."""

KindEncoding = Callable[[np.ndarray | SecAggPieces, str, SharedSettings], np.ndarray]
"""How a kind's site encodes its training update itself: encoding(w times delta, the site's name, the plan) -> the
words its contribution stage takes, where the kind does not take the plan's masked encoding."""

KIND_STEPS: dict[str, KindSteps] = {}
"""Each kind of round (:attr:`SecureRound.name`) -> its own collaborator steps, as the kinds register them."""

KIND_ENCODINGS: dict[str, KindEncoding] = {}
"""Each kind of round that encodes its sites' training updates itself -> its encoding (the others: the plan's)."""


def register_kind_steps(kind: str, steps: KindSteps, encoding: KindEncoding | None = None) -> None:
    """Plug a kind of round's own collaborator steps in: every other stage of it runs its client's step.

    With `encoding`, a training round of the kind contributes each site's update so encoded (:data:`KindEncoding`),
    unnoised, where other kinds take the plan's masked encoding.

    Raises:
        ConfigError: `kind` registered its steps already.
    """
    if kind in KIND_STEPS:
        raise ConfigError(f"the round kind {kind!r} registered its collaborator steps already")
    KIND_STEPS[kind] = steps
    if encoding is not None:
        KIND_ENCODINGS[kind] = encoding


def started(work: Work, spec: AnyStage) -> Any:
    """The round's client, once this party began the round; else it cannot take `spec`'s stage.

    Raises:
        RefusedError: reason :attr:`Refusal.WITHDRAWN`, saying what this party missed (:attr:`StageSpec.unready`).
    """
    if work.client is None:
        raise RefusedError(Refusal.WITHDRAWN, spec.unready)
    return work.client


def take(work: Work, spec: AnyStage, step: Callable[[], _Upload]) -> _Upload:
    """Run `step`, this party's step of `spec`, in the round's order (:class:`~fedfair.secagg.round_order.PartyOrder`).

    Raises:
        RefusedError: reason :attr:`Refusal.WITHDRAWN` where this party did not begin the round
            (:attr:`StageSpec.unready`).
        ProtocolError: `spec` is out of the round's order.
    """
    if work.order is None:
        raise RefusedError(Refusal.WITHDRAWN, spec.unready)
    return work.order.take(spec, step)


def received(spec: AnyStage, inputs: StageInput) -> Any:
    """The stage's input message, parsed (a claimed sum straight from the buffer it arrived in)."""
    assert spec.received is not None  # only the first stage's input is the runner's own
    return spec.received(inputs)


def uploaded(upload: object) -> bytes:
    """The bytes of a party's upload: its step's outcome in a stage whose parties upload a message."""
    assert isinstance(upload, Message)  # such a stage's step makes a message
    return bytes(upload.to_bytes())


def not_asked() -> np.ndarray:
    """The encoded input, which only the masking stage asks for."""
    raise ProtocolError("only the masking stage takes this party's encoded input")


def kind_steps(protocol: SecureRound) -> dict[AnyStage, Step]:
    """The steps of a round of any kind where the runtime adds to its client's: what a kind's own steps extend.

    The first stage checks the round's parameters and starts the kind's client (:func:`advertise`), and the
    contribution stage hands it the encoded input (:func:`masked`); every other stage runs its client's step
    (:func:`client_step`) unless the kind registered its own (:func:`register_kind_steps`).
    """
    return {protocol.sum_stages[0]: advertise, protocol.spec(protocol.contribution): masked}
