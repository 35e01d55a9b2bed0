"""What the auditor computes in the bounded sum, round by round: its steps, from the bytes each stage's input holds.

Registered as the bounded sum's auditor (:func:`~fedfair.runtime.auditor.steps.register_auditor_steps`). No I/O here (:mod:`fedfair.runtime.auditor.process` moves the bytes). At AUDITOR_KEY the input is the round's public
parameters as the aggregator states them (:class:`~fedfair.runtime.contract.RoundParameters`): the auditor checks
that they describe a bounded training round of its own plan over the manifest's collaborators, checks every relayed
certificate against the CA and the manifest's pins (:func:`~fedfair.runtime.contract.relayed_keys`), and derives the
round's :class:`~fedfair.secagg.bounded.parameters.BoundedParameters` as every party does (the plan's bound and
weights); its own key there must be its own. Then each later stage the auditor uploads in (its tags at DECIDE last)
parses its input with the stage's ``received`` and makes the upload with its ``step``
(:class:`~fedfair.secagg.bounded.peers.Auditor`). A round whose parameters or inputs do not hold up is left.

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np

from fedfair.core.errors import IdentityError, ProtocolError, VerificationError
from fedfair.runtime.auditor.config import AuditorConfig, AuditorIdentity
from fedfair.runtime.auditor.steps import register_auditor_steps
from fedfair.runtime.auditor.totals import TotalledRound, kept_state
from fedfair.runtime.contract import RoundParameters, relayed_keys, round_setup, training_of
from fedfair.runtime.manifest import pinned_verifier
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.plan.bounded_noise import bounded_noise_mu
from fedfair.runtime.transport import WireStage, pb
from fedfair.secagg.bounded.messages import PUBLIC_LIMIT
from fedfair.secagg.bounded.parameters import round_parameters
from fedfair.secagg.bounded.exchange import AuditorTotal
from fedfair.secagg.bounded.peers import Auditor
from fedfair.secagg.bounded.stages import AUDITOR_STAGES, BOUNDED_ROUND, BoundedStage, record_bytes
from fedfair.secagg.config import SecAggConfig
from fedfair.secagg.round import MESSAGE_OVERHEAD_BYTES, Message, Uploaders
from fedfair.secagg.round_order import PartyOrder

BOUNDED_TRAINING = training_of(BOUNDED_ROUND)
"""A training round under the bounded sum: the only kind the auditor verifies."""


@dataclass
class AuditedRound:
    """One round the auditor verifies: its number, its model's digest, its session's config, and the auditor's state."""

    number: int
    model: str
    """The digest of the model the round trains (its parameters'): two runs of it on the same model take the same
    inputs."""
    config: SecAggConfig
    auditor: Auditor
    order: PartyOrder = field(default_factory=lambda: PartyOrder(BOUNDED_ROUND.taken_by(Uploaders.AUDITOR)))
    """Where the auditor stands in the stages it uploads in: a stage's input out of their order is refused."""


class AuditorRounds:
    """The auditor's steps of each round's bounded sum, under the plan it joined (`shared`)."""

    def __init__(self, config: AuditorConfig, identity: AuditorIdentity, shared: SharedSettings) -> None:
        self.config = config
        self.identity = identity
        self.shared = shared
        self.security = shared.secure_aggregation.security(shared.collaborator_count)
        """The plan's security parameters (checked against the manifest at setup): every round's must be these."""
        self.current: AuditedRound | None = None
        """The round in progress (None before its AUDITOR_KEY, and once it was left)."""
        self.verified: list[int] = []
        """The rounds whose TOTAL the auditor uploaded: it decided every site of them."""
        self.tagged: list[int] = []
        """The rounds whose total the auditor tagged under their verdict record (DECIDE): its last upload of each."""
        self.totals, self.noise_keys = kept_state(config.folder, fresh_each_round=shared.privacy.distributed)
        """The sites each set of inputs was first totalled over, across restarts: the same inputs (a round run again,
        a later round on a void round's model) are totalled over the same sites or not at all; and what each round's
        noise is drawn from: a round run again carries the same noise."""

    def input_limit(self, binding: pb.Binding) -> int:
        """The most bytes the input of `binding`'s stage may hold: the parameters' limit, then the round's largest.

        The round's largest input is the verdict record (DECIDE) or a relayed upload.
        """
        current = self.current
        if (
            WireStage.of(binding) == BOUNDED_TRAINING.wire(BOUNDED_ROUND.spec(BoundedStage.AUDITOR_KEY))
            or current is None
        ):
            return PUBLIC_LIMIT
        config = current.config
        record = MESSAGE_OVERHEAD_BYTES + record_bytes(config.size, config.dimension)
        return max(record, *(spec.upload_bytes(config) for spec in BOUNDED_ROUND.sum_stages))

    def step(self, binding: pb.Binding, inputs: bytes) -> bytes:
        """The auditor's upload for the stage `binding` names, from that stage's input.

        Raises:
            ConfigError, IdentityError: the round's parameters do not fit this plan and manifest (AUDITOR_KEY).
            ProtocolError (AuthenticationError): the stage is none of the auditor's, its input is malformed or does
                not hold up, no round was begun, or (BELOW_FLOOR) the sites it would total are fewer than the plan's
                threshold.
        """
        stage = WireStage.of(binding)
        spec = BOUNDED_TRAINING.specs.get(stage)
        if spec is None or spec.stage not in AUDITOR_STAGES:
            raise ProtocolError(f"{BOUNDED_TRAINING.name(stage)} is not a stage the auditor uploads in")
        if spec.stage is BoundedStage.AUDITOR_KEY:
            self.current = self._begin(binding.round, inputs)
            received = None
        else:
            if self.current is None or self.current.number != binding.round:
                raise ProtocolError(f"round {binding.round}'s auditor never made its round key: {spec.unready}")
            assert spec.received is not None  # every auditor stage but the first carries the aggregator's message
            received = spec.received(inputs)
        try:
            message = self.current.order.take(spec, partial(spec.take_step, self.current.auditor, received, _not_asked))
        except VerificationError as error:
            # The protocol names its session's round; the line that withdraws names the round itself.
            raise ProtocolError(f"{error.reason.name}: {error.detail}") from None
        assert isinstance(message, Message)  # the auditor uploads a message in each of its stages
        if spec.stage is BoundedStage.TOTAL:
            assert isinstance(message, AuditorTotal)  # TOTAL's upload
            self._check_inputs_totalled_before(frozenset(map(self.current.config.name_of, message.accepted)))
            self.verified.append(binding.round)
        if spec.stage is BoundedStage.DECIDE:
            self.tagged.append(binding.round)
            self.current = None
        return message.to_bytes()

    def _check_inputs_totalled_before(self, accepted: frozenset[str]) -> None:
        """Withhold a total of inputs totalled before over other sites than their first total (ProtocolError).

        A round the aggregator runs again (it restarted), and a later round on the model a void round left (a site
        lost before its tags), are sent each site's kept input again; two totals of the same inputs over different
        sites would let one site's input be subtracted, as two masked sums over different survivors would. Withheld,
        the round aborts and nothing is learnt. The first total is kept in the auditor's folder
        (:mod:`~fedfair.runtime.auditor.totals`) before it is uploaded, so a restart forgets none.
        """
        assert self.current is not None  # TOTAL is a stage of the current round
        round_number = self.current.number
        first = self.totals.first(TotalledRound(self.shared.federation_id, round_number, self.current.model, accepted))
        if first.sites != accepted:
            self.current = None
            raise ProtocolError(
                f"round {round_number}'s inputs were totalled in round {first.round} over "
                f"{', '.join(sorted(first.sites))}; a total over {', '.join(sorted(accepted)) or 'no site'} of the "
                "same inputs would let the two be subtracted, so this auditor withholds it"
            )

    def leave(self, round_number: int) -> None:
        """Forget round `round_number` (aborted, or left): its keys go with it."""
        if self.current is not None and self.current.number == round_number:
            self.current = None

    def _begin(self, round_number: int, inputs: bytes) -> AuditedRound:
        """AUDITOR_KEY: check the round's parameters, derive the round's parameters as every party does.

        Its threshold and collusion bound must be the plan's, since the floor on the sites a total covers follows from
        them.
        """
        parameters = RoundParameters.from_bytes(inputs)
        expected = (round_number, BOUNDED_TRAINING.kind, BOUNDED_ROUND.name, True)
        stated = (parameters.round, parameters.kind, parameters.protocol, parameters.secure)
        if stated != expected:
            raise ProtocolError(
                f"the round's parameters state round {parameters.round}, {parameters.kind!r}, {parameters.protocol!r}"
                f" (secure: {parameters.secure}); the auditor verifies round {round_number}'s bounded training sum"
            )
        bounds, own = parameters.security, self.security
        if (bounds.threshold, bounds.max_colluding) != (own.threshold, own.max_colluding):
            raise ProtocolError(
                f"the round's parameters state threshold {bounds.threshold} and max_colluding "
                f"{bounds.max_colluding}, the plan {own.threshold} and {own.max_colluding}: the floor on the "
                "sites a total covers follows from them, so the auditor verifies no round under others"
            )
        manifest = self.config.manifest
        strangers = sorted(set(parameters.parties) - manifest.collaborator_names)
        if strangers:
            raise ProtocolError(f"the round's parties {strangers} are not collaborators of the manifest")
        config = parameters.secagg_config(self.shared.federation_id, BOUNDED_TRAINING)
        keys = relayed_keys(parameters, manifest, self.identity.ca_certificate)
        setup = round_setup(
            parameters,
            pinned_verifier(manifest, self.identity.ca_certificate),
            keys,
            self.shared.influence,
            self.shared.batch_fraction,
            aggregator=manifest.aggregator.name,
            auditor=self.config.name,
            noise_mu=bounded_noise_mu(self.shared, self.shared.collaborator_count, parameters.dimension),
        )
        bounded = round_parameters(config, setup)
        if bounded.auditor_key.public_numbers() != self.identity.key.public_key().public_numbers():
            raise IdentityError("the round relays another key for this auditor than its own certificate's")
        noise_key = self.noise_keys.key(self.shared.federation_id, round_number, parameters.model)
        auditor = Auditor(bounded, self.identity.key, noise_key)
        return AuditedRound(round_number, parameters.model, config, auditor)


def _not_asked() -> np.ndarray:
    """A site's encoded input, which no auditor stage takes."""
    raise ProtocolError("the auditor has no encoded input: only a site's SHARE takes one")


register_auditor_steps(BOUNDED_ROUND.name, AuditorRounds)
