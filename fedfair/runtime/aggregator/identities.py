"""One live process per identity: a second task stream for a connected name is refused.

A stream whose connection died without a goodbye stays "active" until gRPC's keepalive
notices (``network.SERVER_KEEPALIVE``: 30 s at most); a process restarted within that window,
past the :data:`GRACE_SECONDS` a new stream waits for the old one to end, is refused once and
started again by its operator.

Why: docs/design.md, "Inside the aggregator".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import unquote

import grpc

from fedfair.core.errors import Refusal, RefusedError

ALREADY_CONNECTED = (
    "{name!r} is already connected from {running}; this second process (from {second}) is refused: one "
    "process per institution takes part (stop the other process first to run this one instead)"
)
"""What a second process of a connected name hears, and the aggregator logs (the caller's own name
only: it holds that certificate)."""


GRACE_SECONDS = 2.0
"""How long a new stream waits for the other connection's stream to end before it is refused: a process
restarted at once (or a stream its own process just cancelled) is not taken for a second process while
gRPC is still closing the old one."""

POLL_SECONDS = 0.05


def host_of(peer: str) -> str:
    """The address of a gRPC peer string, as people write it.

    "ipv4:10.0.0.5:51234" -> "10.0.0.5:51234"; gRPC percent-encodes an IPv6 address's brackets,
    "ipv6:%5B::1%5D:55334" -> "[::1]:55334".
    """
    kind, _, address = peer.partition(":")
    return unquote(address) if kind in ("ipv4", "ipv6", "unix") and address else peer


class LiveStreams:
    """The task streams of each certified name, by the connection (gRPC peer) they came on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[str, list[tuple[grpc.ServicerContext, str]]] = {}

    @contextmanager
    def hold(self, name: str, context: grpc.ServicerContext) -> Iterator[None]:
        """Count `context` as a live stream of `name` while the block runs.

        Raises:
            RefusedError: reason :attr:`Refusal.ALREADY_CONNECTED` (gRPC ALREADY_EXISTS) when another
                connection still holds an active stream of `name` after the grace period.
        """
        peer = context.peer()
        deadline = time.monotonic() + GRACE_SECONDS
        while True:
            with self._lock:
                live = [(other, address) for other, address in self._streams.get(name, []) if other.is_active()]
                elsewhere = [address for _, address in live if address != peer]
                if not elsewhere:
                    self._streams[name] = [*live, (context, peer)]
                    break
            if time.monotonic() >= deadline:
                message = ALREADY_CONNECTED.format(name=name, running=host_of(elsewhere[0]), second=host_of(peer))
                raise RefusedError(Refusal.ALREADY_CONNECTED, message)
            time.sleep(POLL_SECONDS)
        try:
            yield
        finally:
            with self._lock:
                left = [(other, address) for other, address in self._streams.get(name, []) if other is not context]
                if left:
                    self._streams[name] = left
                else:
                    self._streams.pop(name, None)
