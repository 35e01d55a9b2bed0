"""Denial of service against the plain federation: stream starvation and a TCP flood, an honest GetPlan timed.

Rows of the plain federation (:mod:`attacks.plain_attacks`), run by the insider while the MASKED_INPUT stage it
holds open (:class:`~attacks.plain_stage.InsiderStage`) waits.
"""

from __future__ import annotations

import time
from collections import Counter

from attacks.federation import FEDERATION_ID
from attacks.hostile_client import LatencyProbe, idle_connections, join_binding, stub
from attacks.plain_stage import StageContext, InsiderStage
from fedfair.runtime.transport import fedfair_pb2 as pb

LATENCY_LIMIT_SECONDS = 1.0
"""An honest GetPlan must be answered within this while a denial-of-service attack runs."""


class FloodAttacks(InsiderStage):
    """The denial-of-service rows: methods of :class:`~attacks.plain_attacks.PlainAttacks`, which runs them in its
    insider's open stages."""

    # ------------------------------------------------------------ denial of service

    def _starvation_row(self, context: StageContext) -> None:
        count, seconds = self.sizes.streams, self.sizes.starvation_seconds
        with self.book.row(
            f"stream starvation ({count} WaitForTasks opened and cancelled in a loop)",
            f"every honest GetPlan answered within {LATENCY_LIMIT_SECONDS:g} s while it runs",
        ) as row:
            federation = stub(self.insider.channel)
            request = pb.TaskRequest(after=join_binding(FEDERATION_ID))
            codes: Counter[str] = Counter()
            loops = 0
            probe = LatencyProbe(self.address, self.credentials.honest, FEDERATION_ID)
            with probe:
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    calls = [federation.WaitForTasks(request) for _ in range(count)]
                    time.sleep(0.05)
                    for call in calls:
                        if call.done():
                            codes[call.code().name] += 1
                        else:
                            call.cancel()
                            codes["held open, then cancelled"] += 1
                    loops += 1
            summary = probe.summary()
            worst = summary["max_seconds"]
            ok = summary["failed"] == 0 and worst is not None and worst < LATENCY_LIMIT_SECONDS
            row.record(
                f"honest GetPlan: max {worst} s, median {summary['median_seconds']} s over {summary['probes']} probes, "
                f"{summary['failed']} failed; attacker streams: {dict(codes)}",
                ok and self.aggregator.alive,
                latency=summary,
                loops=loops,
                attacker_streams=dict(codes),
            )

    def _flood_row(self, context: StageContext) -> None:
        count, seconds = self.sizes.flood_connections, self.sizes.flood_seconds
        with self.book.row(
            f"TCP flood ({count} connections that never start a TLS handshake)",
            f"honest GetPlan on new and existing connections answered within {LATENCY_LIMIT_SECONDS:g} s; "
            "the aggregator keeps serving",
        ) as row:
            sockets = idle_connections(self.address, count)
            try:
                fresh = LatencyProbe(self.address, self.credentials.honest, FEDERATION_ID, fresh_connections=True)
                shared = LatencyProbe(self.address, self.credentials.honest, FEDERATION_ID)
                with fresh, shared:
                    time.sleep(seconds)
            finally:
                for connection in sockets:
                    connection.close()
            summaries = {"new connections": fresh.summary(), "existing connection": shared.summary()}
            ok = all(
                summary["failed"] == 0
                and summary["max_seconds"] is not None
                and summary["max_seconds"] < LATENCY_LIMIT_SECONDS
                for summary in summaries.values()
            )
            row.record(
                f"{len(sockets)} idle connections held {seconds:g} s; "
                + "; ".join(
                    f"{what}: max {summary['max_seconds']} s, {summary['failed']} of {summary['probes']} failed"
                    for what, summary in summaries.items()
                ),
                ok and self.aggregator.alive,
                connections=len(sockets),
                latency=summaries,
            )
