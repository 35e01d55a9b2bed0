"""The plan's mode = "local": every institution noises its own training by DP-SGD, within the plan's budget.

Red team 2 (F1, F3): a site whose DP-SGD added no noise joined and sent exact updates, and DP-SGD trained on past
the plan's [privacy] budget, which only bound the answers. Real sites over mutual TLS where the break needed them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedfair.privacy.accounting import compute_epsilon
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.privacy import privacy_shortfall
from tests.runtime.harness import Processes, new_workspace

NAMES = ["site-a", "site-b"]
NO_NOISE = "\n[privacy]\nenabled = true\nnoise_multiplier = 0.0\n"
SPENT = re.compile(
    r"\[(site-[ab])\].*?epsilon ([0-9.]+|inf) \(RDP [^)]*\) of budget (\S+) at delta \S+ after (\d+) private rounds"
)
STOPPED = re.compile(
    r"(?P<name>site-[ab]) stops contributing: one more round would bring its epsilon to (?P<epsilon>[0-9.]+), above "
    r"the plan's \[privacy\] budget 0.9 \(delta 1e-05, prv accountant, noise multiplier 0.75 at sample rate "
    r"(?P<rate>[0-9.]+); [0-9.]+ spent over 1 rounds\); only a plan with a larger \[privacy\] budget would let it go on"
)


def with_privacy(path: Path, section: str) -> None:
    path.write_text(path.read_text() + section)


def test_a_site_whose_dp_sgd_adds_no_noise_is_refused_at_join(tmp_path: Path) -> None:
    """The check a site runs at join, on its real config file: enabled at noise multiplier 0 is exact updates."""
    workspace = new_workspace(tmp_path, NAMES, privacy={"mode": "local", "report_epsilon": 1.0})
    with_privacy(workspace.configs["site-a"], NO_NOISE)
    config = load_collaborator_config(workspace.configs["site-a"])
    assert config.privacy.enabled and config.privacy.noise_multiplier == 0.0
    plan = load_aggregator_plan(workspace.plan)
    shortfall = privacy_shortfall(config.privacy, plan.privacy, plan.secure_aggregation.enabled)
    assert shortfall is not None and "noise_multiplier = 0 adds no noise" in shortfall, shortfall
    assert "set target_epsilon = 10 or less" in shortfall


@pytest.mark.slow
def test_real_sites_whose_dp_sgd_adds_no_noise_refuse_a_local_dp_plan(tmp_path: Path, processes: Processes) -> None:
    """Both sites at noise multiplier 0 exit 2 (plan-mismatch) before any update leaves; before, both trained 2 of 2
    rounds with exact updates, each logging epsilon inf."""
    workspace = new_workspace(tmp_path, NAMES, training={"rounds": 2}, privacy={"mode": "local", "report_epsilon": 1.0})
    for name in NAMES:
        with_privacy(workspace.configs[name], NO_NOISE)
    processes.aggregator(workspace)
    sites = [processes.collaborator(workspace, name) for name in NAMES]
    statuses = [site.wait(timeout=180) for site in sites]
    said = processes.tail()
    assert statuses == [2, 2], said
    assert "plan-mismatch" in said and "noise_multiplier = 0 adds no noise" in said, said
    assert not list(tmp_path.rglob("*.bindings.json")), "a refused site opened its one-input record"


@pytest.mark.slow
def test_local_dp_sgd_stops_at_the_plans_budget(tmp_path: Path, processes: Processes) -> None:
    """Sites at noise multiplier 0.75 with no budget of their own, under a plan's budget of 0.9. Rounds are 2 steps
    at q about 0.01, so one round spends about 0.79 and two 0.95 (PRV): each site trains round 1, then refuses
    round 2 naming the plan's budget. Before, the red team's sites (sigma 0.5, budget 1) trained all 3 rounds to
    epsilon 4.07, since DP-SGD stopped only at the site's own budget_epsilon / target_epsilon."""
    budget, sigma = 0.9, 0.75
    workspace = new_workspace(
        tmp_path, NAMES, training={"rounds": 3}, privacy={"mode": "local", "report_epsilon": 0.5, "budget": budget}
    )
    for name in NAMES:
        with_privacy(workspace.configs[name], f"\n[privacy]\nenabled = true\nnoise_multiplier = {sigma}\n")
    aggregator = processes.aggregator(workspace)
    sites = [processes.collaborator(workspace, name) for name in NAMES]
    for site in sites:
        site.wait(timeout=300)
    aggregator.wait(timeout=60)
    said = processes.log.getvalue()
    spent = {(name, float(epsilon), float(of), int(rounds)) for name, epsilon, of, rounds in SPENT.findall(said)}
    assert {(name, rounds) for name, _, _, rounds in spent} == {(name, 1) for name in NAMES}, said[-6000:]
    for name in NAMES:
        refusals = [match for match in STOPPED.finditer(said) if match["name"] == name]
        assert refusals, said[-6000:]
        stopped = refusals[0]
        rate = float(stopped["rate"])
        one, two = (compute_epsilon(sigma, rate, steps, 1e-5, "prv") for steps in (2, 4))
        assert one <= budget < two  # the math says round 2 is the first past the budget
        assert float(stopped["epsilon"]) == pytest.approx(two, abs=1e-3)
        (logged,) = [epsilon for who, epsilon, _, _ in spent if who == name]
        assert logged == pytest.approx(one, abs=1e-3)
    assert all(of == budget for _, _, of, _ in spent)
