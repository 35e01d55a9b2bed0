"""Differencing across rounds: the same model run again without one site, the collaborators restarted.

A row of the consent scenario (:mod:`attacks.consent`), over its pinned federation (:mod:`attacks.pinned_federation`):
round 1 with every site, then round 2 on the same model (the loop does not advance it) without one site, the
collaborators restarted in between, with ``batch_fraction = 1`` so each update is a function of the model: the
difference of the two sums would be the missing site's update. The collaborators must sign no second survivor set
for that input. The control re-runs the model with every site.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.cheating import collaborator_log
from attacks.federation import HonestCollaborators, kept_state
from attacks.pinned_federation import (
    FOUR,
    RUN_SECONDS,
    LoopAggregator,
    StageTap,
    restart_collaborators,
    run_errors,
    lines_of,
    pinned_workspace,
    round_log,
    short,
)
from attacks.rows import PATCHED_AGGREGATOR, RowBook
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.trainer import TrainerFactory
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan


@dataclass
class Differencing:
    """Round 1 with every site; round 2 on the same model (the loop does not advance it), without
    `leave_out` (None: the control, every site again). The round-2 participants are chosen only once
    the harness has restarted the collaborators (`first_done`, then `proceed`); every training sum the
    aggregator decodes is kept."""

    leave_out: str | None
    first_done: threading.Event = field(default_factory=threading.Event)
    proceed: threading.Event = field(default_factory=threading.Event)
    sums: dict[int, tuple[np.ndarray, float]] = field(default_factory=dict)
    """Per round: the decoded weighted sum and its error bound (the encoding's stochastic rounding)."""

    def adjust(self, loop: RoundLoop) -> None:
        train, participants, run = loop.train, loop.choose_participants, loop.driver.run

        def held_train(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number == 2:
                self.first_done.set()
                self.proceed.wait(RUN_SECONDS)
            before = kept_state(loop.checkpoint.state)
            record = train(round_number, **options)
            if round_number == 1:
                loop.checkpoint = dataclasses.replace(loop.checkpoint, state=before)  # the model is not advanced
            return record

        def chosen(round_number: int, **options: Any) -> frozenset[str]:
            connected = participants(round_number, **options)
            if round_number == 2 and self.leave_out is not None:
                return connected - {self.leave_out}
            return connected

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is TRAINING:
                self.sums[round_number] = (outcome.weighted_sum.copy(), outcome.error_bound)
            return outcome

        loop.train = held_train  # type: ignore[method-assign]
        loop.choose_participants = chosen  # type: ignore[method-assign]
        loop.driver.run = recording  # type: ignore[method-assign]


@dataclass
class DifferencingRun:
    log: dict[int, dict[str, Any]]
    cheat: Differencing
    tap: StageTap
    said: list[str]
    restarted: bool
    bindings_kept: list[str]
    contributed: dict[str, list[int]]
    """The rounds each restarted collaborator sent a masked input to (masked, so nothing without unmasking)."""
    errors: dict[str, str]


def differencing_run(root: Path, leave_out: str | None) -> DifferencingRun:
    # min_round_size = quorum = 3, so a round of three is legitimate: only the binding can refuse it.
    workspace = pinned_workspace(root, quorum=3, rounds=2, training={"batch_fraction": 1.0})
    plan = load_aggregator_plan(workspace.plan)
    cheat, tap = Differencing(leave_out), StageTap()
    aggregator = LoopAggregator(plan, tap.install, cheat.adjust)
    board = aggregator.network.board if aggregator.network is not None else None
    real: Callable[[str], TrainerFactory | None] = lambda name: None  # noqa: E731 -- each site's real learner
    restarted, kept = False, list[str]()
    with collaborator_log() as said:
        groups = [HonestCollaborators.start(workspace, FOUR, real)]
        try:
            if board is not None and cheat.first_done.wait(RUN_SECONDS):
                restarted, kept = restart_collaborators(workspace, board, groups, real)
            cheat.proceed.set()
            groups[-1].join(RUN_SECONDS)
        finally:
            for group in groups:
                group.stop()
            aggregator.stop()
    errors = run_errors(groups, aggregator)
    contributed = {
        name: list(collaborator.contributed_rounds) for name, collaborator in groups[-1].collaborators.items()
    }
    return DifferencingRun(
        round_log(workspace), cheat, tap, said, restarted and len(groups) == 2, kept, contributed, errors
    )


def differencing_row(root: Path, book: RowBook) -> None:
    left_out = FOUR[-1]
    with book.row(
        f"differencing: round 1 with every site, then round 2 on the same model without {left_out} "
        "(batch_fraction = 1, the collaborators restarted in between): the difference of the two sums would be "
        f"{left_out}'s update",
        "each honest collaborator, restarted, still finds that input bound to round 1's four survivors and signs "
        "no other set: round 2 is never unmasked, no second sum exists; the same re-run with every site is "
        "applied (the control)",
        PATCHED_AGGREGATOR,
    ) as row:
        control = differencing_run(root / "control", None)
        attack = differencing_run(root / "attack", left_out)
        first, second = attack.log.get(1, {}), attack.log.get(2, {})
        same_model = bool(first) and first.get("model_sha256") == second.get("model_sha256")
        participants = second.get("participants", [])
        carried_out = (
            attack.restarted
            and first.get("status") == "applied"
            and same_model
            and left_out not in participants
            and len(participants) >= 3
        )
        refusals = {
            name: lines_of(attack.said, name, "already signed for with other survivors") for name in participants
        }
        refused = sorted(name for name, lines in refusals.items() if lines)
        signed = attack.tap.sent(2, "STAGE_CONSISTENCY")
        unmasked = attack.tap.sent(2, "STAGE_UNMASK")
        control_second = control.log.get(2, {})
        control_ok = (
            control.restarted
            and control_second.get("status") == "applied"
            and control_second.get("model_sha256") == control.log.get(1, {}).get("model_sha256")
            and 2 in control.cheat.sums
        )
        # The premise: with batch_fraction = 1 an input is a function of the model, so the control's re-run
        # decodes round 1's sum again, but for the two roundings of the encoding (each within its bound).
        repeated: float | None = None
        if {1, 2} <= control.cheat.sums.keys():
            (one, bound_one), (two, bound_two) = control.cheat.sums[1], control.cheat.sums[2]
            repeated = float(np.abs(one - two).max())
            deterministic = repeated <= bound_one + bound_two
        else:
            deterministic = False
        said = next((lines[0] for lines in refusals.values() if lines), None)
        row.record(
            f"round 1: {first.get('status', 'not run')} with {first.get('contributors', [])}; collaborators restarted: "
            f"{attack.restarted} (bindings kept by {attack.bindings_kept}); round 2 on the same model: {same_model}, "
            f"participants {participants}; consistency signatures: {signed or 'none'}; unmasking responses: "
            f"{unmasked or 'none'}; refused: {refused}, e.g. {short(said, 300)!r}; round 2: "
            f"{second.get('status', 'not run')}; sums decoded in rounds {sorted(attack.cheat.sums)}; control: round 2 "
            f"{control_second.get('status', 'not run')} with {control_second.get('contributors', [])}, its sum "
            f"{'equal to' if deterministic else 'NOT equal to'} round 1's within the encoding's rounding (largest "
            f"difference {repeated}): the same input again",
            carried_out
            and deterministic
            and control_ok
            and not signed
            and not unmasked
            and refused == sorted(participants)
            and second.get("status") != "applied"
            and 2 not in attack.cheat.sums,
            reason=second.get("reason"),
            masked_inputs_after_restart=attack.contributed,
            errors={**attack.errors, **{f"control {key}": value for key, value in control.errors.items()}},
        )
