"""What the aggregator's service reads before it acts: requests that may not parse, and who made each.

A request parser registered by :func:`~fedfair.runtime.aggregator.servicer.add_to_server` never raises: a malformed
message becomes :class:`Undecodable`, which the servicer refuses through its one refusal path; :class:`Caller`
names the caller of a refused request in its one log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc

from fedfair import pki
from fedfair.core.errors import WireError
from fedfair.runtime.aggregator.identities import host_of
from fedfair.runtime.aggregator.stages import error_summary
from fedfair.runtime.transport import WireStage, describe_binding, pb, peer_certificate

Request = TypeVar("Request")


@dataclass(frozen=True)
class Undecodable:
    """A request that did not parse as its protobuf message, handed to the servicer to refuse.

    gRPC's own handling of a parser that raises is a logged traceback and an INTERNAL
    status; the parsers :func:`~fedfair.runtime.aggregator.servicer.add_to_server` registers return this instead.
    """

    reason: str


def tolerant(parse: Callable[[bytes], Request]) -> Callable[[bytes], Request | Undecodable]:
    """`parse` as a parser that never raises: what it cannot parse comes back :class:`Undecodable`."""

    def deserialize(data: bytes) -> Request | Undecodable:
        try:
            return parse(data)
        except Exception as error:  # noqa: BLE001 -- protobuf's DecodeError, or whatever else a parser raises
            return Undecodable(error_summary(error))

    return deserialize


def decoded(request: Request | Undecodable) -> Request:
    """The parsed `request`; a WireError for an :class:`Undecodable` one."""
    if isinstance(request, Undecodable):
        raise WireError(f"the request is not a valid protobuf message ({request.reason})")
    return request


def decoded_parts(parts: Iterable[pb.Part | Undecodable]) -> Iterator[pb.Part]:
    """The parts of an upload stream, each :func:`decoded`."""
    for part in parts:
        yield decoded(part)


class Caller:
    """Who made a request and what it concerned, for the one log line of a refusal."""

    def __init__(self, context: grpc.ServicerContext, name: Callable[[WireStage], str] = str) -> None:
        self.context = context
        self._name = name
        self.peer: str | None = None
        self.binding: pb.Binding | None = None

    def describe(self) -> str:
        """The caller as the log line names it: its name (or what its certificate claims), and the binding."""
        who = repr(self.peer) if self.peer is not None else self._unlisted()
        return who if self.binding is None else f"{who} ({describe_binding(self.binding, self._name)})"

    def _unlisted(self) -> str:
        """A caller refused before it was identified: the name its certificate claims, or its address."""
        try:
            certificate = peer_certificate(self.context)
            name = None if certificate is None else pki.name_from_certificate(certificate)
        except Exception:  # noqa: BLE001 -- a certificate too broken to name: fall back to the address
            name = None
        return (
            f"unidentified caller at {host_of(self.context.peer())}"
            if name is None
            else f"certificate {name!r} (not admitted)"
        )
