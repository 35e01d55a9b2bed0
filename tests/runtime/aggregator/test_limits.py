"""Arrivals and departures are logged within a budget per collaborator, like refusals."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from fedfair.runtime.observe.events import EventLog, read_events
from fedfair.runtime.aggregator.limits import PRESENCE_BURST, Presence
from fedfair.runtime.rate_limits import RateLimit
from tests.runtime.aggregator.test_servicer import (  # noqa: F401 -- fixtures
    Aggregator,
    FakeClock,
    aggregator,
    aggregator_lines,
    certs,
    eventually,
    tasks,
)


def test_a_collaborator_in_a_reconnect_loop_gets_a_burst_of_lines_then_one_a_minute(tmp_path: Path) -> None:
    clock = FakeClock()
    presence = Presence(EventLog(tmp_path), RateLimit(per_second=1 / 60, burst=PRESENCE_BURST, clock=clock))
    for _ in range(500):
        presence.arrived("site-a", lambda: 1, 3)
        presence.departed("site-a")
    presence.arrived("site-b", lambda: 2, 3)  # another collaborator has its own budget
    events = read_events(tmp_path)
    assert [event["event"] for event in events] == ["connect", "disconnect"] * 2 + ["connect"]
    clock.now = 60.0
    presence.arrived("site-a", lambda: 1, 3)
    assert len(read_events(tmp_path)) == PRESENCE_BURST + 2  # 1,001 arrivals and departures, six lines in all


def test_reconnects_over_the_network_add_a_few_lines_and_count_the_rest(
    aggregator: Aggregator,  # noqa: F811 -- the imported fixture
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    aggregator.servicer.presence = Presence(
        EventLog(aggregator.output), RateLimit(per_second=1 / 60, burst=PRESENCE_BURST, clock=clock)
    )
    caplog.set_level(logging.INFO, logger="fedfair.aggregator")
    stub = aggregator.stub("site-a")
    reconnects = 40
    for _ in range(reconnects):
        stream = stub.WaitForTasks(tasks(), timeout=5.0)
        assert eventually(lambda: aggregator.board.connected() == {"site-a"})
        stream.cancel()
        assert eventually(lambda: not aggregator.board.connected())
    lines = [line for line in aggregator_lines(caplog) if line.startswith("site-a")]
    assert len(lines) == PRESENCE_BURST
    clock.now = 60.0
    stream = stub.WaitForTasks(tasks(), timeout=5.0)
    assert eventually(
        lambda: len([line for line in aggregator_lines(caplog) if line.startswith("site-a")]) > PRESENCE_BURST
    )
    stream.cancel()
    last = [line for line in aggregator_lines(caplog) if line.startswith("site-a")][-1]
    skipped = 2 * reconnects - PRESENCE_BURST
    assert last.startswith("site-a reconnected") and f"({skipped} more connects and disconnects" in last
