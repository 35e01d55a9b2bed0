"""The private learner: DP-SGD on a collaborator's local steps, refusing rounds past its budget.

Every local step is DP-SGD through Opacus (the recipe is in docs/design.md, "Inside the privacy
library"). The clipping needs only each sample's gradient norm where the model allows it
(:mod:`fedfair.privacy.clipping`): one backward pass for dense layers ("one_pass"), two for the
other layers with a norm sampler ("norm"), or every per-sample gradient ("per_sample"; "auto"
times the last two where both apply, :mod:`fedfair.privacy.probe`); all give the same update up to
float rounding, and the mode that runs is ``PrivateLearner.clipping``, part of every
``PrivacyReport``. Poisson samples and noise come from OS entropy, never from the plan's
seed, which the aggregator knows. A round that would push epsilon past the budget is refused
before it trains (``PrivacyBudgetError``, LEARNER_SPENT).
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from fedfair.core.errors import BudgetReason, ConfigError, PrivacyBudgetError
from fedfair.core.local import LocalLearner
from fedfair.core.update import Update
from fedfair.privacy.accounting import DistributedAccountant, PrivacyAccountant, noise_multiplier_for
from fedfair.privacy.calibration import distributed_training_noise, threshold_clip
from fedfair.privacy.distributed import Release, TrainingNoise
from fedfair.privacy.clipping import (
    ClippingMode,
    LayerClipping,
    NormClippingOptimizer,
    clipping_candidates,
    has_clipping_hooks,
)
from fedfair.privacy.config import PrivacyConfig
from fedfair.privacy.hooks import check_private_model
from fedfair.privacy.probe import PROBE, ModeProbe, per_sample_budget, per_sample_bytes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrivacyReport:
    """A collaborator's cumulative spend after a round, as logged (and sent as a metric)."""

    rounds: int
    steps: int
    epsilon: float
    delta: float
    accountant: str
    rdp_epsilon: float | None
    budget: float | None
    # None in reports written before the clipping mode was recorded.
    clipping: ClippingMode | None = None
    released: str | None = None
    """What this collaborator sends outside the noise besides the noised update, and why it is no
    function of its data (the weight and batch a plan fixes); None where the caller did not say."""

    def to_dict(self) -> dict[str, float | int | str | None]:
        """Every field by name, as JSON can hold it (the metric a collaborator sends)."""
        return asdict(self)

    def describe(self) -> str:
        """One line for the log: epsilon (and the RDP cross-check), budget, delta, rounds, steps, accountant."""
        cross = f" (RDP {self.rdp_epsilon:.3f})" if self.rdp_epsilon is not None else ""
        budget = f" of budget {self.budget:g}" if self.budget is not None else ""
        clipping = f", {_CLIPPING_NAMES[self.clipping]}" if self.clipping is not None else ""
        released = f"; outside the noise: {self.released}" if self.released is not None else ""
        return (
            f"epsilon {self.epsilon:.3f}{cross}{budget} at delta {self.delta:g} "
            f"after {self.rounds} private rounds ({self.steps} steps, {self.accountant} accountant{clipping}){released}"
        )


_CLIPPING_NAMES: dict[ClippingMode, str] = {
    "one_pass": "one-pass norm-only clipping",
    "norm": "norm-only clipping",
    "per_sample": "per-sample clipping",
}


# ---------------------------------------------------------------- the private learner


def _secret_generator(device: torch.device) -> torch.Generator:
    """A generator seeded from the OS, never from the run's seed.

    The seed in a federation plan is known to the aggregator; noise (or a sample)
    drawn from it could be regenerated and subtracted, voiding the guarantee.
    """
    return torch.Generator(device=device).manual_seed(secrets.randbits(63))


class PrivateLearner:
    """A `LocalLearner` whose steps are DP-SGD, with its collaborator's accountant and budget.

    Same round interface (`begin` / `step` / `finish` / `train_round`) and the same
    `Update`, so the simulation and the collaborator process use it in place of
    the plain learner. `begin` checks the budget and records the round's tau steps
    in the accountant before any step is taken; it raises `PrivacyBudgetError` (LEARNER_SPENT)
    instead when the round would exceed the budget.

    The batches of a round are drawn on the host when it begins and moved to the
    device in one transfer, so the step loop never waits on the device.

    Each private step is the algorithm's step (`LocalLearner.take_step`) from the
    privatised gradient; its drift correction is post-processing of released values,
    so the accountant charges nothing for it.

    `clipping` is "auto" (one-pass norm-only clipping where every trainable layer is
    dense or the threshold; else, where every layer has a norm sampler, the faster of
    norm-only and per-sample clipping for this model, device and batch size, timed once
    per process by `probe` (`fedfair.privacy.probe.PROBE` unless given); else per-sample
    gradients), or "one_pass" / "norm" / "per_sample" to insist on one; the mode chosen is
    `self.clipping`. Every mode reads the layers' backprops at gradient edges, so models
    with in-place operations (residual networks as torchvision writes them) train unedited.
    `released` is what the report says is sent outside the noise (PrivacyReport.released); under distributed DP,
    `beside` are the releases it makes once a round besides its update (`DistributedDP.beside`), charged with it.
    `plan_budget` is the federation plan's [privacy] budget, the most all of this institution's releases may spend:
    the steps stop at it too where it is below the institution's own (`budget`).

    With `privacy.mode` "distributed" the steps add no noise: theta's and c's per-record gradients are
    clipped separately (one-pass clipping, so a model of dense layers), one local step per round, and
    the accountant charges the Skellam noise the secure sum adds (`distributed_noise`, which the secure
    sum derives alike from the same public values) for this collaborator's sampling rate.
    """

    def __init__(
        self,
        learner: LocalLearner,
        privacy: PrivacyConfig,
        *,
        accountant: PrivacyAccountant | None = None,
        planned_rounds: int | None = None,
        name: str = "collaborator",
        clipping: str = "auto",
        released: str | None = None,
        probe: ModeProbe | None = None,
        beside: tuple[Release, ...] = (),
        plan_budget: float | None = None,
    ) -> None:
        if not privacy.enabled:
            raise ConfigError("privacy is not enabled; set enabled = true in [privacy] (or pass a --dp-* flag)")
        if learner.config.reuse_batch:
            raise ConfigError(
                "DP-SGD draws a fresh Poisson sample every step and its accounting relies on that; drop --reuse-batch"
            )
        if planned_rounds is not None and planned_rounds < 1:
            raise ConfigError(f"planned rounds must be at least 1, got {planned_rounds}; pass the plan's rounds")
        check_private_model(learner.model)
        heads = nn.ModuleList([learner.model] + ([learner.threshold] if learner.threshold is not None else []))
        if has_clipping_hooks(heads):
            raise ConfigError("this model already has clipping hooks; make a PrivateLearner once per LocalLearner")
        self.learner = learner
        self.privacy = privacy
        self.plan_budget = plan_budget
        self.name = name
        self.released = released
        self.steps_per_round = learner.config.local_steps
        # Under distributed DP every site samples at the plan's rate, while its update is still divided
        # by its weight b_k: the weighted vector is then -lr times the clipped sum whatever b_k is.
        self.sample_rate = privacy.sample_rate or learner.batch_size / learner.num_samples
        planned_steps = planned_rounds * self.steps_per_round if planned_rounds is not None else None
        self.beside = beside
        self.distributed_noise: TrainingNoise | None = None
        self.accountant: PrivacyAccountant | DistributedAccountant
        if privacy.mode == "distributed":
            self.noise_multiplier = 0.0
            self.distributed_noise = self._distributed_noise(planned_steps)
            self.accountant = DistributedAccountant(self.distributed_noise)
        else:
            self.noise_multiplier = noise_multiplier_for(privacy, self.sample_rate, planned_steps)
            self.accountant = accountant if accountant is not None else PrivacyAccountant()
        if not privacy.poisson_sampling:
            logger.warning("%s: Poisson sampling is off; the epsilon reported assumes it and does not hold here", name)
        if privacy.delta >= 1.0 / learner.num_samples:
            logger.warning(
                "%s: delta %g is not below 1/n = %g for its %d samples; a delta that large permits leaking a record",
                name,
                privacy.delta,
                1.0 / learner.num_samples,
                learner.num_samples,
            )
        self.device = next(heads.parameters()).device
        # Hooks only: the learner keeps calling its own modules, in-place operations included.
        self._clipping = LayerClipping(heads, "per_sample", privacy.max_grad_norm, self.threshold_max_grad_norm)
        candidates = clipping_candidates(heads, "one_pass" if privacy.mode == "distributed" else clipping)
        self.clipping: ClippingMode = self._fastest(heads, candidates, PROBE if probe is None else probe)
        self._clipping.use(self.clipping)
        logger.info("%s: DP-SGD with %s", name, _CLIPPING_NAMES[self.clipping])
        # The optimizer takes the clipped sum from .grad and privatises it in place (noise, scale) in its
        # pre_step; the step itself is the algorithm's (LocalLearner.take_step), so the SGD it wraps only
        # names the tensors.
        self.optimizer = NormClippingOptimizer(
            torch.optim.SGD(learner.state_tensors, lr=learner.config.lr),
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=privacy.max_grad_norm,
            expected_batch_size=learner.batch_size,
            loss_reduction="mean",
            generator=_secret_generator(self.device),
        )
        self._sampling = _secret_generator(torch.device("cpu"))
        self._index = torch.empty(0, dtype=torch.long, device=self.device)
        self._bounds: list[int] = [0]
        self._cursor = 0
        self.last_report: PrivacyReport | None = None

    @property
    def threshold_max_grad_norm(self) -> float | None:
        """C's own clip bound under distributed DP; None when c is clipped jointly with theta.

        The configured bound, else c's gradient bound (1 - eps) max(1, 1/rho - 1), where clipping
        changes nothing.
        """
        threshold = self.learner.threshold
        if self.privacy.mode != "distributed" or threshold is None:
            return None
        return threshold_clip(self.privacy, threshold.epsilon, threshold.rho)

    @property
    def budget(self) -> float | None:
        """The epsilon the steps stop at: the institution's own budget or the plan's, the lower; None for neither."""
        bounds = [bound for bound in (self.privacy.budget, self.plan_budget) if bound is not None]
        return min(bounds, default=None)

    def _distributed_noise(self, planned_steps: int | None) -> TrainingNoise:
        config = self.learner.config
        if planned_steps is None or self.privacy.target_epsilon is None:
            raise ConfigError("distributed privacy needs the plan's rounds and a target_epsilon to calibrate the noise")
        if config.local_steps != 1 or config.drift_correction != "none":
            raise ConfigError(
                "distributed privacy sums one clipped step per round inside the secure sum; set local_steps = 1 "
                "and drift_correction = none"
            )
        return distributed_training_noise(
            self.privacy,
            config.lr,
            config.threshold_lr,
            self.threshold_max_grad_norm,
            self.sample_rate,
            planned_steps,
            sum(tensor.numel() for tensor in self.learner.state_tensors),
            beside=self.beside,
        )

    def report(self) -> PrivacyReport:
        """The cumulative spend so far (recomputed; `last_report` holds the one logged after begin)."""
        return self._report(self.accountant.epsilon(self.privacy.delta, self.privacy.accountant))

    def begin(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> None:
        """Start a private round: check the budget, account for its tau steps, load the global state.

        Loads (theta_t, c_t) and the server's drift-correction control variate (if any), then draws
        the round's batches. The steps are recorded (and persisted) before any is taken.

        Raises:
            PrivacyBudgetError: with reason LEARNER_SPENT, one more round would take epsilon above the budget;
                nothing is spent.
        """
        self._spend_round()
        self.learner.begin(theta, c, control)
        self._draw_round()

    def step(self) -> None:
        """One DP-SGD step on (theta, c): joint clipping of each sample's gradient, noise, then c projected."""
        if self._cursor + 1 >= len(self._bounds):
            raise RuntimeError(
                "a private round takes exactly the tau steps accounted for in begin(); begin the next round"
            )
        start, stop = self._bounds[self._cursor], self._bounds[self._cursor + 1]
        self._cursor += 1
        self.optimizer.zero_grad(set_to_none=True)
        if stop > start:
            index = self._index[start:stop]
            features = self.learner.features.index_select(0, index)
            labels = self.learner.labels.index_select(0, index)
            with self._clipping.capturing():
                per_sample = self._objective_once_per_layer(features, labels)
            self._clipping.backward(per_sample)
        else:
            # An empty Poisson sample still takes its step: the update is pure noise.
            for parameter in self.optimizer.params:
                parameter.grad = torch.zeros_like(parameter)
        privatised = self.optimizer.pre_step()
        # The algorithm's step from the privatised gradient: its drift correction is post-processing of
        # released values, so free of privacy cost, and with LocalConfig.project_locally (worth it under
        # this step's noise, which can push c far out of [0, B] within a round) c is projected.
        gradients = [tensor.grad if privatised else None for tensor in self.learner.state_tensors]
        self.learner.take_step(gradients)

    def _fastest(self, heads: nn.Module, candidates: list[ClippingMode], probe: ModeProbe) -> ClippingMode:
        """The fastest of `candidates` on this device at the expected batch size, timed once per process (`probe`).

        Per-sample clipping is timed only where its per-sample gradients fit `per_sample_budget` of the device;
        each mode runs on a synthetic batch (standard normal features, labels 0), never on records.
        """
        batch = self.learner.batch_size
        if len(candidates) > 1 and per_sample_bytes(heads, batch) > per_sample_budget(self.device):
            candidates = [mode for mode in candidates if mode != "per_sample"]
        if len(candidates) == 1:
            return candidates[0]
        features, labels = self.learner.features, self.learner.labels
        generator = torch.Generator().manual_seed(0)  # public noise: the timing depends on no record
        synthetic = torch.randn((batch, *features.shape[1:]), generator=generator, dtype=features.dtype)
        synthetic = synthetic.to(features.device)
        zero_labels = labels.new_zeros((batch, *labels.shape[1:]))

        def clipped_step(mode: ClippingMode) -> None:
            self._clipping.use(mode)
            with self._clipping.capturing():
                per_sample = self._objective_once_per_layer(synthetic, zero_labels)
            self._clipping.backward(per_sample)
            self.learner.zero_grad()

        synchronize = torch.cuda.synchronize if self.device.type == "cuda" else lambda: None
        # The probe leaves the generators as they were: a model that draws (dropout) trains alike whether it ran.
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            return probe.choose(ModeProbe.key(heads, self.device, batch), candidates, clipped_step, synchronize)

    def _objective_once_per_layer(self, features: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        try:
            per_sample: torch.Tensor = self.learner.objective(features, labels)
        except NotImplementedError as error:
            # Opacus refuses, mid-forward, a layer called twice: its norm is not the sum of its calls' norms.
            raise ConfigError(
                f"{self.name}: norm-only clipping cannot train this model ({error}); "
                "build its PrivateLearner with clipping='per_sample'"
            ) from error
        return per_sample

    def finish(self) -> Update:
        """The round's update, exactly as the plain learner reports it."""
        return self.learner.finish()

    def train_round(self, theta: torch.Tensor, c: float, control: torch.Tensor | None = None) -> Update:
        """begin, tau private steps, finish; raises PrivacyBudgetError before training when spent."""
        self.begin(theta, c, control)
        for _ in range(self.steps_per_round):
            self.step()
        return self.finish()

    def _spend_round(self) -> None:
        run = (self.noise_multiplier, self.sample_rate, self.steps_per_round)
        delta, mechanism, budget = self.privacy.delta, self.privacy.accountant, self.budget
        epsilon = self.accountant.epsilon(delta, mechanism, then=run)
        if budget is not None and epsilon > budget:
            spent = self.accountant.epsilon(delta, mechanism)
            whose = "the plan's [privacy] budget" if budget == self.plan_budget else "its budget"
            if spent == 0.0:
                # Not one round fits: no budget is spent, so waiting or a new federation changes nothing.
                fix = (
                    f"its DP-SGD cannot train one round within it; set a larger noise_multiplier, or target_epsilon "
                    f"= {budget:g} or less, in this institution's [privacy]"
                )
            elif whose == "its budget":
                fix = "only a larger budget_epsilon would let it go on"
            else:
                fix = "only a plan with a larger [privacy] budget would let it go on"
            raise PrivacyBudgetError(
                BudgetReason.LEARNER_SPENT,
                f"{self.name} stops contributing: one more round would bring its epsilon to {epsilon:.3f}, above "
                f"{whose} {budget:g} (delta {delta:g}, {mechanism} accountant, noise multiplier "
                f"{self.noise_multiplier:.4g} at sample rate {self.sample_rate:.4g}; {spent:.3f} spent over "
                f"{self.accountant.rounds} rounds); {fix}",
            )
        self.accountant.spend(*run)
        self.last_report = self._report(epsilon)
        logger.info("%s: %s", self.name, self.last_report.describe())
        if self.last_report.rdp_epsilon is not None and epsilon > self.last_report.rdp_epsilon + 0.05:
            logger.warning(
                "%s: PRV epsilon %.3f exceeds the RDP bound %.3f; the tighter (RDP) bound also holds",
                self.name,
                epsilon,
                self.last_report.rdp_epsilon,
            )

    def _report(self, epsilon: float) -> PrivacyReport:
        # RDP is cheap and independent of PRV's discretisation: a cross-check, not the reported value.
        local_prv = self.privacy.accountant != "rdp" and self.privacy.mode == "local"
        cross = self.accountant.epsilon(self.privacy.delta, "rdp") if local_prv else None
        return PrivacyReport(
            rounds=self.accountant.rounds,
            steps=self.accountant.steps,
            epsilon=epsilon,
            delta=self.privacy.delta,
            accountant=self.privacy.accountant,
            rdp_epsilon=cross,
            budget=self.budget,
            clipping=self.clipping,
            released=self.released,
        )

    def _draw_round(self) -> None:
        """Draw the tau batches of this round on the host and move their indices once."""
        tau, n = self.steps_per_round, self.learner.num_samples
        if self.privacy.poisson_sampling:
            # float64 so that the inclusion probability is the accounted q, not q rounded to float32.
            chosen = torch.rand((tau, n), generator=self._sampling, dtype=torch.float64) < self.sample_rate
            index = chosen.nonzero()[:, 1]
            sizes = chosen.sum(dim=1).tolist()
        else:
            batches = [self.learner.sampler.next_batch() for _ in range(tau)]
            parts = [torch.arange(n) if batch is None else batch for batch in batches]
            index = torch.cat(parts)
            sizes = [part.numel() for part in parts]
        self._bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self._cursor = 0
        if self.device.type == "cuda":
            self._index = index.pin_memory().to(self.device, non_blocking=True)
        else:
            self._index = index.to(self.device)
