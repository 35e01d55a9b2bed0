"""The noise scenario's composition row: the worst group's counts by a listed column, a cell and its complement.

A ``[schema]`` federation of four CSV sites counts its final evaluation's worst group by ``sector``. An aggregator
that serves that evaluation a model of its own (a c of its choosing) is refused by every site: the output model is
not the one the plan's server step makes of the sums each site verified (NEXT_MODEL, kept in its outcome record).
A curious one serves the verified model, reads each cell and its complement, and asks again with the other output
model the chain accepts (the one before the last round's step): the second ask is refused (one answer per round),
the counts are noised, and without noise each site suppresses a small cell with its complement jointly.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import tomli_w
import torch

from attacks.cheating import collaborator_log
from attacks.statistics_sum import COUNTRIES, MIN_COUNT, RARE_SECTOR, census_schema, institution_table
from attacks.pinned_federation import FOUR, TIMEOUT, LoopAggregator, StageTap, fixed, lines_of, short
from attacks.federation import kept_state, plan_sections
from attacks.noise_figures import (
    NOISE_BAND,
    OPERATOR,
    REPORT_PRIVACY,
    error_figures,
    ledger,
    refusals,
    run_federation,
    within,
)
from attacks.rows import RowBook
from fedfair.core.evaluation import evaluate
from fedfair.fairness import tail
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator import rounds
from fedfair.runtime.collaborator.preparation import Prepared
from fedfair.runtime.collaborator.trainer import LocalTable, check_schema_table
from fedfair.runtime.composition_counts import local_counts
from fedfair.runtime.contract import EVALUATION
from fedfair.runtime.local.workspace import Workspace, make_workspace, write_pinned_manifest
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, load_shared_settings, shared_settings

# ---------------------------------------------------------------- composition counts


COMPOSITION_COLUMN = "sector"
"""The listed column the worst group is counted by (:func:`attacks.statistics_sum.census_schema`)."""
TABLE_ROWS = 3000
"""Rows per site: 750 held out each, so that the cells are many noise stds apart."""
SMALL_CELL = 12
"""Held-out rows of site-b set to the rare sector: a cell whose part above c or at or below it is small."""
ROUNDS = 3
BOUND = 0.7
"""The plan's rounds and [objective] bound B, with average_from = 1 / ROUNDS: the output model is the mean of
the models rounds 2 and 3 started from (their losses spread about ln 2), and c stays at B (c starts there and
about a third of the losses lie above it, more than rho, so the projection holds it): the worst group is a real
share of the rows, some of its cells small. The model before round 3's step averages round 2's model alone: the
other output model the chain accepts for round 3 (as if that round were void)."""
C_FORGED = 0.2
"""The c of the crafted model the forging aggregator serves for the final evaluation (the plan's is BOUND): a
threshold of its choosing, which no site may take (the model is not the verified output model)."""


def composition_federation(root: Path, *, noised: bool) -> tuple[Workspace, Any]:
    """Four sites with their own CSV tables (:func:`attacks.statistics_sum.institution_table`, TABLE_ROWS each)
    under a pinned plan with :func:`attacks.statistics_sum.census_schema`, ROUNDS rounds, [evaluation] composition =
    [sector], and REPORT_PRIVACY when `noised`; SMALL_CELL held-out rows of site-b are in the rare sector."""
    folder = root / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    paths = {name: folder / f"{name}.csv" for name in FOUR}
    for index, name in enumerate(FOUR):
        table = institution_table(TABLE_ROWS, seed=index)
        table["country"] = np.random.default_rng(100 + index).choice(COUNTRIES, TABLE_ROWS, p=(0.8, 0.12, 0.08))
        table.to_csv(paths[name], index=False)
    sections = plan_sections(secure=True, rounds=ROUNDS, quorum=3, timeout=TIMEOUT)
    sections["training"]["average_from"] = 1 / ROUNDS
    sections["objective"]["bound"] = BOUND
    if noised:
        sections["privacy"] = dict(REPORT_PRIVACY)
    data = {name: {"csv": str(path)} for name, path in paths.items()}
    workspace = make_workspace(root, FOUR, plan=sections, data=data, manifest=True)
    # Composition needs the [schema], which the first manifest was written without: both added, then pinned again.
    written = tomllib.loads(workspace.plan.read_text())
    written.setdefault("evaluation", {})["composition"] = [COMPOSITION_COLUMN]
    workspace.plan.write_text(tomli_w.dumps(written) + "\n" + census_schema().to_toml())
    pinned = workspace.root / "manifest-with-schema.toml"
    write_pinned_manifest(pinned, workspace.plan, workspace.certs)
    pinned.replace(workspace.root / "manifest.toml")
    plan = load_aggregator_plan(workspace.plan)
    # The rare sector in SMALL_CELL of site-b's held-out rows (the split depends on the rows' order, not values).
    name = FOUR[1]
    table = pd.read_csv(paths[name])
    config = load_collaborator_config(workspace.configs[name])
    held_out = check_schema_table(
        config, load_shared_settings(shared_settings(plan)), LocalTable(None, table.copy())
    ).test
    table.loc[held_out.index[:SMALL_CELL], COMPOSITION_COLUMN] = RARE_SECTOR
    table.to_csv(paths[name], index=False)
    return workspace, plan


@dataclass
class CompositionQuery:
    """Every round trained as the plan says, then the final evaluation: if `forged`, of a crafted model (weight 1
    on the first feature) with c = C_FORGED; else of the verified output model (theta-bar, c-bar), and again of
    the other output model the chain lets through, the one before the last round's step, the stage gate rewound
    as a restarted aggregator's would be. Every final evaluation sum is kept, and the c of each model served."""

    forged: bool
    sums: list[tuple[np.ndarray, tuple[str, ...]]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    served_c: list[float] = field(default_factory=list)

    def adjust(self, loop: RoundLoop) -> None:
        train, run = loop.train, loop.driver.run

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is EVALUATION and round_number == ROUNDS:
                self.sums.append((outcome.weighted_sum.copy(), outcome.contributors))
            return outcome

        def cheat(round_number: int, **options: Any) -> dict[str, Any]:
            if round_number < ROUNDS:
                return train(round_number, **options)
            before = kept_state(loop.checkpoint.state)  # the step consumes the state's own tensors
            record = train(round_number, **options)
            trained = loop.checkpoint.state
            if self.forged:
                theta = torch.zeros_like(trained.theta_average)
                theta[0] = 1.0
                served = [dataclasses.replace(trained, theta_average=theta, c_average=C_FORGED)]
            else:
                served = [trained, before]
            for index, state in enumerate(served):
                if index:
                    loop.network.board.new_round(round_number)
                    loop.network.gate.restart_at(round_number)
                loop.checkpoint = dataclasses.replace(loop.checkpoint, state=state)
                self.served_c.append(float(state.c_average))
                self.results.append(loop.evaluate(round_number))
            # The federation ends on the model it trained: the bundle each site checks at FINISHED.
            loop.checkpoint = dataclasses.replace(loop.checkpoint, state=trained)
            return record

        loop.driver.run = recording  # type: ignore[method-assign]
        loop.train = cheat  # type: ignore[method-assign]


@dataclass
class Counted:
    """Each site's composition counts as it sent them (before encoding and noise), unsuppressed at the c it
    used, with that c."""

    sent: dict[str, np.ndarray] = field(default_factory=dict)
    own: dict[str, np.ndarray] = field(default_factory=dict)
    c: dict[str, float | None] = field(default_factory=dict)

    @contextmanager
    def installed(self) -> Iterator[None]:
        # The round job calls the answers module's public function by the name it imported into rounds.
        original = rounds.composition_counts

        def recorded(prepared: Prepared, shared: Any, theta: torch.Tensor, c: float, columns: Any) -> np.ndarray:
            vector = original(prepared, shared, theta, c, columns)
            data, model = prepared.data, prepared.evaluation_model
            assert data is not None and data.held_out_levels is not None and model is not None
            name = data.test.name.removesuffix("-test")  # the held-out part is named NAME-test
            losses = evaluate(model, theta, data.test).losses
            self.sent[name], self.c[name] = np.array(vector), c
            self.own[name] = local_counts(columns, data.held_out_levels, losses, c, 1)
            return vector

        rounds.composition_counts = recorded
        try:
            yield
        finally:
            rounds.composition_counts = original


@dataclass
class CompositionRun:
    workspace: Workspace
    plan: Any
    query: CompositionQuery
    counted: Counted
    said: list[str]
    errors: dict[str, str]


def composition_run(root: Path, *, noised: bool, forged: bool) -> CompositionRun:
    workspace, plan = composition_federation(root, noised=noised)
    query, counted = CompositionQuery(forged), Counted()
    with counted.installed(), collaborator_log() as said:
        errors = run_federation(workspace, LoopAggregator(plan, StageTap().install, query.adjust), fixed)
    return CompositionRun(workspace, plan, query, counted, said, errors)


def formable_small(vector: np.ndarray, width: int, minimum: int) -> list[str]:
    """Every count the aggregator can form from decoded composition counts (a cell, its complement, the
    withheld totals) that lies from 1 to `minimum` - 1."""
    counts = np.rint(vector).astype(np.int64)
    worst_total, total = int(counts[0]), int(counts[1])
    worst, everyone = counts[2 : 2 + width], counts[2 + width : 2 + 2 * width]
    formed = {f"cell {i} above c": int(worst[i]) for i in range(width)}
    formed |= {f"cell {i} all rows": int(everyone[i]) for i in range(width)}
    formed |= {f"cell {i} at or below c": int(everyone[i] - worst[i]) for i in range(width)}
    formed |= {
        "withheld above c": worst_total - int(worst.sum()),
        "withheld rows": total - int(everyone.sum()),
        "withheld at or below c": (total - worst_total) - int((everyone - worst).sum()),
    }
    return [f"{key} = {value}" for key, value in formed.items() if 0 < value < minimum]


def forged_figures(run: CompositionRun) -> dict[str, Any]:
    """What the forged evaluation got: each site's refusal (outcome record), who counted, what was decoded and
    charged."""
    spent = ledger(run.workspace, FOUR, float(REPORT_PRIVACY["delta"]))
    return {
        "refusals": refusals(run.workspace, FOUR),
        "counted_by": sorted(run.counted.sent),
        "sums_decoded": len(run.query.sums),
        "evaluations": [result.get("status") for result in run.query.results],
        "evaluate_releases": {
            name: [r for r in entry["releases"] if r[0] == "evaluate"] for name, entry in spent.items()
        },
    }


def forged_refused(figures: Mapping[str, Any]) -> bool:
    """Every site refused the forged output model in round ROUNDS (NEXT_MODEL), none counted, nothing was decoded
    or charged."""
    return (
        all(refusal == (ROUNDS, "NEXT_MODEL") for refusal in figures["refusals"].values())
        and figures["counted_by"] == []
        and figures["sums_decoded"] == 0
        and figures["evaluations"][:1] != ["done"]
        and not any(figures["evaluate_releases"].values())
    )


def composition_row(root: Path, book: RowBook) -> None:
    minimum = MIN_COUNT
    with book.row(
        f"noise, composition: a [schema] federation counting the worst group by {COMPOSITION_COLUMN} (site-b holds "
        f"{SMALL_CELL} held-out rows of the rare sector {RARE_SECTOR!r}); after round {ROUNDS} the aggregator serves "
        f"the final evaluation of a crafted model with c = {C_FORGED} of its choosing (forged), or, curious only, of "
        "the verified output model and then again of the output model before that round's step (the other model the "
        "chain lets through), and reads each cell and its complement (all rows less those above c)",
        f"with report_epsilon = 1: the forged model is refused by every site (its outcome record: round {ROUNDS}, "
        "NEXT_MODEL): no site counts, nothing is decoded, no evaluate release is charged; the verified model is "
        "counted by every site at its c-bar (the decoded count above c within 4 noise stds of the sites' counts at "
        "the served c), the second model is refused by every site (that round was answered for another model) and "
        "nothing more is decoded, and the decoded counts, a cell's complement included, miss the exact ones by the "
        f"stated noise (RMS within {list(NOISE_BAND)} x noise_std), one evaluate release charged per site; without "
        "[privacy] (the control, curious only) the sites suppress each cell with its complement jointly: no count "
        f"the aggregator can form lies from 1 to min_category_count - 1 = {minimum - 1}, though the sites' "
        "unsuppressed counts hold such cells",
        OPERATOR,
    ) as row:
        forged = forged_figures(composition_run(root / "forged", noised=True, forged=True))
        attack = composition_run(root / "noised", noised=True, forged=False)
        control = composition_run(root / "exact", noised=False, forged=False)
        # A noised plan's answers are the tail sums; an exact one's, the threshold sums.
        risks = tail.TailQuery(1.0).length
        width = len(census_schema().columns[2].categories or ())
        query = attack.query
        results = [result.get("status") for result in query.results]
        served = query.served_c[0] if query.served_c else None
        carried_out = (
            len(query.sums) >= 1
            and sorted(query.sums[0][1]) == list(FOUR)
            and sorted(attack.counted.sent) == list(FOUR)
            and all(c is not None and c == served for c in attack.counted.c.values())
        )
        figures: dict[str, Any] = {}
        own_ok = noise_ok = False
        std = float(query.results[0].get("noise_std", 0.0) or 0.0) if query.results else 0.0
        if carried_out and std > 0.0:
            decoded = query.sums[0][0][risks:]
            exact = np.sum(list(attack.counted.sent.values()), axis=0)
            at_own = np.sum(list(attack.counted.own.values()), axis=0)
            error = decoded - exact
            military = list(census_schema().columns[2].categories or ()).index(RARE_SECTOR)
            complement = (decoded[2 + width + military] - decoded[2 + military]) - (
                exact[2 + width + military] - exact[2 + military]
            )
            figures = {
                "noise_std": std,
                "counts": error_figures(error, std),
                "above_c_decoded": round(float(decoded[0]), 1),
                "above_c_at_served_c": int(at_own[0]),
                "rare_cell_exact": {"above c": int(exact[2 + military]), "all rows": int(exact[2 + width + military])},
                "rare_complement_error_in_std": round(float(complement) / (math.sqrt(2.0) * std), 3),
                "sent_whole": all(np.array_equal(attack.counted.sent[name], attack.counted.own[name]) for name in FOUR),
            }
            own_ok = abs(decoded[0] - at_own[0]) <= 4 * std and bool(figures["sent_whole"])
            noise_ok = within(figures["counts"]["rms_in_std"])
        participants = sorted(attack.counted.sent)
        second = {name: lines_of(attack.said, name, "already answered for another model") for name in participants}
        refused = sorted(name for name, lines in second.items() if lines)
        second_refused = len(query.sums) == 1 and refused == list(FOUR) and results[1:] != ["done"]
        spent = ledger(attack.workspace, FOUR, float(REPORT_PRIVACY["delta"]))
        # Under [privacy] a [schema]'s statistics before round 1 are a release too, charged first.
        answered = [("statistics", 0), ("evaluate", ROUNDS)]
        ledger_ok = all(entry["releases"] == answered and entry["epsilon"] > 0 for entry in spent.values())
        # The control: exact counts, suppressed jointly at each site.
        control_small: list[str] | None = None
        premise: list[str] = []
        if control.query.sums and sorted(control.counted.sent) == list(FOUR):
            decoded = control.query.sums[0][0][risks:]
            control_small = formable_small(decoded, width, minimum)
            premise = [
                f"{name}: {small}"
                for name in FOUR
                for small in formable_small(control.counted.own[name], width, minimum)
                if small.startswith("cell")
            ]
        said = next((lines[0] for lines in second.values() if lines), None)
        row.record(
            f"forged (c = {C_FORGED}): refusals in the sites' outcome records {forged['refusals']}, sites that "
            f"counted {forged['counted_by']}, evaluations {forged['evaluations']}, sums decoded "
            f"{forged['sums_decoded']}, evaluate releases {forged['evaluate_releases']}; curious, noised: stated "
            f"noise_std {std:.4g} per count; the sites' c {sorted({c for c in attack.counted.c.values() if c is not None})} "
            f"(the served c-bar {served}); decoded count above c {figures.get('above_c_decoded')} against "
            f"{figures.get('above_c_at_served_c')} at the served c; the counts' error "
            f"{figures.get('counts', {}).get('rms_in_std')} std RMS, {figures.get('counts', {}).get('max_in_std')} std "
            f"at most; the rare cell (exact {figures.get('rare_cell_exact')}): its complement read with an error of "
            f"{figures.get('rare_complement_error_in_std')} x sqrt(2) std; the model before round {ROUNDS}'s step: "
            f"evaluations {results}, refused by {refused}, e.g. {short(said, 200)!r}, sums decoded {len(query.sums)}; "
            f"epsilon charged: { {name: entry['epsilon'] for name, entry in spent.items()} }; control without "
            f"[privacy]: counts from 1 to {minimum - 1} formable from the decoded sum: {control_small}, while the "
            f"sites' own unsuppressed cells held {len(premise)} such, e.g. {premise[:3]}",
            forged_refused(forged)
            and carried_out
            and own_ok
            and noise_ok
            and second_refused
            and ledger_ok
            and control_small == []
            and bool(premise),
            forged=forged,
            composition=figures,
            ledger=spent,
            control_premise=premise,
            errors={**attack.errors, **{f"control {k}": v for k, v in control.errors.items()}},
        )
