"""How the aggregator takes a secure-aggregation stage's upload: parse it, check its sender, hand it on.

What parses a stage's upload and what receives it are the stage's (:class:`~fedfair.secagg.round.StageSpec`);
here is what every stage shares: identity is the uploader's certificate, so a message naming another party is
refused before the server sees it. The round driver (`driver.py`) runs the stages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.aggregator.stages import UploadHandler
from fedfair.secagg.round import PartyNames


@runtime_checkable
class SignedMessage(Protocol):
    """A secure-aggregation upload: it names its sender's party id (a claim, checked here)."""

    @property
    def sender(self) -> int:
        """The party id the message claims to come from."""


@dataclass(frozen=True)
class SecureUpload:
    """How the aggregator takes one secure-aggregation stage's upload.

    Parse it, check its sender against the certificate's party, hand it to the secure-aggregation server's step.

    parse: the stage's parser of an upload (:attr:`~fedfair.secagg.round.AnyStage.upload`): a :class:`SignedMessage`.
    receive: the server's step for what `parse` made (:meth:`~fedfair.secagg.round.AnyStage.hooks`).
    """

    parse: Callable[[bytes], object]
    receive: Callable[[object], None]

    def handler(self, names: PartyNames) -> UploadHandler:
        """The stage's upload handler in a round whose party ids `names` gives (its auditor's included).

        Raises:
            RefusedError: reason :attr:`Refusal.INVALID_UPLOAD` when the message names another
                party than the uploader's certificate (`names.party_id`).
        """

        def absorb(peer: str, payload: bytes) -> None:
            message = self.parse(payload)
            assert isinstance(message, SignedMessage)  # every stage's upload names its sender
            # Identity is the certificate's: a message naming another party is refused outright.
            if message.sender != names.party_id(peer):
                raise RefusedError(Refusal.INVALID_UPLOAD, "the message names another party than the certificate")
            self.receive(message)

        return absorb
