"""Errors a user can act on: every exception class fedfair raises on purpose is defined here.

Every error raised for bad input names the problem and the fix in one line; the CLI catches
:class:`FedfairError`, prints that line and exits with status 2. One concept is one class:
where it has several causes, the class carries a ``reason`` (an enum) that handlers and tests
match on, so no two classes name the same thing.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Mapping
from dataclasses import dataclass

DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The ``OSError`` numbers that mean the disk (or the user's quota on it) is full: the CLI names them (status
2), and a log file stops taking lines rather than printing a traceback for each."""


class FedfairError(Exception):
    """Base class of every error fedfair raises on purpose."""


class ConfigError(FedfairError, ValueError):
    """A setting, flag, plan entry or input file is invalid; the message says how to fix it."""


# ---------------------------------------------------------------- inputs and files


class ManifestError(ConfigError):
    """A plan, a round's roster or a certificate disagrees with the manifest; the message names what and who."""


class CertificateError(ConfigError):
    """A certificate or signing request fails a check (wrong CA, expired, wrong role, bad key)."""


class FactoryNotAllowedError(ConfigError):
    """A model factory this party's own configuration does not allow: it is never imported."""


class IdentityError(FedfairError):
    """A credential, public key or signature does not check out."""


class FetchError(FedfairError):
    """A dataset file could not be obtained, or does not match its pinned SHA-256."""


class ReferenceSolverError(FedfairError):
    """The centralized solver did not converge."""


# ---------------------------------------------------------------- training and aggregation


class AggregateError(FedfairError):
    """An aggregate the server must not apply (empty, non-finite)."""


class BudgetReason(enum.Enum):
    """Why a privacy budget stops a contribution."""

    LEARNER_SPENT = "the private learner's next round would pass its budget: it stops contributing for good"
    ANSWER_REFUSED = "this noised answer would pass the institution's budget: it is not sent, nothing is charged"


class PrivacyBudgetError(ConfigError):
    """A contribution would spend more privacy than its budget allows; `reason` says whose budget."""

    def __init__(self, reason: BudgetReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class QuorumReason(enum.Enum):
    """Why a federation has too few collaborators to go on."""

    LOST = "too few collaborators are still contributing"
    NOT_REACHED = "too few collaborators connected in time (the round timeout, or --startup-timeout before the first)"


class QuorumError(FedfairError):
    """Too few collaborators to go on; `reason` says whether they stopped contributing or never connected."""

    def __init__(self, reason: QuorumReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class RoundAbortedError(FedfairError):
    """The round could not finish (too few survivors, a failed decode check); the model is unchanged.

    culprits: collaborators the protocol proved misbehaved in this round, with why (even a
    void round names who voided it).
    """

    def __init__(self, message: str, culprits: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.culprits: dict[str, str] = dict(culprits or {})


class StatisticsReason(enum.Enum):
    """Why the statistics aggregation before round 1 (plans with a [schema]) gave no encoder."""

    ABORTED = "too few parties answered, or some misbehaved: a later run of it may heal"
    NO_ENCODER = "its sum gives no encoder: the same sites would give the same sum"


class StatisticsError(FedfairError):
    """The statistics aggregation gave no encoder; `culprits` (name -> why) are those the protocol named."""

    def __init__(self, reason: StatisticsReason, message: str, culprits: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.culprits: dict[str, str] = dict(culprits or {})


# ---------------------------------------------------------------- messages and refusals


class WireError(FedfairError):
    """A message on the wire is malformed, oversized or inconsistent with the ones before it.

    Its text is detailed (sizes, limits) and meant for the local log, never for the sender.
    """


class Refusal(enum.Enum):
    """Why a message, an upload or a contribution is refused.

    The aggregator's refusals reach the caller as a generic gRPC status (the transport maps each
    reason to its code) that never names a participant; a collaborator's end its part in a round.
    """

    NOT_EXPECTED = "not expected for this federation, round and stage (a replay, or a stage not open)"
    LATE = "an upload for a stage that closed while it still awaited this peer (usual: it had enough answers)"
    NOT_PERMITTED = "the caller's certificate is not admitted"
    OVER_LIMIT = "the caller passed a limit on its requests (running at once, or status reports per round)"
    ALREADY_CONNECTED = "another connection holds an active stream of this collaborator's name"
    INVALID_UPLOAD = "an upload reached the open stage but its content is invalid (the handler refused it)"
    WITHDRAWN = "this collaborator does not take part in the rest of the round (it withdraws)"
    INPUT_BOUND = "this input may not be contributed: an older round, or one already answered otherwise"


class RefusedError(FedfairError):
    """A refused message, upload or contribution; `reason` says which refusal, the message what the party hears.

    stage: for a :attr:`Refusal.LATE` upload, the stage it named (for the aggregator's own log).
    """

    def __init__(self, reason: Refusal, message: str, *, stage: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.stage = stage


@dataclass(frozen=True)
class FailureClass:
    """One kind of collaborator failure: its id, whether retrying can help, what it means and how to fix it.

    `meaning` and `fix` are templates: the ``{field}`` placeholders are filled with the
    facts of one occurrence (an address, a name, a path), which the docs show as is.
    """

    id: str
    transient: bool
    meaning: str
    fix: str
    waits: bool = False
    """A permanent class that the collaborator still waits out within [retry] max_wait_seconds, because
    the other side may undo it (an aggregator going back to the plan this collaborator holds)."""

    def message(self, **facts: object) -> str:
        """The operator's line for one occurrence: ``id: meaning. Fix: fix``."""
        return f"{self.id}: {self.meaning.format(**facts)}. Fix: {self.fix.format(**facts)}"


class FailureError(FedfairError):
    """A collaborator failure of one class of the runbook (`failure`); the message is its line for this occurrence."""

    def __init__(self, failure: FailureClass, **facts: object) -> None:
        super().__init__(failure.message(**facts))
        self.failure = failure


class PermanentFailureError(FailureError, ConfigError):
    """A failure that waiting cannot heal: the collaborator stops with the cause and the fix."""


# ---------------------------------------------------------------- secure aggregation


class ProtocolError(FedfairError):
    """A secure-aggregation message is malformed, out of order, duplicated or inconsistent with the round.

    The receiving state machine refused it and its own state did not change; the runtime drops the
    message (and, if it came from a party, treats that party as silent). Bad configuration is a
    ConfigError instead.
    """


class AuthenticationError(ProtocolError):
    """A signature, credential or encrypted share fails to verify (forged or swapped key)."""


class StaleMessageError(ProtocolError):
    """A message belongs to another federation, round, stage or session (a replay or a late message)."""


class ThresholdError(ProtocolError):
    """Fewer parties than the threshold t remain, so the round is aborted without revealing anything."""


class UnmaskRefusedError(ProtocolError):
    """A request would reveal both kinds of share of one party, or contradicts what this party saw or signed."""


class SumOutOfRangeError(ProtocolError):
    """The unmasked sum is impossible for honest inputs (a weight or coordinate beyond the encoding's bounds).

    Some contributor encoded more than the encoding allows; the round is void and nothing may be applied.
    """


class VerifyReason(enum.Enum):
    """Why a party refused a round's aggregate (:class:`VerificationError`)."""

    FORGED = "the aggregate is not the sum of the survivors' inputs"
    MISSING_TAG = "a survivor's tag is missing, so the aggregate cannot be verified"
    BAD_TAG = "a survivor's tag is not signed by it over this aggregate"
    MALFORMED = "the aggregate or its tags do not fit the round"
    EQUIVOCATED = "the aggregator showed this party two different aggregates for one round"
    NEXT_MODEL = "the model sent is not the plan's server step applied to the sums this party verified"
    INITIAL_MODEL = "the model sent for round 1 is not the plan's initial model, built from its seed and architecture"
    OUT_OF_BOUNDS = "the model sent is made of a verified sum that breaks the plan's bounds (clip box, update_norm)"
    BELOW_FLOOR = "the aggregate covers fewer inputs than the plan's threshold, so it would reveal too few sites' sum"
    FRAMED = "a verifier (aggregator or auditor) signed a false message that left a site out of the sum as a liar"


class VerificationError(ProtocolError):
    """A party refused the aggregate it was given: it could not verify it as the sum of the signed survivors' inputs.

    ``round`` names the round, ``reason`` (a :class:`VerifyReason`) the cause and ``detail`` what was seen; nothing of
    the round may be applied.
    """

    def __init__(self, round_number: int, reason: VerifyReason, detail: str) -> None:
        super().__init__(f"round {round_number}: aggregate refused ({reason.name}): {reason.value}; {detail}")
        self.round = round_number
        self.reason = reason
        self.detail = detail


class VoidableRoundError(FedfairError):
    """A missed round whose evidence checks, but which what no signature covers may have voided: it is not applied.

    A site catching up takes it as a round not kept (the next round's signed model decides). `round` names the round;
    `accepted` and `liars` are the party ids its record accepts and names liars.
    """

    def __init__(self, round_number: int, accepted: tuple[int, ...], liars: tuple[int, ...], why: str) -> None:
        super().__init__(f"round {round_number}: {why}")
        self.round, self.accepted, self.liars = round_number, accepted, liars


class PrivacyWarning(UserWarning):
    """A secure-aggregation configuration runs but protects less than secure aggregation usually does."""


class UncheckedModelError(RefusedError):
    """A model this site cannot check against the sums it verified: it sits the round out (a withdrawal).

    `round` names the round, the message why it cannot check it.
    """

    def __init__(self, round_number: int, why: str) -> None:
        super().__init__(
            Refusal.WITHDRAWN,
            f"round {round_number}: this site cannot check the model it was sent ({why}); it sits the round out "
            'and trains on no model it did not check (docs/security.md, "Verified aggregation")',
        )
        self.round = round_number
        self.why = why
