"""The pinned four-site federation the consent rows and their kin attack, and fedfair's aggregator in a thread.

:class:`LoopAggregator` is fedfair's own aggregator (:class:`~attacks.cheating.PatchedAggregator`) with its
round loop adjustable too; :class:`StageTap` watches its relay. The helpers beside them (restarting the
collaborators, reading what they said, the pinned workspace) are shared by :mod:`attacks.consent`,
:mod:`attacks.differencing`, :mod:`attacks.statistics_sum`, :mod:`attacks.evaluation_query` and the scenarios
that reuse this federation (record, noise, influence, the model chain's rows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attacks.hostile_client import named_stage, stage_name, stage_of
from attacks.cheating import PatchedAggregator
from attacks.federation import FixedTrainer, HonestCollaborators, plan_sections, trainer_factory
from fedfair.runtime.aggregator.stages import UploadHandler
from fedfair.runtime.aggregator.checkpoint import read_round_log
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.aggregator.network import Network, serve
from fedfair.runtime.aggregator.start import GOODBYE_SECONDS, prepare
from fedfair.runtime.collaborator.trainer import TrainerFactory
from fedfair.runtime.local.workspace import Workspace, make_workspace
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, plan_digest
from fedfair.runtime.transport import fedfair_pb2 as pb

FOUR = ("site-a", "site-b", "site-c", "site-d")
FEDERATION_ID = "fedfair-launch"  # what make_workspace writes
TIMEOUT = 15.0
RUN_SECONDS = 60.0
AGGREGATOR_THREAD = "consent-aggregator"
"""The aggregator's thread (LoopAggregator names it so): where its own plan's model is built."""


class LoopAggregator(PatchedAggregator):
    """A PatchedAggregator whose round loop is adjusted too (`adjust(loop)` before the first round).

    The evaluation after the last round is skipped: no row here needs it, and it costs a secure sum.
    """

    def __init__(
        self,
        plan: AggregatorPlan,
        patch: Callable[[Network], None] | None = None,
        adjust: Callable[[RoundLoop], None] | None = None,
    ) -> None:
        self.adjust = adjust or (lambda loop: None)
        super().__init__(plan, patch or (lambda network: None))

    def _run(self) -> None:
        threading.current_thread().name = AGGREGATOR_THREAD
        try:
            checkpoint = prepare(self.plan, resume=False)
            network = serve(self.plan, plan_digest(self.plan))
            self.network = network
            self.patch(network)
            loop = RoundLoop(self.plan, network, checkpoint)
            loop.evaluation_due = lambda round_number: False  # type: ignore[method-assign]
            self.adjust(loop)
            self.listening.set()
            try:
                loop.run()
                network.board.wait_until_alone(GOODBYE_SECONDS)
            finally:
                network.stop()
        except Exception as error:  # noqa: BLE001 -- reported in the row
            self.error = f"{type(error).__name__}: {error}"
        finally:
            self.listening.set()


@dataclass
class StageTap:
    """The aggregator's relay, watched: every stage it opens (with whom it expects), every upload it
    receives (recorded before any check), and the masked inputs of `discard`, dropped unseen so that the
    secure-aggregation server counts their senders as dropped out (the aggregator's claim)."""

    discard: frozenset[str] = frozenset()
    expected: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    uploads: dict[tuple[int, str], list[str]] = field(default_factory=dict)
    discarded: list[str] = field(default_factory=list)

    def install(self, network: Network) -> None:
        board = network.board
        open_stage = board.open_stage

        def tapped(
            binding: pb.Binding,
            expected: Any,
            inputs: bytes | Mapping[str, bytes],
            handler: UploadHandler,
            **options: Any,
        ) -> None:
            key = (binding.round, stage_name(stage_of(binding)))
            self.expected[key] = sorted(expected)
            masked = stage_of(binding) == named_stage("STAGE_MASKED_INPUT")

            def absorb(peer: str, payload: bytes) -> None:
                self.uploads.setdefault(key, []).append(peer)
                if masked and peer in self.discard:
                    self.discarded.append(f"round {binding.round}: {peer}")
                    return
                handler(peer, payload)

            open_stage(binding, expected, inputs, absorb, **options)

        board.open_stage = tapped  # type: ignore[method-assign]

    def sent(self, round_number: int, stage: str) -> list[str]:
        return sorted(set(self.uploads.get((round_number, stage), [])))


def restart_collaborators(
    workspace: Workspace,
    board: Any,
    groups: list[HonestCollaborators],
    trainers: Callable[[str], TrainerFactory | None],
) -> tuple[bool, list[str]]:
    """Stop the running collaborators (`groups[-1]`), wait until they have ended and the aggregator sees
    them gone, start them again with `trainers` (appended to `groups`): whether all four reconnected (False
    if an old one never ended), and who kept a bindings file."""
    groups[-1].stop()
    # Every old collaborator must be gone before the new ones start: one still running (slow to stop
    # on a loaded machine) would reconnect under the same name and take part in the new session.
    if groups[-1].join(RUN_SECONDS):
        return False, []
    kept = sorted(
        name for name in FOUR if (workspace.configs[name].parent / f"{name}.{FEDERATION_ID}.bindings.json").exists()
    )
    wait_until(lambda: not board.connected() & set(FOUR), RUN_SECONDS)
    groups.append(HonestCollaborators.start(workspace, FOUR, trainers))
    return wait_until(lambda: board.connected() >= set(FOUR), 30), kept


def run_errors(groups: list[HonestCollaborators], aggregator: Any) -> dict[str, str]:
    """Every collaborator's error, by run, and the aggregator's."""
    errors = {
        f"{name} (run {index + 1})": error for index, group in enumerate(groups) for name, error in group.errors.items()
    }
    if aggregator.error:
        errors["aggregator"] = aggregator.error
    return errors


def lines_of(said: list[str], name: str, *words: str) -> list[str]:
    """`name`'s lines containing every one of `words`."""
    return [line for line in said if line.startswith(f"{name}:") and all(word in line for word in words)]


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def fixed(name: str) -> TrainerFactory:
    return trainer_factory(name, FixedTrainer)


def pinned_workspace(root: Path, *, quorum: int, rounds: int = 1, **extra: Mapping[str, Any]) -> Workspace:
    """Four sites, secure aggregation, and a manifest pinning every certificate and the plan
    (min_round_size = the quorum), named by the plan and every config: careful institutions."""
    sections = plan_sections(secure=True, rounds=rounds, quorum=quorum, timeout=TIMEOUT, **extra)
    return make_workspace(root, FOUR, plan=sections, manifest=True)


def round_log(workspace: Workspace) -> dict[int, dict[str, Any]]:
    return {int(record["round"]): record for record in read_round_log(workspace.output)}


def served_differences(error: str) -> str | None:
    """The "pinned -> served" field list of a plan-mismatch refusal against a pinned plan, or None."""
    start = error.find("pinned -> served: ")
    if start < 0:
        return None
    end = error.find("); a plan changes", start)
    return error[start : end if end > 0 else None]


def short(text: str | None, limit: int = 400) -> str:
    text = text or "nothing"
    return text if len(text) <= limit else text[: limit - 3] + "..."
