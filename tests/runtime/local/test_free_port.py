"""`free_port`: a loopback port the aggregator can bind a moment later, out of the outgoing connections' way."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from fedfair.runtime.local import workspace


def test_the_port_lies_below_the_ephemeral_range_and_is_free() -> None:
    low = int(workspace.EPHEMERAL_RANGE.read_text().split()[0]) if workspace.EPHEMERAL_RANGE.is_file() else 32_768
    for _ in range(20):
        port = workspace.free_port()
        assert workspace.LISTENING_FLOOR <= port < low
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))  # free: the aggregator's bind would succeed


def test_a_port_someone_listens_on_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    taken, other = workspace.free_port(), workspace.free_port()
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # as gRPC's listeners bind
        held.bind(("127.0.0.1", taken))
        held.listen()
        draws = iter([taken - workspace.LISTENING_FLOOR, other - workspace.LISTENING_FLOOR])
        monkeypatch.setattr(workspace.secrets, "randbelow", lambda _: next(draws))
        assert workspace.free_port() == other


def test_without_room_below_the_range_the_kernel_picks_without_a_draw(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text(f"{workspace.LISTENING_FLOOR + 1_000}\t60999\n")
    monkeypatch.setattr(workspace, "EPHEMERAL_RANGE", narrow)
    monkeypatch.setattr(workspace.secrets, "randbelow", lambda _: pytest.fail("drew a port below a range without room"))
    port = workspace.free_port()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))  # free


def test_after_64_taken_draws_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = workspace.free_port()
    draws: list[int] = []

    def always_taken(_bound: int) -> int:
        draws.append(taken)
        return taken - workspace.LISTENING_FLOOR

    with socket.socket() as held:
        held.bind(("127.0.0.1", taken))
        held.listen()
        monkeypatch.setattr(workspace.secrets, "randbelow", always_taken)
        port = workspace.free_port()
        assert len(draws) == 64 and port != taken
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", port))
