"""The auditor's process: connect as the plan's auditor, follow the task stream, verify each bounded sum.

:class:`AuditorProcess` is a :class:`~fedfair.runtime.peer.connection.Follower` of the shared peer's
:class:`~fedfair.runtime.peer.connection.Connection` (dial over mutual TLS with its auditor certificate,
back-off, idle watchdog, the task loop) and uploads through the peer's
:class:`~fedfair.runtime.peer.uplink.Uplink`, as a collaborator does: it only supplies what a task computes. Before it dials it
checks what is local (:func:`~fedfair.runtime.auditor.config.check_auditor_identity`); on the plan it fetches, that
the plan is its manifest's and its training kind has an auditor, which it names; then, round after round, it takes
that kind's auditor stages with the steps the kind registered (:mod:`fedfair.runtime.auditor.steps`; the bounded
sum's end with its tags of its total under the verdict record), until the federation finishes.

Why: docs/security.md, "Bounded inputs (two verifiers)".
"""

from __future__ import annotations

import logging
import threading

import grpc

from fedfair.core.errors import (
    ConfigError,
    FailureError,
    IdentityError,
    ProtocolError,
    WireError,
)
from fedfair.runtime.auditor.config import ROLE, AuditorConfig, check_auditor_identity
from fedfair.runtime.auditor import kinds as kinds  # registers the built-in kinds' auditors
from fedfair.runtime.auditor.steps import AUDITOR_STEPS, AuditorSteps
from fedfair.runtime.auditor.totals import check_kept_state
from fedfair.runtime.peer.connection import Connection, get_plan, plan_change
from fedfair.runtime.peer.retries import RETRYABLE, Backoff, RetryPolicy, Target
from fedfair.runtime.peer.uplink import Uplink
from fedfair.runtime.failures import plan_mismatch
from fedfair.runtime.manifest_plan import check_shared_settings
from fedfair.runtime.plan.aggregator_plan import SharedSettings, json_object, load_shared_settings
from fedfair.runtime.plan.input_bound import TWO_VERIFIERS, prepare_verification
from fedfair.runtime.transport import pb, pb_grpc

logger = logging.getLogger("fedfair.auditor")


class AuditorProcess:
    """One auditor institution's process: the second verifier of every bounded sum of the federation."""

    def __init__(
        self, config: AuditorConfig, *, retry: RetryPolicy | None = None, started: float | None = None
    ) -> None:
        """Check everything local before any connection; a ConfigError names the file and the fix.

        `retry` replaces the config's [retry] (tests shorten it); `started` (time.monotonic()) is when the
        operator's wait began, the clock of [retry] start_wait_seconds as a collaborator's (default: the first dial).
        """
        self.config = config
        self.identity = check_auditor_identity(config)
        check_kept_state(config.folder)
        stop = threading.Event()
        target = Target(config.aggregator, config.certificates, config.aggregator_name)
        self.backoff = Backoff(retry or config.retry, config.name, stop, target, config.name, role=ROLE)
        self.backoff.started = started
        self.connection = Connection(config, self.backoff, stop, self, role=ROLE)
        self.uplink = Uplink()
        self._shared: SharedSettings | None = None
        self._plan_digest = ""
        self._rounds: AuditorSteps | None = None

    # ------------------------------------------------------------ lifecycle: the connection's

    def run(self) -> int:
        """Connect and verify every bounded sum until FINISHED; the exit status (0)."""
        return self.connection.run()

    def stop(self) -> None:
        """Ask `run` to return (from another thread)."""
        self.connection.stop()

    # ------------------------------------------------------------ the Follower

    @property
    def shared(self) -> SharedSettings:
        """The plan's shared settings, once :meth:`setup` checked them."""
        assert self._shared is not None, "the plan is fetched (setup) before this is asked"
        return self._shared

    @property
    def plan_digest(self) -> str:
        """The digest of the plan the auditor joined under."""
        return self._plan_digest

    @property
    def rounds(self) -> AuditorSteps:
        """What the auditor computes, round by round (once :meth:`setup` ran)."""
        assert self._rounds is not None, "the plan is fetched (setup) before any task"
        return self._rounds

    def setup(self, stub: pb_grpc.FederationStub) -> None:
        """Fetch the plan; refuse it unless it is the manifest's and names this auditor for its input bound.

        Raises:
            PermanentFailureError: ``plan-mismatch`` naming what does not fit.
        """
        reply = self.backoff.call("fetching the plan", lambda: get_plan(stub, ROLE, self.config.aggregator))
        try:
            served = json_object(reply.settings, "the aggregator's plan")
            shared = load_shared_settings(reply.settings)
            check_shared_settings(self.config.manifest, shared, served)
        except ConfigError as error:
            raise plan_mismatch(ROLE, error) from None
        secure = shared.secure_aggregation
        make = AUDITOR_STEPS.get(secure.training_kind) if secure.enabled else None
        if make is None or secure.auditor != self.config.name:
            said = "declares no input bound" if secure.auditor is None else f"names {secure.auditor!r} as its auditor"
            raise plan_mismatch(
                ROLE,
                f"it {said}, not {self.config.name!r}; an auditor verifies only for a plan that names it "
                f'([secure_aggregation] input_bound = "{TWO_VERIFIERS}", auditor = "{self.config.name}")',
            )
        self._shared, self._plan_digest = shared, reply.plan_digest
        self._rounds = make(self.config, self.identity, shared)
        prepare_verification(secure, self.config.name)

    def plan_change(self, reply: pb.PlanReply) -> FailureError | None:
        """Why the auditor does not take the plan in `reply` (another digest than it joined under), or None."""
        return plan_change(ROLE, self.config.manifest, self._plan_digest, reply)

    def say_joined(self) -> None:
        """Log that the aggregator took the auditor's task stream."""
        logger.info(
            "%s: joined federation %s as its auditor: the second verifier of every site's input bound",
            self.config.name,
            self.shared.federation_id,
        )

    def handle(self, stub: pb_grpc.FederationStub, task: pb.Task) -> bool:
        """Carry out one task: an auditor stage's step and upload; False if an RPC of it failed."""
        binding = task.binding
        if task.action == pb.ACTION_ABORTED:
            self.rounds.leave(binding.round)
            return True
        try:
            inputs = self.uplink.input(stub, task, self.rounds.input_limit(binding))
            try:
                with self.connection.watchdog.working():  # verifying: the aggregator waits for the auditor
                    payload = self.rounds.step(binding, inputs)
            except (ConfigError, IdentityError, ProtocolError, WireError) as error:
                self.connection.warn_withdrawal(self.config.name, binding, error)
                self.rounds.leave(binding.round)
                self.uplink.submit(stub, binding, b"")
                return True
            self.uplink.submit(stub, binding, payload)
        except WireError as error:
            self.connection.warn(
                "malformed messages",
                "%s: round %d %s: the aggregator sent a malformed message (%s); leaving the round",
                self.config.name,
                binding.round,
                self.connection.stage_name(binding),
                error,
            )
            self.rounds.leave(binding.round)
            return False
        except grpc.RpcError as error:
            return self._failed(binding, error)
        if binding.round in self.rounds.tagged[-1:]:
            logger.info(
                "%s: round %d: every site's proof decided; total sent and tagged", self.config.name, binding.round
            )
        return True

    def _failed(self, binding: pb.Binding, error: grpc.RpcError) -> bool:
        """A failed RPC of a task: stop on a refusal of this auditor, keep the round's state on a lost aggregator."""
        if self.connection.watchdog.expired is not None:
            raise self.connection.watchdog.expired from None
        code = error.code()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            raise self.backoff.classify(error, "verifying") from None
        if code not in RETRYABLE:
            self.connection.warn(
                "failed stages",
                "%s: round %d %s: the aggregator refused or closed the stage (%s); leaving the round",
                self.config.name,
                binding.round,
                self.connection.stage_name(binding),
                code.name,
            )
            self.rounds.leave(binding.round)
        return False

    def finish(self, stub: pb_grpc.FederationStub, task: pb.Task) -> int:
        """At FINISHED: say how many rounds the auditor verified; the exit status (0)."""
        verified = self.rounds.verified
        logger.info(
            "%s: federation %s finished; the auditor verified %d round(s)%s",
            self.config.name,
            self.shared.federation_id,
            len(verified),
            f" ({', '.join(map(str, verified))})" if verified else "",
        )
        return 0
