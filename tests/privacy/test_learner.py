"""The private learner: DP-SGD steps, joint clipping of theta and c in every clipping mode, noise, budgets end to end."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn
from torch.func import functional_call, grad, vmap

from fedfair.core import server
from fedfair.core.config import LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import BudgetReason, ConfigError, PrivacyBudgetError, QuorumError, QuorumReason
from fedfair.core.local import LocalLearner, contributing_updates
from fedfair.core.models import build_model, flat_parameters, per_sample_loss
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.accounting import PrivacyAccountant, compute_epsilon
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.learner import PrivateLearner
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import SimulationOptions, make_learners
from tests.false_alarm import FALSE_ALARM, Z
from tests.privacy.helpers import (
    DELTA,
    private_config,
    random_samples,
    scripted_probe,
    threshold_learner,
)


def test_private_learner_refuses_what_would_void_the_guarantee() -> None:
    with pytest.raises(ConfigError, match="not enabled"):
        PrivateLearner(threshold_learner(), PrivacyConfig())
    features, labels = random_samples(100, 8)
    reused = LocalLearner(build_model("logreg", 8, 2), features, labels, 10, LocalConfig(reuse_batch=True))
    with pytest.raises(ConfigError, match="reuse-batch"):
        PrivateLearner(reused, private_config(noise_multiplier=1.0))
    with pytest.raises(ConfigError, match="planned_rounds"):
        PrivateLearner(threshold_learner(), private_config(target_epsilon=3.0))


def test_private_path_without_noise_or_clipping_equals_plain_path() -> None:
    """Noise 0, a clip bound above every gradient and the plain batches: the same updates, round after round."""
    plain = threshold_learner()
    private = PrivateLearner(
        threshold_learner(), private_config(noise_multiplier=0.0, max_grad_norm=1e6, poisson_sampling=False)
    )
    theta, c = flat_parameters(plain.model), 1.0
    for _ in range(3):
        expected, actual = plain.train_round(theta, c), private.train_round(theta, c)
        assert float(expected.delta.abs().max()) > 1e-4
        torch.testing.assert_close(actual.delta, expected.delta, rtol=0, atol=1e-13)
        assert actual.delta_c == pytest.approx(expected.delta_c, abs=1e-13)
        assert actual.weight == expected.weight
        theta, c = theta + expected.delta, c + expected.delta_c
    assert private.last_report is not None and math.isinf(private.last_report.epsilon)


def test_theta_and_c_are_clipped_jointly() -> None:
    """One step clips each sample's whole gradient (theta and c together) to C before averaging."""
    objective = ObjectiveConfig(epsilon=0.2, rho=0.3, gamma=0.3, bound=3.0)
    plain = threshold_learner(batch_size=300, local_steps=1, objective=objective)
    clip = 0.05
    model, head = plain.model, plain.threshold
    assert head is not None
    theta0, c0 = flat_parameters(model), 0.8

    def one_sample(params: dict, c: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = per_sample_loss(functional_call(model, params, (x.unsqueeze(0),)), y.unsqueeze(0))
        return functional_call(head, {"c": c}, (loss,)).sum()

    params = {name: parameter.detach().clone() for name, parameter in model.named_parameters()}
    theta_grads, c_grads = vmap(grad(one_sample, argnums=(0, 1)), in_dims=(None, None, 0, 0))(
        params, torch.tensor(c0, dtype=torch.float64), plain.features, plain.labels
    )
    per_sample = torch.cat([theta_grads[name].flatten(1) for name in params] + [c_grads[:, None]], dim=1)
    factors = (clip / (per_sample.norm(dim=1) + 1e-6)).clamp(max=1.0)
    assert float(factors.max()) < 1.0  # every sample is clipped
    mean = (factors[:, None] * per_sample).sum(0) / 300

    # Opacus' hooks go on after the reference: torch.func swaps in parameters the hooks do not know.
    private = PrivateLearner(plain, private_config(noise_multiplier=0.0, max_grad_norm=clip, poisson_sampling=False))
    update = private.train_round(theta0, c0)
    torch.testing.assert_close(update.delta, -0.2 * mean[:-1], rtol=0, atol=1e-14)
    assert update.delta_c == pytest.approx(-0.3 * float(mean[-1]), abs=1e-14)


def test_noise_on_a_zero_gradient_model_is_sigma_c_over_b() -> None:
    """Zero features and eps = 1 make every gradient 0: the update is the noise, std sigma * C / B."""
    dimension, n, batch, sigma, clip = 4000, 64, 32, 2.0, 0.5
    model = nn.Linear(dimension, 1, bias=False).double()
    head = RCVaRThreshold(ObjectiveConfig(epsilon=1.0, bound=10.0), dtype=torch.float64)
    features, labels = torch.zeros(n, dimension, dtype=torch.float64), torch.randint(0, 2, (n,))
    config = LocalConfig(local_steps=1, lr=1.0, threshold_lr=1.0)
    learner = LocalLearner(model, features, labels, batch, config, threshold=head)
    private = PrivateLearner(learner, private_config(noise_multiplier=sigma, max_grad_norm=clip))
    update = private.train_round(torch.zeros(dimension, dtype=torch.float64), 5.0)
    expected = sigma * clip / batch
    # The noise is the CSPRNG's (unseeded): each bound below fails a correct learner at most FALSE_ALARM a run. The
    # sample sd of d Gaussians is within sqrt(1 / (2d)) = 1.1% of the truth (1.15% over 300 runs measured), so 15%
    # is 13 of those; their mean has sd expected / sqrt(d) exactly (z over 300 runs: sd 0.99), at Z = 5.73 (5, as
    # before, failed once in 1.7 million runs); c's noise is one such draw, |N(0, 1)| > 6 once in 500 million.
    assert float(update.delta.std()) == pytest.approx(expected, rel=0.15)
    assert abs(float(update.delta.mean())) < Z * expected / math.sqrt(dimension)
    assert 0.0 < abs(update.delta_c) < 6 * expected  # c is noised too


def test_poisson_batches_have_the_expected_size_and_may_be_empty() -> None:
    features, labels = random_samples(2000, 3)
    learner = LocalLearner(
        build_model("logreg", 3, 2, dtype=torch.float64), features, labels, 1, LocalConfig(local_steps=400)
    )
    private = PrivateLearner(learner, private_config(noise_multiplier=1.0))
    update = private.train_round(torch.zeros(4, dtype=torch.float64), 0.0)
    sizes = np.diff(private._bounds)
    # Each of the 2,000 records joins each of the 400 batches with probability 1 / 2,000 (the CSPRNG's draws,
    # unseeded): the batches' total is Binomial(800,000, 1 / 2,000), held to its central 1 - FALSE_ALARM (mean
    # 0.73 to 1.30 a batch; the former +/- 0.25 failed a correct sampler once in 1.4 million runs). A rate off by a
    # half or twice still fails.
    total = stats.binom(sizes.size * 2000, 1 / 2000)
    assert total.ppf(FALSE_ALARM / 2) <= sizes.sum() <= total.isf(FALSE_ALARM / 2), sizes.sum()
    assert (sizes == 0).any()  # an empty sample still takes a (pure-noise) step
    assert bool(torch.isfinite(update.delta).all())


def test_target_epsilon_is_spent_by_the_planned_rounds_and_then_guarded() -> None:
    private = PrivateLearner(threshold_learner(local_steps=2), private_config(target_epsilon=4.0), planned_rounds=3)
    theta = flat_parameters(private.learner.model)
    for _ in range(3):
        private.train_round(theta, 1.0)
    assert private.last_report is not None
    assert 3.98 <= private.last_report.epsilon <= 4.0
    with pytest.raises(PrivacyBudgetError, match="above its budget 4"):
        private.train_round(theta, 1.0)
    assert private.accountant.rounds == 3


def test_the_plans_budget_stops_the_steps_where_it_is_below_the_institutions_own() -> None:
    """Red team 2 (F3): a site's steps stopped only at its own budget_epsilon / target_epsilon, so under a plan's
    budget of 1 DP-SGD trained on to epsilon 4. Rounds of 3 steps at sigma 1, q 0.1 (RDP): the plan's budget, set
    between two and three rounds' epsilon, admits two rounds and refuses the third, naming the plan's budget."""
    rate = 30 / 300
    two, three = (compute_epsilon(1.0, rate, steps, DELTA, "rdp") for steps in (6, 9))
    budget = (two + three) / 2
    private = PrivateLearner(
        threshold_learner(), private_config(noise_multiplier=1.0, budget_epsilon=10.0), plan_budget=budget
    )
    assert private.budget == budget
    theta = flat_parameters(private.learner.model)
    for _ in range(2):
        private.train_round(theta, 1.0)
    assert private.last_report is not None and private.last_report.budget == budget
    assert private.last_report.epsilon == pytest.approx(two, rel=1e-9)
    with pytest.raises(PrivacyBudgetError, match=f"above the plan's \\[privacy\\] budget {budget:g}") as stopped:
        private.train_round(theta, 1.0)
    assert "only a plan with a larger [privacy] budget" in str(stopped.value)
    assert private.accountant.rounds == 2
    # The institution's own budget binds where lower, and is named.
    own = PrivateLearner(
        threshold_learner(), private_config(noise_multiplier=1.0, budget_epsilon=budget), plan_budget=10.0
    )
    own.train_round(theta, 1.0)
    own.train_round(theta, 1.0)
    with pytest.raises(PrivacyBudgetError, match="above its budget .*only a larger budget_epsilon"):
        own.train_round(theta, 1.0)


@pytest.mark.parametrize("sigma", [0.0, 0.05])
def test_steps_too_noiseless_for_one_round_within_the_budget_never_train(sigma: float) -> None:
    """Red team 2 (F1): no noise (epsilon inf) or too little for one round: refused before the first step, naming
    more noise or a target within the budget as the fix; nothing is spent."""
    private = PrivateLearner(threshold_learner(), private_config(noise_multiplier=sigma), plan_budget=1.0)
    with pytest.raises(PrivacyBudgetError, match="cannot train one round within it; set a larger noise_multiplier"):
        private.train_round(flat_parameters(private.learner.model), 1.0)
    assert private.accountant.rounds == 0 and private.last_report is None


def test_spent_budget_stops_one_collaborator_and_the_federation_goes_on(
    small_adult_federation: Federation, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    objective = ObjectiveConfig(epsilon=0.1, rho=0.3, bound=3.0)
    training = TrainingConfig(rounds=4, batch_size=97, local=LocalConfig(local_steps=2))
    names = [client.name for client in small_adult_federation.train]
    template, plain = make_learners(
        small_adult_federation, training, objective, options=SimulationOptions(model="logreg", dtype="float64")
    )
    rate = plain[0].batch_size / plain[0].num_samples
    # Enough for two rounds of the first collaborator, not three.
    budget = 0.5 * (compute_epsilon(1.0, rate, 4, DELTA, "rdp") + compute_epsilon(1.0, rate, 6, DELTA, "rdp"))
    configs = [private_config(noise_multiplier=1.0, budget_epsilon=budget)] + [private_config(noise_multiplier=1.0)] * 2
    paths = [tmp_path / f"{name}.privacy.json" for name in names]
    learners = [
        PrivateLearner(learner, config, accountant=PrivacyAccountant(path), name=name)
        for learner, config, path, name in zip(plain, configs, paths, names, strict=True)
    ]

    state = server.init(flat_parameters(template), bound=objective.bound)
    active: list = list(learners)
    contributors = []
    with caplog.at_level(logging.INFO, logger="fedfair.privacy"):
        for _ in range(training.rounds):
            updates, active = contributing_updates(active, state.theta, state.c, quorum=2)
            contributors.append(len(updates))
            state = server.apply(state, server.Aggregate.of(updates), bound=objective.bound)
    assert contributors == [3, 3, 2, 2] and state.round == 4
    assert learners[0] not in active
    assert f"{names[0]} stops contributing" in caplog.text
    assert caplog.text.count(f"{names[1]}: epsilon") == 4  # the cumulative epsilon, logged every round
    assert learners[1].last_report is not None and learners[1].last_report.rounds == 4
    assert (PrivacyAccountant(paths[0]).rounds, PrivacyAccountant(paths[0]).steps) == (2, 4)

    # Restarted from its state file, the spent collaborator refuses before training anything.
    _, fresh = make_learners(small_adult_federation, training, objective)
    restarted = PrivateLearner(fresh[0], configs[0], accountant=PrivacyAccountant(paths[0]), name=names[0])
    before = flat_parameters(fresh[0].model)
    with pytest.raises(PrivacyBudgetError, match="stops contributing") as spent:
        restarted.train_round(state.theta, state.c)
    assert spent.value.reason is BudgetReason.LEARNER_SPENT
    assert torch.equal(flat_parameters(fresh[0].model), before)
    with pytest.raises(QuorumError, match="below the quorum of 3") as lost:
        contributing_updates([restarted, *active], state.theta, state.c, quorum=3)
    assert lost.value.reason is QuorumReason.LOST


def small_learner(model: str, seed: int = 3) -> LocalLearner:
    """A float64 learner with a threshold head on 1 x 6 x 6 "images" (flat rows of 36), seeded."""
    features, labels = random_samples(400, 36, seed=seed)
    if model == "conv":
        network: nn.Module = nn.Sequential(
            nn.Unflatten(1, (1, 6, 6)), nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.LayerNorm(48), nn.Linear(48, 1)
        )
        network = network.double()
    else:
        network = build_model(model, 36, 2, dtype=torch.float64)
    head = RCVaRThreshold(ObjectiveConfig(epsilon=0.2, rho=0.3, bound=3.0), dtype=torch.float64)
    config = LocalConfig(local_steps=3, lr=0.2, threshold_lr=0.3)
    return LocalLearner(network, features, labels, 40, config, threshold=head, seed=7)


@pytest.mark.parametrize(
    ("model", "auto", "modes"),
    [
        ("mlp", "one_pass", {"one_pass", "norm"}),
        ("logreg", "one_pass", {"one_pass", "norm"}),
        ("conv", "norm", {"norm"}),
    ],
)
def test_norm_only_and_per_sample_clipping_run_the_same_private_rounds(model: str, auto: str, modes: set[str]) -> None:
    """Same Poisson batches from the same sampling seed, the same clipped updates (noise 0), the same epsilon."""
    rounds: dict[str, list[object]] = {}
    for clipping in (*sorted(modes), "per_sample"):
        torch.manual_seed(0)
        private = PrivateLearner(
            small_learner(model), private_config(noise_multiplier=0.0, max_grad_norm=0.5), clipping=clipping
        )
        private._sampling.manual_seed(11)  # in place of OS entropy, so that both draw the same samples
        theta, c, history = flat_parameters(private.learner.model), 1.0, []
        for _ in range(3):
            update = private.train_round(theta, c)
            history.append((private._bounds, private._index.clone(), update))
            theta, c = theta + update.delta, c + update.delta_c
        assert private.last_report is not None
        rounds[private.clipping] = [*history, private.last_report]
    assert set(rounds) == modes | {"per_sample"}
    # For the CNN "auto" times norm-only against per-sample clipping: here norm-only takes 1 s and per-sample 2 s.
    probe = scripted_probe(1.0, 2.0)
    assert PrivateLearner(small_learner(model), private_config(noise_multiplier=0.0), probe=probe).clipping == auto
    *sample_rounds, sample_report = rounds["per_sample"]
    for mode in modes:
        *norm_rounds, norm_report = rounds[mode]
        for (bounds, index, norm_update), (same_bounds, same_index, sample_update) in zip(
            norm_rounds, sample_rounds, strict=True
        ):
            assert bounds == same_bounds and torch.equal(index, same_index)
            assert float(sample_update.delta.abs().max()) > 1e-4
            # float64: the per-step difference is a few ulps of the gradient sums (test_clipping derives it).
            torch.testing.assert_close(norm_update.delta, sample_update.delta, rtol=0, atol=1e-10)
            assert norm_update.delta_c == pytest.approx(sample_update.delta_c, abs=1e-10)
        assert (norm_report.clipping, sample_report.clipping) == (mode, "per_sample")
        assert replace(norm_report, clipping=None) == replace(sample_report, clipping=None)


def test_every_clipping_mode_spends_the_same_epsilon_and_names_itself() -> None:
    reports = []
    for clipping in ("one_pass", "norm", "per_sample"):
        private = PrivateLearner(small_learner("mlp"), private_config(noise_multiplier=1.0), clipping=clipping)
        private.train_round(flat_parameters(private.learner.model), 1.0)
        reports.append(private.report())
        # One set of hooks per model, whichever mode installed them first.
        with pytest.raises(ConfigError, match="already has clipping hooks"):
            PrivateLearner(private.learner, private_config(noise_multiplier=1.0), clipping="one_pass")
    assert math.isfinite(reports[0].epsilon)
    assert all(replace(report, clipping=None) == replace(reports[0], clipping=None) for report in reports)
    assert [report.clipping for report in reports] == ["one_pass", "norm", "per_sample"]
    assert "one-pass norm-only clipping" in reports[0].describe() and "per-sample clipping" in reports[2].describe()
    assert reports[1].describe().endswith("rdp accountant, norm-only clipping)")


def test_a_layer_without_a_gradient_norm_falls_back_to_per_sample_gradients() -> None:
    features, labels = random_samples(200, 8)

    def learner() -> LocalLearner:
        model = nn.Sequential(nn.Linear(8, 4), nn.PReLU(4), nn.Linear(4, 1)).double()
        return LocalLearner(model, features, labels, 20, LocalConfig(local_steps=2))

    private = PrivateLearner(learner(), private_config(noise_multiplier=1.0))
    assert private.clipping == "per_sample"
    update = private.train_round(flat_parameters(private.learner.model), 0.0)
    assert bool(torch.isfinite(update.delta).all()) and float(update.delta.abs().max()) > 0
    assert private.last_report is not None and private.last_report.clipping == "per_sample"
    with pytest.raises(ConfigError, match=r"PReLU.*'per_sample'"):
        PrivateLearner(learner(), private_config(noise_multiplier=1.0), clipping="norm")


class Squared(nn.Module):
    """One dense layer applied twice: tying that only the forward pass reveals."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.layer(x))[:, :1]


@pytest.mark.parametrize("clipping", ["auto", "norm"])
def test_a_layer_called_twice_is_refused_in_norm_only_clipping_naming_the_fix(clipping: str) -> None:
    features, labels = random_samples(200, 8)
    learner = LocalLearner(Squared().double(), features, labels, 20, LocalConfig(local_steps=1))
    private = PrivateLearner(learner, private_config(noise_multiplier=1.0), clipping=clipping)
    assert private.clipping == ("one_pass" if clipping == "auto" else "norm")
    with pytest.raises(ConfigError, match="norm-only clipping cannot train this model.*clipping='per_sample'"):
        private.train_round(flat_parameters(learner.model), 0.0)
    learner = LocalLearner(Squared().double(), features, labels, 20, LocalConfig(local_steps=1))
    update = PrivateLearner(learner, private_config(noise_multiplier=1.0), clipping="per_sample").train_round(
        flat_parameters(learner.model), 0.0
    )
    assert bool(torch.isfinite(update.delta).all())


def test_distributed_mode_sends_the_clipped_sum_without_noise_and_charges_the_secure_sums_noise() -> None:
    """Under distributed DP a round is one step whose weighted update is -lr times the clipped sum (c's with
    its own step and bound): no local noise, so with every record sampled (rate 1) it is exact."""
    from fedfair.privacy.distributed import padded_dimension, training_noise
    from fedfair.privacy.calibration import record_sensitivity
    from tests.privacy.test_clipping import per_sample_gradients

    learner = threshold_learner(n=60, batch_size=20, local_steps=1, model="logreg")
    theta_0 = flat_parameters(learner.model).clone()
    gradients = per_sample_gradients(learner, learner.features, learner.labels)
    norm, threshold_norm = float(gradients[:, :-1].norm(dim=1).median()), 0.05
    privacy = private_config(
        target_epsilon=2.0,
        mode="distributed",
        sample_rate=1.0,
        max_grad_norm=norm,
        threshold_max_grad_norm=threshold_norm,
    )
    private = PrivateLearner(learner, privacy, planned_rounds=4)
    assert private.noise_multiplier == 0.0 and private.clipping == "one_pass"
    assert learner.threshold is not None
    c_0 = float(learner.threshold.c.detach())  # the gradients above were taken at (theta_0, c_0)
    update = private.train_round(theta_0, c_0)
    theta, c = gradients[:, :-1], gradients[:, -1]
    clipped_theta = ((norm / (theta.norm(dim=1) + 1e-6)).clamp(max=1.0)[:, None] * theta).sum(dim=0)
    clipped_c = ((threshold_norm / (c.abs() + 1e-6)).clamp(max=1.0) * c).sum()
    expected = torch.cat([-0.2 * clipped_theta, -0.3 * clipped_c.reshape(1)])
    assert update.weight == 20.0
    assert torch.allclose(update.weighted_vector(), expected, rtol=0, atol=1e-12 * float(gradients.abs().sum()))
    # One round of four charged; the plan's noise makes four rounds spend exactly the target.
    noise = training_noise(
        2.0, DELTA, record_sensitivity(0.2, 0.3, norm, threshold_norm), 1.0, 4, padded_dimension(theta.shape[1] + 1)
    )
    assert private.distributed_noise == noise
    assert private.report().epsilon == pytest.approx(noise.epsilon(1, DELTA))
    for _ in range(3):
        private.train_round(theta_0, c_0)
    assert 1.99 <= private.report().epsilon <= 2.0


def test_distributed_mode_refuses_what_its_accounting_cannot_cover() -> None:
    privacy = private_config(target_epsilon=2.0, mode="distributed")
    with pytest.raises(ConfigError, match="local_steps = 1"):
        PrivateLearner(threshold_learner(local_steps=3, model="logreg"), privacy, planned_rounds=4)
    dense = threshold_learner(local_steps=1, model="logreg")
    normalised = nn.Sequential(nn.Linear(8, 4), nn.LayerNorm(4), nn.Linear(4, 1)).double()
    not_dense = LocalLearner(normalised, dense.features, dense.labels, 30, dense.config, threshold=dense.threshold)
    with pytest.raises(ConfigError, match="one-pass clipping cannot train this model"):
        PrivateLearner(not_dense, privacy, planned_rounds=4)
    with pytest.raises(ConfigError, match="target_epsilon"):
        private_config(noise_multiplier=1.0, mode="distributed")
    with pytest.raises(ConfigError, match="distributed privacy only"):
        private_config(target_epsilon=1.0, sample_rate=0.1)
