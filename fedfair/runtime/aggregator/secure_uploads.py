"""How the aggregator takes each secure-aggregation stage's upload: parse it, check its sender, hand it on.

One table, `SECURE_UPLOADS`: per stage, the message class that parses the upload and the method of the
secure-aggregation server that receives it. Identity is the uploader's certificate: a message naming
another party is refused before the server sees it. The round driver (`driver.py`) runs the stages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.aggregator.stages import UploadHandler
from fedfair.secagg import SecAggConfig, Server
from fedfair.secagg.messages import (
    AdvertiseKeys,
    ConsistencySignature,
    MaskedInput,
    ShareCheck,
    ShareKeys,
    UnmaskResponse,
)
from fedfair.secagg.verify_messages import AggregateTag
from fedfair.secagg.wire import Stage as SecAggStage


class SignedMessage(Protocol):
    """A secure-aggregation upload: it names its sender's party id (a claim, checked here)."""

    @property
    def sender(self) -> int:
        """The party id the message claims to come from."""


Message = TypeVar("Message", bound=SignedMessage)


@dataclass(frozen=True)
class SecureUpload(Generic[Message]):
    """How the aggregator takes one secure-aggregation stage's upload.

    Parse it, check its sender against the certificate's party, hand it to the secure-aggregation server.
    """

    parse: Callable[[bytes], Message]
    receive: Callable[[Server, Message], None]

    def handler(self, server: Server, config: SecAggConfig) -> UploadHandler:
        """The stage's upload handler for `server`.

        Raises:
            RefusedError: reason :attr:`Refusal.INVALID_UPLOAD` when the message names another
                party than the uploader's certificate (`config.party_id`).
        """

        def absorb(peer: str, payload: bytes) -> None:
            message = self.parse(payload)
            # Identity is the certificate's: a message naming another party is refused outright.
            if message.sender != config.party_id(peer):
                raise RefusedError(Refusal.INVALID_UPLOAD, "the message names another party than the certificate")
            self.receive(server, message)

        return absorb


SECURE_UPLOADS: dict[SecAggStage, SecureUpload[Any]] = {
    SecAggStage.ADVERTISE: SecureUpload(AdvertiseKeys.from_bytes, Server.receive_advertisement),
    SecAggStage.SHARE: SecureUpload(ShareKeys.from_bytes, Server.receive_shares),
    SecAggStage.CHECK: SecureUpload(ShareCheck.from_bytes, Server.receive_share_check),
    SecAggStage.MASK: SecureUpload(MaskedInput.from_bytes, Server.receive_masked_input),
    SecAggStage.CONSISTENCY: SecureUpload(ConsistencySignature.from_bytes, Server.receive_consistency),
    SecAggStage.UNMASK: SecureUpload(UnmaskResponse.from_bytes, Server.receive_unmask_response),
    SecAggStage.VERIFY: SecureUpload(AggregateTag.from_bytes, Server.receive_tag),
}
"""Each secure-aggregation stage's message class and the server's method that takes it."""
