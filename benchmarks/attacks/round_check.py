"""The round log replayed from what each party really sent: every applied round must be exactly that.

:func:`check_rounds` starts from the plan's initial model and applies fedfair's own server step to the sum of
the vectors the listed contributors sent (the honest parties' own, the insider's by its receipts), in some
order of addition, and compares each model digest the round log recorded. It reports every applied round whose
model is not exactly that, or whose inputs the aggregator should have refused (:class:`RoundCheck`).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from fedfair.core import server
from fedfair.runtime.aggregator.bundles import initial_state
from fedfair.runtime.aggregator.checkpoint import read_round_log, state_digest
from fedfair.runtime.local.workspace import Workspace
from fedfair.runtime.output_folder import FINAL_SUMMARY_NAME
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan


@dataclass
class RoundCheck:
    """The outcome of replaying a run's round log from what each party really sent.

    ``invalid`` names every applied round that should not have been: its model is not
    the sum of what the parties sent (which also ends the replay: later rounds are
    ``unverified``), or it is, but the aggregator accepted something it must refuse.
    """

    verified: list[int] = field(default_factory=list)
    invalid: dict[int, str] = field(default_factory=dict)
    unverified: list[int] = field(default_factory=list)
    applied: int = 0


@dataclass(frozen=True)
class Sent:
    """What the contributors of one applied round sent: each one's plain vector [w * delta, w * delta_c, w],
    and why any of it should have been refused (empty when everything was within the plan's bounds)."""

    vectors: dict[str, np.ndarray]
    problems: tuple[str, ...] = ()


Contributions = Callable[[Mapping[str, Any]], Sent | str]
"""For an applied round's log record: what its contributors sent, or why the round cannot be explained."""


def final_digest(workspace: Workspace) -> str | None:
    path = workspace.output / FINAL_SUMMARY_NAME
    if not path.exists():
        return None
    digest: str = json.loads(path.read_text())["model_sha256"]
    return digest


def check_rounds(plan: AggregatorPlan, workspace: Workspace, contributions: Contributions) -> RoundCheck:
    """Replay the round log with fedfair's server step and compare every model digest it recorded.

    Starting from the plan's initial model, each applied round must move the model exactly
    as the sum of the listed contributors' vectors does (in some order of addition), landing
    on the digest the next round recorded at its start (or the final model's). The first
    round that cannot be explained ends the replay; the rounds after it are unverified.
    """
    log = read_round_log(workspace.output)
    starts = [record["model_sha256"] for record in log] + [final_digest(workspace)]
    state = initial_state(plan)
    check = RoundCheck()

    def stop(index: int, reason: str | None) -> RoundCheck:
        if reason is not None:
            check.invalid[int(log[index]["round"])] = reason
            index += 1
        check.unverified += [int(later["round"]) for later in log[index:]]
        return check

    for index, record in enumerate(log):
        number = int(record["round"])
        if record["model_sha256"] != state_digest(state):
            return stop(index, f"round {number} started from a model the rounds before it do not explain")
        if record.get("status") != "applied":
            continue
        check.applied += 1
        sent = contributions(record)
        if isinstance(sent, str):
            return stop(index, sent)
        listed = set(record.get("contributors", []))
        if listed != set(sent.vectors):
            return stop(
                index, f"round {number}: contributors {sorted(listed)}, but {sorted(sent.vectors)} sent updates"
            )
        if starts[index + 1] is None:
            return stop(index, None)  # no digest after this round to compare with (the run did not finish)
        moved = _apply_matching(plan, state, sent.vectors, starts[index + 1])
        if moved is None:
            return stop(index, f"round {number}: the applied model is not the sum of what {sorted(listed)} sent")
        state = moved
        if sent.problems:
            check.invalid[number] = f"round {number}: " + "; ".join(sent.problems)
        else:
            check.verified.append(number)
    return check


def _apply_matching(
    plan: AggregatorPlan, state: server.ServerState, vectors: Mapping[str, np.ndarray], wanted: str
) -> server.ServerState | None:
    """The state after this round for the order of addition whose digest is `wanted` (name order first)."""
    names = sorted(vectors)
    orders = itertools.permutations(names) if len(names) <= 6 else iter([tuple(names)])
    for order in orders:
        total = np.zeros_like(vectors[names[0]])
        for name in order:
            np.add(total, vectors[name], out=total)
        aggregate = server.Aggregate.from_vector(torch.from_numpy(total[:-1].copy()), float(total[-1]))
        try:
            # The plan's own server step, as the aggregator applies it (server momentum included).
            moved = plan.algorithm().server_apply(state, aggregate, average_from=plan.training.average_from_round)
        except server.AggregateError:
            return None
        if state_digest(moved) == wanted:
            return moved
    return None
