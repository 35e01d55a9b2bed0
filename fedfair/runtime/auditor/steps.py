"""What the auditor does in a round of a kind with a second verifier, and the registry each such kind plugs into.

A kind whose round has an auditor (:attr:`~fedfair.secagg.round.SecureRound.auditor`) registers its auditor's steps
by name (:func:`register_auditor_steps`), as it registers its round and its collaborator steps; the auditor's
process (:mod:`fedfair.runtime.auditor.process`) looks up the plan's training kind and names none. The built-in
kinds' are in :mod:`fedfair.runtime.auditor.kinds`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from fedfair.core.errors import ConfigError
from fedfair.runtime.auditor.config import AuditorConfig, AuditorIdentity
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.transport import pb


class AuditorSteps(Protocol):
    """The auditor's steps of each round of its kind, from the bytes each stage's input holds (no I/O)."""

    @property
    def verified(self) -> list[int]:
        """The rounds whose sum the auditor verified (its total uploaded)."""

    @property
    def tagged(self) -> list[int]:
        """The rounds whose last upload the auditor made: it has nothing more to do in them."""

    def input_limit(self, binding: pb.Binding) -> int:
        """The most bytes the input of `binding`'s stage may hold."""

    def step(self, binding: pb.Binding, inputs: bytes) -> bytes:
        """The auditor's upload for the stage `binding` names, from that stage's input.

        Raises:
            ConfigError, IdentityError, ProtocolError: the round's parameters or the stage's input do not hold up,
                or the stage is none of the auditor's: the auditor leaves the round.
        """

    def leave(self, round_number: int) -> None:
        """Forget round `round_number` (aborted, or left)."""


AuditorMaker = Callable[[AuditorConfig, AuditorIdentity, SharedSettings], AuditorSteps]
"""Makes an auditor's steps for the plan it joined (its config, its identity, the plan's shared settings)."""

AUDITOR_STEPS: dict[str, AuditorMaker] = {}
"""Each kind of round with a second verifier (:attr:`~fedfair.secagg.round.SecureRound.name`) -> its auditor's steps."""


def register_auditor_steps(kind: str, make: AuditorMaker) -> None:
    """Plug a kind's auditor in: an auditor joins a plan whose training kind is `kind` with the steps `make` makes.

    Raises:
        ConfigError: `kind` registered its auditor already.
    """
    if kind in AUDITOR_STEPS:
        raise ConfigError(f"the round kind {kind!r} registered its auditor's steps already")
    AUDITOR_STEPS[kind] = make
