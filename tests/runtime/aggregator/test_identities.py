"""LiveStreams: one connection per certified name holds task streams; another waits out the old one's end
briefly, then is refused naming both addresses (the process-level test is tests/runtime/test_identities.py)."""

from __future__ import annotations

import threading
from typing import cast

import grpc
import pytest

from fedfair.core.errors import RefusedError
from fedfair.runtime.aggregator import identities
from fedfair.runtime.aggregator.identities import LiveStreams, host_of
from fedfair.runtime.transport.stage_gate import STATUS_CODES


class Context:
    """The two things LiveStreams asks of a gRPC servicer context."""

    def __init__(self, peer: str) -> None:
        self.address = peer
        self.active = True

    def peer(self) -> str:
        return self.address

    def is_active(self) -> bool:
        return self.active


def context(peer: str) -> grpc.ServicerContext:
    return cast(grpc.ServicerContext, Context(peer))


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(identities, "GRACE_SECONDS", 0.3)


def test_another_connection_of_a_connected_name_is_refused_naming_both_addresses() -> None:
    streams = LiveStreams()
    with streams.hold("site-a", context("ipv4:10.0.0.5:4000")):
        with pytest.raises(RefusedError) as refused:
            with streams.hold("site-a", context("ipv4:10.0.0.9:5000")):
                pass
        assert STATUS_CODES[refused.value.reason] == grpc.StatusCode.ALREADY_EXISTS
        assert str(refused.value).startswith(
            "'site-a' is already connected from 10.0.0.5:4000; this second process (from 10.0.0.9:5000) is refused"
        )
        # The same connection (its own process's new stream) and other names are let in.
        same, other = context("ipv4:10.0.0.5:4000"), context("ipv4:10.0.0.9:5000")
        with streams.hold("site-a", same), streams.hold("site-b", other):
            pass
    with streams.hold("site-a", context("ipv4:10.0.0.9:5000")):  # the first one left: the next is welcome
        pass


def test_a_stream_whose_connection_is_closing_is_waited_out_not_refused() -> None:
    streams = LiveStreams()
    old = Context("ipv4:127.0.0.1:4000")
    with streams.hold("site-a", cast(grpc.ServicerContext, old)):
        # A restarted process: the old connection's stream ends a moment after the new one arrives.
        threading.Timer(0.1, lambda: setattr(old, "active", False)).start()
        with streams.hold("site-a", context("ipv4:127.0.0.1:4001")):
            pass


def test_host_of_strips_the_transport() -> None:
    assert host_of("ipv4:127.0.0.1:50051") == "127.0.0.1:50051"
    assert host_of("ipv6:[::1]:50051") == "[::1]:50051"
    assert host_of("something-else") == "something-else"


def test_peer_addresses_read_as_people_write_them() -> None:
    assert host_of("ipv6:%5B::1%5D:55334") == "[::1]:55334"
    assert host_of("ipv4:10.0.0.5:51234") == "10.0.0.5:51234"
    assert host_of("unknown-kind") == "unknown-kind"
