"""Who the aggregator's service admits, and at which stages: the plan's collaborators, and its auditor.

Under ``[secure_aggregation] input_bound = "two_verifiers"`` the plan's auditor (a certificate for the role "auditor",
the one the manifest pins for that name) follows the task stream like a site, but uploads only at the bounded sum's
stages that are its own (:data:`~fedfair.secagg.bounded.stages.AUDITOR_STAGES`, as the round's declaration says who
uploads in each), and no site uploads at those that are its alone (DECIDE is both's). It never
takes part as a collaborator: it downloads no model, reports no status, and counts toward no quorum (the board keeps
it apart, :attr:`~fedfair.runtime.aggregator.board.Board.verifiers`). Each refusal here names the problem to the
holder of the certificate (its own name only), not the generic NOT_PERMITTED of a stranger.

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import grpc

from fedfair import pki
from fedfair.core.errors import ConfigError, Refusal, RefusedError
from fedfair.pki.verification import role_of_certificate
from fedfair.runtime.contract import BOUNDED_TRAINING, EVALUATION, Aggregations
from fedfair.runtime.transport import NOT_PERMITTED, PeerAuthenticator, WireStage, peer_certificate
from fedfair.secagg.bounded.stages import AUDITOR_ONLY_STAGES, AUDITOR_STAGES, BOUNDED_ROUND

AUDITOR_WIRE_STAGES = frozenset(BOUNDED_TRAINING.wire(BOUNDED_ROUND.spec(stage)) for stage in AUDITOR_STAGES)
"""The wire stages the auditor uploads to: a training round's bounded sum's (an evaluation keeps the masked round)."""

AUDITOR_ONLY_WIRE_STAGES = frozenset(BOUNDED_TRAINING.wire(BOUNDED_ROUND.spec(stage)) for stage in AUDITOR_ONLY_STAGES)
"""The wire stages only the auditor uploads to: no collaborator is admitted there."""

NOT_THE_AUDITOR = (
    "not permitted: {name!r} holds an auditor's certificate, but this federation's plan does not name it as its "
    "auditor ([secure_aggregation] auditor); an auditor takes part only in the federation whose plan names it"
)
"""What the holder of another auditor's certificate hears."""

AUDITOR_STAGES_ONLY = (
    "not permitted: the auditor {name!r} uploads and fetches only at the bounded sum's auditor stages "
    "({stages}), not at {stage}"
)
"""What the auditor hears at any other stage."""

NOT_A_COLLABORATOR = (
    "not permitted: the auditor {name!r} is no collaborator: it {what}; it takes part only at the bounded sum's "
    "auditor stages"
)
"""What the auditor hears when it calls as a collaborator would (a model download, a status report)."""

THE_AUDITORS_STAGE = (
    "not permitted: {stage} is the auditor's stage of the bounded sum; {name!r} is a collaborator, which uploads "
    "and fetches only at the sites' stages"
)
"""What a collaborator hears at one of the auditor's stages."""


_NAMES = Aggregations(BOUNDED_TRAINING, EVALUATION).name
"""What a refusal calls a stage of a federation with an auditor (one whose training rounds are bounded sums)."""


def _stage_names(stages: frozenset[WireStage]) -> str:
    return ", ".join(_NAMES(stage) for stage in sorted(stages))


class Admission:
    """Identify each caller as a collaborator or as the plan's auditor; keep each to its own stages.

    `collaborators` admits the plan's collaborators (their role and pins); `auditor` (None: the plan names none)
    admits the plan's auditor alone, for the role "auditor" and its manifest pin.
    """

    def __init__(self, collaborators: PeerAuthenticator, auditor: PeerAuthenticator | None = None) -> None:
        if auditor is not None and (auditor.role != "auditor" or len(auditor.allowed_names) != 1):
            raise ConfigError("the auditor's authenticator admits one name, for the role 'auditor'")
        self.collaborators = collaborators
        self.auditor = auditor
        self.auditor_name = None if auditor is None else next(iter(auditor.allowed_names))
        """The plan's auditor ([secure_aggregation] auditor), or None."""

    def identify(self, context: grpc.ServicerContext) -> str:
        """The caller's name: a collaborator's, or the plan's auditor's.

        Raises:
            RefusedError: NOT_PERMITTED; naming the problem for an auditor's certificate the plan does not name,
                generic otherwise (a stranger learns nothing).
        """
        try:
            return self.collaborators.identify(context)
        except RefusedError:
            certificate = peer_certificate(context)
            if certificate is None or role_of_certificate(certificate) != "auditor":
                raise
        try:
            name = pki.name_from_certificate(certificate)
        except ConfigError:
            raise RefusedError(Refusal.NOT_PERMITTED, NOT_PERMITTED) from None
        if self.auditor is not None and name == self.auditor_name:
            return self.auditor.identify(context)  # the CA, the validity window and the manifest's pin
        raise RefusedError(Refusal.NOT_PERMITTED, NOT_THE_AUDITOR.format(name=name))

    def is_auditor(self, peer: str) -> bool:
        """Whether `peer` (an identified caller) is the plan's auditor."""
        return peer == self.auditor_name

    def check_stage(self, peer: str, stage: WireStage) -> None:
        """Keep `peer` to its own stages: the auditor to :data:`AUDITOR_WIRE_STAGES`, a collaborator to the others.

        A collaborator is refused at :data:`AUDITOR_ONLY_WIRE_STAGES` alone (both upload at DECIDE).

        Raises:
            RefusedError: NOT_PERMITTED, naming the stage and whose it is.
        """
        if self.is_auditor(peer) and stage not in AUDITOR_WIRE_STAGES:
            stages = _stage_names(AUDITOR_WIRE_STAGES)
            message = AUDITOR_STAGES_ONLY.format(name=peer, stages=stages, stage=_NAMES(stage))
            raise RefusedError(Refusal.NOT_PERMITTED, message)
        if not self.is_auditor(peer) and self.auditor is not None and stage in AUDITOR_ONLY_WIRE_STAGES:
            raise RefusedError(Refusal.NOT_PERMITTED, THE_AUDITORS_STAGE.format(stage=_NAMES(stage), name=peer))

    def check_collaborator(self, peer: str, what: str) -> None:
        """Refuse the auditor a collaborator's call: `what` says what it asked ("downloads no model").

        Raises:
            RefusedError: NOT_PERMITTED, naming what the auditor asked for.
        """
        if self.is_auditor(peer):
            raise RefusedError(Refusal.NOT_PERMITTED, NOT_A_COLLABORATOR.format(name=peer, what=what))
