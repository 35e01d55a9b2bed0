"""Distributed DP under the two-verifier input bound (issue 80): each verifier adds the noise, each site charges it.

Each verifier's noise is the masked round's whole noise for the same plan (issue 93: what either verifier alone faces),
so each bounded round a site takes part in is charged exactly what a masked DP round of that plan charges. As processes: an aggregator, three sites and
`fedfair auditor start` apply both rounds, and each site's ledger holds both rounds' entries.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fedfair.privacy import distributed
from fedfair.privacy.distributed import TrainingNoise
from fedfair.privacy.ledger import Ledger
from fedfair.runtime.collaborator.charges import Charges, open_ledger
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.plan.aggregator_plan import AggregatorPlan, load_aggregator_plan, load_shared_settings
from fedfair.runtime.plan.aggregator_plan import shared_settings
from fedfair.runtime.plan.bounded_noise import bounded_noise_mu
from tests.runtime.harness import Processes
from tests.runtime.test_bounded_plan import DP
from tests.runtime.test_bounded_processes import NAMES, ROUNDS, bounded_workspace, every_round_applied
from tests.runtime.test_input_bound import ON, federation  # noqa: F401 (the fixture)
from tests.runtime.test_manifest import aggregator_plan_with
from tests.runtime.test_plan import collaborator_config

DIMENSION = 1000
CHARGED_ROUNDS = 3


def charged_epsilon(folder: Path, loaded: AggregatorPlan, rounds: int) -> tuple[float, list[dict[str, object]]]:
    """What a site of `loaded` has spent after charging `rounds` training rounds, and its ledger's entries."""
    shared = load_shared_settings(shared_settings(loaded))
    config = collaborator_config()
    ledger = Ledger(folder / "site.ledger.json", config.name, {"csv": str(folder)})
    charges = Charges(config, shared, InputRecord(folder / "site.bindings.json", loaded.federation_id, ledger=ledger))
    for round_number in range(1, rounds + 1):
        charges.training(round_number, f"model-{round_number}", DIMENSION)
    return ledger.spent(shared.privacy.delta), ledger.releases()


def exact_epsilon(loaded: AggregatorPlan, noise: TrainingNoise, rounds: int) -> float:
    """The accountant's epsilon of `rounds` steps of the calibrated release, delta less their shares of the add-on."""
    addon = rounds * noise.addon / noise.release.steps
    return distributed.epsilon([dataclasses.replace(noise.release, steps=rounds)], loaded.privacy.delta - addon)


def test_each_bounded_round_is_charged_what_a_masked_round_of_the_plan_charges(
    tmp_path: Path,
    federation: Path,  # noqa: F811
) -> None:
    """R bounded rounds spend the accountant's epsilon of R steps at one verifier's mu, as R masked rounds do.

    Computed directly: R steps of the calibrated release, delta less R rounds' shares of the add-on; to 1e-9
    relative (the ledger sums the add-on term by term).
    """
    bounded = aggregator_plan_with(federation, secure_aggregation=ON, **DP)
    masked = aggregator_plan_with(federation, **DP)
    (tmp_path / "bounded").mkdir()
    (tmp_path / "masked").mkdir()
    spent, entries = charged_epsilon(tmp_path / "bounded", bounded, CHARGED_ROUNDS)
    masked_spent, masked_entries = charged_epsilon(tmp_path / "masked", masked, CHARGED_ROUNDS)
    noise, _ = masked.training_noise(len(masked.collaborators), DIMENSION)
    exact = exact_epsilon(masked, noise, CHARGED_ROUNDS)
    assert exact > 0
    assert spent == pytest.approx(exact, rel=1e-9)
    assert spent == pytest.approx(masked_spent, rel=1e-9)
    assert [entry["round"] for entry in entries] == list(range(1, CHARGED_ROUNDS + 1))
    mu = bounded_noise_mu(bounded, len(bounded.collaborators), DIMENSION)
    assert all(entry["kind"] == "train" and entry["mechanism"] == "skellam" for entry in entries)
    assert all(entry["mu"] == mu and entry["l2"] == noise.release.l2 for entry in entries)
    assert [{**entry, "prev": None} for entry in entries] == [{**entry, "prev": None} for entry in masked_entries]


@pytest.mark.slow
def test_a_bounded_dp_federation_applies_its_rounds_and_each_site_charges_them(
    tmp_path: Path, processes: Processes
) -> None:
    workspace = bounded_workspace(tmp_path, privacy=DP["privacy"])
    log = every_round_applied(processes, workspace)
    loaded = load_aggregator_plan(workspace.plan)
    for name in NAMES:
        ledger = open_ledger(load_collaborator_config(workspace.configs[name]))
        entries = ledger.releases()
        assert [(entry["kind"], entry["round"]) for entry in entries] == [("train", r) for r in range(1, ROUNDS + 1)]
        # A training release averages over the rounding of the (padded) dimension it was calibrated for.
        noise, _ = loaded.training_noise(len(NAMES), int(entries[0]["rounding"]))  # type: ignore[call-overload]
        assert all(entry["mu"] == noise.release.mu for entry in entries), entries
        assert ledger.spent(loaded.privacy.delta) == pytest.approx(exact_epsilon(loaded, noise, ROUNDS), rel=1e-9)
    # The sum carries each verifier's Skellam(mu), the charge each alone faces (issue 93): std sqrt(2 x 2 mu) in the
    # encoded scale, over the total weight.
    weight = sum(loaded.influence.weight_of(name, loaded.batch_fraction) for name in NAMES)
    std = (2 * 2 * noise.release.mu) ** 0.5 * 2.0**-noise.fractional_bits / weight
    assert all(record["mean_update_noise_std"] == pytest.approx(std, rel=1e-9) for record in log), log
