"""Who the aggregator's service admits, and at which stages: the plan's collaborators, and its auditor.

Under a training round kind with a second verifier (``[secure_aggregation] input_bound = "two_verifiers"``: the
bounded sum) the plan's auditor (a certificate for the role "auditor", the one the manifest pins for that name)
follows the task stream like a site, but uploads only at the kind's stages that are its own (as the round's
declaration says who uploads in each: :meth:`~fedfair.secagg.round.SecureRound.taken_by` the auditor), and no site
uploads at those that are its alone (the bounded sum's DECIDE is both's). It never takes part as a collaborator: it
downloads no model, reports no status, and counts toward no quorum (the board keeps it apart,
:attr:`~fedfair.runtime.aggregator.board.Board.verifiers`). Each refusal here names the problem to the holder of the
certificate (its own name only), not the generic NOT_PERMITTED of a stranger.

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import grpc

from fedfair import pki
from fedfair.core.errors import ConfigError, Refusal, RefusedError
from fedfair.pki.verification import role_of_certificate
from fedfair.runtime.contract import EVALUATION, TRAINING, Aggregations, Stages
from fedfair.runtime.transport import NOT_PERMITTED, PeerAuthenticator, WireStage, peer_certificate
from fedfair.secagg.round import Uploaders

NOT_THE_AUDITOR = (
    "not permitted: {name!r} holds an auditor's certificate, but this federation's plan does not name it as its "
    "auditor ([secure_aggregation] auditor); an auditor takes part only in the federation whose plan names it"
)
"""What the holder of another auditor's certificate hears (the refusals below say the auditor's stages as the one
kind with an auditor, the bounded sum, words them)."""

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


class Admission:
    """Identify each caller as a collaborator or as the plan's auditor; keep each to its own stages.

    `collaborators` admits the plan's collaborators (their role and pins); `auditor` (None: the plan names none)
    admits the plan's auditor alone, for the role "auditor" and its manifest pin, at the stages of `training` (the
    plan's training round, whose kind has a second verifier) that its kind's declaration says the auditor takes.

    Raises:
        ConfigError: the auditor's authenticator admits other than one name for the role "auditor", or the kind of
            `training` has no auditor.
    """

    def __init__(
        self, collaborators: PeerAuthenticator, auditor: PeerAuthenticator | None = None, training: Stages = TRAINING
    ) -> None:
        if auditor is not None and (auditor.role != "auditor" or len(auditor.allowed_names) != 1):
            raise ConfigError("the auditor's authenticator admits one name, for the role 'auditor'")
        kind = training.protocol
        if auditor is not None and kind.auditor is None:
            raise ConfigError(
                f"the {kind.name} round has no auditor: name a training round kind with a second verifier "
                '([secure_aggregation] input_bound = "two_verifiers"), or no auditor'
            )
        self.collaborators = collaborators
        self.auditor = auditor
        self.auditor_name = None if auditor is None else next(iter(auditor.allowed_names))
        """The plan's auditor ([secure_aggregation] auditor), or None."""
        taken = kind.taken_by(Uploaders.AUDITOR)
        self.auditor_stages = frozenset(training.wire(spec) for spec in taken)
        """The wire stages the auditor uploads to: its training kind's (an evaluation keeps the default kind)."""
        self.auditor_only_stages = frozenset(
            training.wire(spec) for spec in taken if Uploaders.PARTIES not in spec.uploaders
        )
        """The wire stages only the auditor uploads to: no collaborator is admitted there."""
        self._names = Aggregations(training, EVALUATION).name

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
        """Keep `peer` to its own stages: the auditor to :attr:`auditor_stages`, a collaborator to the others.

        A collaborator is refused at :attr:`auditor_only_stages` alone (both upload at the bounded sum's DECIDE).

        Raises:
            RefusedError: NOT_PERMITTED, naming the stage and whose it is.
        """
        if self.is_auditor(peer) and stage not in self.auditor_stages:
            stages = ", ".join(self._names(own) for own in sorted(self.auditor_stages))
            message = AUDITOR_STAGES_ONLY.format(name=peer, stages=stages, stage=self._names(stage))
            raise RefusedError(Refusal.NOT_PERMITTED, message)
        if not self.is_auditor(peer) and self.auditor is not None and stage in self.auditor_only_stages:
            message = THE_AUDITORS_STAGE.format(stage=self._names(stage), name=peer)
            raise RefusedError(Refusal.NOT_PERMITTED, message)

    def check_collaborator(self, peer: str, what: str) -> None:
        """Refuse the auditor a collaborator's call: `what` says what it asked ("downloads no model").

        Raises:
            RefusedError: NOT_PERMITTED, naming what the auditor asked for.
        """
        if self.is_auditor(peer):
            message = NOT_A_COLLABORATOR.format(name=peer, what=what)
            raise RefusedError(Refusal.NOT_PERMITTED, message)
