"""The noise scenario's training differencing row: round 1 with every site less round 2 without the victim.

Under distributed DP-SGD, round 2 on M + 1 ulp (a fresh input on an all but unchanged model) is refused by every
site sent it: it is not the plan's server step of round 1's verified sum (NEXT_MODEL). A curious aggregator runs
round 2 on that step's model instead and reads round 1's decoded sum less round 2's as the victim's update: it
carries the noise of both sums, beside controls without privacy (Poisson samples, then full batches, where the
reading misses the victim only by the other sites' change across the step).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from attacks.cheating import collaborator_log
from attacks.pinned_federation import FOUR, LoopAggregator, StageTap, pinned_workspace, round_log
from attacks.federation import kept_state, wire_ulp_up
from attacks.noise_figures import NOISE_BAND, OPERATOR, VICTIM, error_figures, ledger, refusals, run_federation, within
from attacks.rows import RowBook
from fedfair.runtime.aggregator.checks import SumOutcome
from fedfair.runtime.aggregator.loop import RoundLoop
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.contract import TRAINING
from fedfair.runtime.local.workspace import Workspace, declared_sizes
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

# ---------------------------------------------------------------- training differencing


TRAINING_PRIVACY: dict[str, Any] = {
    "mode": "distributed",
    "epsilon": 3.0,
    "report_epsilon": 1.0,
    "delta": 1e-5,
    "budget": 10.0,
}
"""The training row's [privacy]: distributed DP-SGD, the plan's two rounds spending epsilon 3 at delta 1e-5 (and its
evaluation answers noised at epsilon 1, as a plan with training DP must)."""
BATCH_FRACTION = 0.05
"""Poisson sampling rate of every site's DP-SGD step (the plan's batch_fraction), in the attack and the control."""


@dataclass
class Differencing:
    """Round 1 on the model M with every site; round 2 without `leave_out`, on the model the plan's server step
    makes of round 1's verified sum or, if `forged`, on M + 1 ulp (theta[0] one ulp up: a new model digest, so a
    fresh input, were the chain not to refuse it). Each decoded training sum is kept with its stated noise std
    and total weight."""

    leave_out: str
    forged: bool = False
    sums: dict[int, SumOutcome] = field(default_factory=dict)

    def adjust(self, loop: RoundLoop) -> None:
        train, participants, run = loop.train, loop.choose_participants, loop.driver.run

        def held_train(round_number: int, **options: Any) -> dict[str, Any]:
            before = kept_state(loop.checkpoint.state)
            record = train(round_number, **options)
            if self.forged and round_number == 1:  # the model is not advanced, but moved one ulp
                theta = before.theta.clone()
                theta[0] = wire_ulp_up(float(theta[0]))
                loop.checkpoint = dataclasses.replace(loop.checkpoint, state=dataclasses.replace(before, theta=theta))
            return record

        def chosen(round_number: int, **options: Any) -> frozenset[str]:
            connected = participants(round_number, **options)
            return connected - {self.leave_out} if round_number == 2 else connected

        def recording(round_number: int, stages: Any, *args: Any, **options: Any) -> SumOutcome:
            outcome = run(round_number, stages, *args, **options)
            if stages is TRAINING:
                self.sums[round_number] = dataclasses.replace(outcome, weighted_sum=outcome.weighted_sum.copy())
            return outcome

        loop.train = held_train  # type: ignore[method-assign]
        loop.choose_participants = chosen  # type: ignore[method-assign]
        loop.driver.run = recording  # type: ignore[method-assign]


@dataclass
class Updates:
    """Each site's trained update as it computed it, before encoding, noise and masking: [w delta, w delta_c]
    and w, by round; widened to float64, so that summing them in-process adds no rounding of its own."""

    by_site: dict[str, dict[int, tuple[np.ndarray, float]]] = field(default_factory=dict)

    def adjust(self, name: str, collaborator: Collaborator) -> None:
        train_on = collaborator.train_on

        def recorded(stub: Any, binding: Any, *args: Any, **options: Any) -> Any:
            trained = train_on(stub, binding, *args, **options)
            if trained.vector is not None:
                self.by_site.setdefault(name, {})[int(binding.round)] = (
                    np.array(trained.vector, dtype=np.float64),
                    trained.weight,
                )
            return trained

        collaborator.train_on = recorded  # type: ignore[method-assign]


@dataclass
class TrainingRun:
    workspace: Workspace
    cheat: Differencing
    updates: Updates
    log: dict[int, dict[str, Any]]
    errors: dict[str, str]


def training_run(
    root: Path, *, private: bool, batch_fraction: float = BATCH_FRACTION, forged: bool = False
) -> TrainingRun:
    """The pinned four-site federation (min_round_size 3, dropouts allowed, declared sizes, one local step a
    round at `batch_fraction`, 64-bit words) against :class:`Differencing` (`forged`: round 2 on M + 1 ulp);
    under TRAINING_PRIVACY when `private`, else without [privacy] (the controls)."""
    sources = {name: {"dataset": "adult", "partition": "race", "index": index} for index, name in enumerate(FOUR)}
    sections: dict[str, dict[str, Any]] = {
        "training": {"local_steps": 1, "batch_fraction": batch_fraction},
        "secure_aggregation": {"modulus_bits": 64},
        "influence": {"weights": "declared", "sizes": declared_sizes(sources, 0) or {}},
    }
    if private:
        sections["privacy"] = TRAINING_PRIVACY
    workspace = pinned_workspace(root, quorum=3, rounds=2, **sections)
    plan = load_aggregator_plan(workspace.plan)
    cheat, updates = Differencing(VICTIM, forged), Updates()
    aggregator = LoopAggregator(plan, StageTap().install, cheat.adjust)
    with collaborator_log():
        errors = run_federation(workspace, aggregator, lambda name: None, updates.adjust)
    return TrainingRun(workspace, cheat, updates, round_log(workspace), errors)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def measure_training(run: TrainingRun) -> dict[str, Any]:
    """The attacker's reading (round 1's sum less round 2's) against the victim's update, and the noise in it."""
    sums_, updates = run.cheat.sums, run.updates.by_site
    others = sorted(set(FOUR) - {VICTIM})
    carried_out = (
        {1, 2} <= sums_.keys()
        and sorted(sums_[1].contributors) == list(FOUR)
        and sorted(sums_[2].contributors) == others
        and all(1 in updates.get(name, {}) for name in FOUR)
        and all(2 in updates.get(name, {}) for name in others)
        and 2 not in updates.get(VICTIM, {})
        and run.log.get(1, {}).get("model_sha256") != run.log.get(2, {}).get("model_sha256")
    )
    if not carried_out:
        return {"carried_out": False}
    victim = updates[VICTIM][1][0]
    read = sums_[1].weighted_sum - sums_[2].weighted_sum
    exact = np.sum([updates[name][1][0] for name in FOUR], axis=0) - np.sum(
        [updates[name][2][0] for name in others], axis=0
    )
    stds = [sums_[number].noise_std for number in (1, 2)]
    logged = [
        float(run.log[number].get("mean_update_noise_std", 0.0)) * float(run.log[number].get("total_weight", 0.0))
        for number in (1, 2)
    ]
    std = math.hypot(*stds)
    noise = read - exact
    return {
        "carried_out": True,
        "dimension": int(victim.size),
        "cosine": round(cosine(read, victim), 4),
        "relative_error": round(float(np.linalg.norm(read - victim) / np.linalg.norm(victim)), 4),
        # Without the noise the reading would miss only by the other sites' own change between the rounds: their
        # fresh Poisson samples, and the model's one server step (the chain refuses any other round 2 model).
        "others_change_relative_error": round(float(np.linalg.norm(exact - victim) / np.linalg.norm(victim)), 4),
        "victim_rms": float(np.sqrt(np.mean(victim**2))),
        "noise_std_per_sum": [float(value) for value in stds],
        "noise_std_logged": logged,
        "std": std,
        "noise": error_figures(noise, std) if std > 0 else {},
        # Without noise the departure is the encoding's rounding: within the two sums' stated error bounds.
        "largest_departure": float(np.abs(noise).max()),
        "rounding_bound": float(sums_[1].error_bound + sums_[2].error_bound),
        "total_weight": [float(sums_[number].total_weight) for number in (1, 2)],
    }


def forged_training(run: TrainingRun) -> dict[str, Any]:
    """What the 1-ulp round 2 got: each site's refusal (outcome record), who trained on it, what was decoded and
    what each ledger charged."""
    spent = ledger(run.workspace, FOUR, float(TRAINING_PRIVACY["delta"]))
    return {
        "refusals": refusals(run.workspace, FOUR),
        "round_2_decoded": 2 in run.cheat.sums,
        "trained_in_round_2": sorted(name for name, rounds in run.updates.by_site.items() if 2 in rounds),
        "releases": {name: entry["releases"] for name, entry in spent.items()},
    }


def forged_refused(figures: Mapping[str, Any]) -> bool:
    """Every site sent M + 1 ulp refused it (round 2, NEXT_MODEL), the victim (left out) refused nothing, nobody
    trained on it, its round was not decoded, and every ledger holds round 1's training release alone (beside the
    noised evaluation answers a plan with training DP must have)."""
    found = figures["refusals"]
    trained = [[release for release in releases if release[0] == "train"] for releases in figures["releases"].values()]
    return (
        all(found[name] == (2, "NEXT_MODEL") for name in FOUR if name != VICTIM)
        and found[VICTIM] is None
        and figures["trained_in_round_2"] == []
        and not figures["round_2_decoded"]
        and all(releases == [("train", 1)] for releases in trained)
    )


def training_row(root: Path, book: RowBook) -> None:
    delta = float(TRAINING_PRIVACY["delta"])
    with book.row(
        f'noise, training differencing: [privacy] mode = "distributed" (epsilon 3 over the plan\'s 2 rounds, delta '
        f"1e-5; local_steps 1, batch_fraction {BATCH_FRACTION}, declared sizes, 64-bit words), dropouts allowed: round 1 "
        f"on model M with every site, round 2 without {VICTIM} on M + 1 ulp (forged) or, curious only, on the model "
        f"the plan's server step makes of round 1's verified sum: round 1's decoded sum less round 2's would be "
        f"{VICTIM}'s update",
        f"M + 1 ulp is refused by every site it is sent to (its outcome record: round 2, NEXT_MODEL): nobody trains on "
        "it, its round is not decoded, each ledger holds round 1's release alone; curious only, the difference carries "
        "the noise of two sums: its departure from the un-noised difference (the sites' updates as they computed "
        f"them) is within {list(NOISE_BAND)} x sqrt(s1^2 + s2^2), s the stated noise std per coordinate "
        "(mean_update_noise_std x total_weight in the round log), and the reading misses the victim's update by "
        "more than without privacy (the control: the same plan and attack without [privacy], where only the other "
        "sites' own change between the rounds blurs it: fresh Poisson samples and the model's one step; with full "
        "batches the decoded difference is the sites' own within the two sums' stated rounding bound); each site's ledger holds one "
        f"train release per round it trained ({VICTIM} one)",
        OPERATOR,
    ) as row:
        forged = forged_training(training_run(root / "forged", private=True, forged=True))
        attack = training_run(root / "private", private=True)
        control = training_run(root / "control", private=False)
        full = training_run(root / "full-batches", private=False, batch_fraction=1.0)
        noised, plain, exact = measure_training(attack), measure_training(control), measure_training(full)
        spent = ledger(attack.workspace, FOUR, delta)
        ledger_ok = all(
            spent[name]["releases"] == [("train", 1)] + ([] if name == VICTIM else [("train", 2)]) for name in FOUR
        )
        figures = noised.get("noise", {})
        stated = noised.get("noise_std_per_sum", [0.0, 0.0])
        logged_ok = noised.get("carried_out") and all(
            math.isclose(a, b, rel_tol=1e-6) for a, b in zip(stated, noised["noise_std_logged"], strict=True)
        )
        row.record(
            f"forged (M + 1 ulp): refusals in the sites' outcome records {forged['refusals']}, trained on it "
            f"{forged['trained_in_round_2']}, round 2 decoded {forged['round_2_decoded']}, releases "
            f"{forged['releases']}; curious, noised: stated noise std per coordinate {stated[0]:.4g} (round 1) and "
            f"{stated[1]:.4g} (round 2; mean_update_noise_std x total_weight in the round log: "
            f"{noised.get('noise_std_logged')}), so {noised.get('std', 0):.4g} on the difference, against a victim "
            f"update of RMS {noised.get('victim_rms', 0):.3g} per coordinate ({noised.get('dimension')} values); the "
            f"noise in the reading: {figures.get('rms_in_std')} std RMS, {figures.get('max_in_std')} std at most; the "
            f"reading against {VICTIM}'s update: cosine {noised.get('cosine')}, relative error "
            f"{noised.get('relative_error')} (the other sites' own change alone: "
            f"{noised.get('others_change_relative_error')}); epsilon charged: "
            f"{ {name: entry['epsilon'] for name, entry in spent.items()} }; control without [privacy]: cosine "
            f"{plain.get('cosine')}, relative error {plain.get('relative_error')}; with full batches: cosine "
            f"{exact.get('cosine')}, relative error {exact.get('relative_error')} (the others' change from M to the "
            f"step's model), the decoded difference off the sites' own by {exact.get('largest_departure')} at most (the sums' rounding bound "
            f"{exact.get('rounding_bound')})",
            forged_refused(forged)
            and bool(noised.get("carried_out"))
            and bool(plain.get("carried_out"))
            and bool(logged_ok)
            and bool(exact.get("carried_out"))
            and stated[0] > 0.0
            and within(figures.get("rms_in_std"))
            and within(figures.get("max_over_expected"))
            and plain.get("noise_std_per_sum") == [0.0, 0.0]
            and noised["relative_error"] > plain["relative_error"]
            and exact["largest_departure"] <= exact["rounding_bound"]
            and ledger_ok
            and all(entry["epsilon"] > 0.0 for entry in spent.values()),
            forged=forged,
            attack=noised,
            control=plain,
            full_batches=exact,
            ledger=spent,
            errors={
                **attack.errors,
                **{f"control {k}": v for k, v in control.errors.items()},
                **{f"full batches {k}": v for k, v in full.errors.items()},
            },
        )
