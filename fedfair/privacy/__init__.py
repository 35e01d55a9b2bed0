"""Differential privacy for a collaborator: DP-SGD on its local steps, accounting, budgets.

Each institution decides its own privacy. With it on, every local step is DP-SGD
(Abadi et al. 2016) through Opacus: a Poisson sample of the local data, one
gradient per sample, each clipped to norm C, summed, Gaussian noise of standard
deviation sigma * C added, divided by the expected batch size b. The threshold c
is trained by the same steps, so its per-sample gradient is clipped together with
theta's (one joint norm) and noised alike; that is why c lives in a module
(`RCVaRThreshold`) with a registered per-sample gradient rather than beside it.

The guarantee an institution can trust is the one over the whole federation, not
one round: every round's steps join one history (noise, sample rate, steps) per
collaborator, persisted in a JSON state file so that it survives restarts, and
the cumulative (epsilon, delta) comes from a PRV accountant (RDP as a cross-check).
A round that would push epsilon past the collaborator's budget is refused before
it trains (`PrivacyBudgetExhausted`); the federation goes on without it while
its quorum holds. Poisson samples and noise come from OS entropy, never from the
plan's seed, which the aggregator knows.

Choosing the clip bound: samples above c carry large theta gradients, so a bound
far below typical per-sample gradient norms shrinks their pull on c more than the
others' and c settles below the (1 - rho)-quantile, drifting the model toward ERM.
A bound near the typical norm keeps c where it belongs (benchmarks/dp_bench.py
shows both on Adult).

Public pieces: `PrivacyConfig` (what `[privacy]` and the `--dp-*` flags map onto),
`PrivateLearner` (wraps a `LocalLearner`), `PrivacyAccountant` (the persisted
history), `compute_epsilon` / `plan_noise_multiplier`, `contributing_updates`
(one round over learners that drop out when spent), and the `fedfair privacy`
commands.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import secrets
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from opacus.accountants import PRVAccountant, RDPAccountant
from opacus.accountants.analysis import rdp as rdp_analysis
from opacus.accountants.utils import get_noise_multiplier
from opacus.grad_sample import GradSampleHooks, register_grad_sampler
from opacus.optimizers import DPOptimizer
from opacus.utils.module_utils import has_trainable_params
from opacus.validators import ModuleValidator
from torch import nn

from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write
from fedfair.core.local import LocalLearner, StopsContributing, Update
from fedfair.core.objective import RCVaRThreshold
from fedfair.privacy.config import ACCOUNTANTS, PrivacyConfig

logger = logging.getLogger(__name__)

RDP_ORDERS = tuple(RDPAccountant.DEFAULT_ALPHAS)
STATE_FORMAT = "fedfair-privacy-accountant"
STATE_VERSION = 1

History = list[tuple[float, float, int]]
"""(noise multiplier, sample rate, steps) runs, consecutive equal settings merged."""


class PrivacyBudgetExhausted(StopsContributing):
    """A collaborator's next round would spend more epsilon than its budget; it stops contributing."""


# ---------------------------------------------------------------- per-sample gradient of c


@register_grad_sampler(RCVaRThreshold)
def _threshold_grad_sample(
    module: RCVaRThreshold, activations: list[torch.Tensor], backprops: torch.Tensor
) -> dict[nn.Parameter, torch.Tensor]:
    """d(output_i)/dc times the backpropagated gradient of each sample: one scalar per sample.

    Output i depends on c only through sample i's own loss term, so the per-sample
    gradient is exact: backprops_i * (1 - eps) * (1 - s'(l_i - c) / rho).
    """
    losses = activations[0].to(backprops.dtype)
    with torch.no_grad():
        return {module.c: backprops * module.grad_c_per_sample(losses)}


def check_private_model(model: nn.Module) -> None:
    """Refuse, naming the layer, a model DP-SGD cannot train sample by sample.

    BatchNorm (and InstanceNorm with running statistics, or plain LSTM / GRU /
    MultiheadAttention) either mixes samples within a batch or has no per-sample
    gradient in Opacus; training it "privately" would silently void the guarantee.
    """
    for name, module in model.named_modules():
        reason = _unsupported_reason(module)
        if reason is not None:
            where = f"layer '{name}'" if name else "the model"
            raise ConfigError(
                f"DP-SGD cannot train {where} ({type(module).__name__}): {reason}; replace it "
                "(GroupNorm or LayerNorm for BatchNorm, opacus.layers.DPLSTM / DPGRU / DPMultiheadAttention) "
                "or turn privacy off"
            )


def _unsupported_reason(module: nn.Module) -> str | None:
    validator = ModuleValidator.VALIDATORS.get(type(module))
    if validator is not None:
        errors = validator(module)
        if errors:
            # Opacus explains at length; its first sentence names the problem.
            return str(errors[0]).split(". ")[0].rstrip(".")
    if has_trainable_params(module) and any(True for _ in module.buffers(recurse=False)):
        return "it keeps buffers (e.g. running statistics) computed from many samples, which DP-SGD cannot make private"
    return None


# ---------------------------------------------------------------- configuration


# ---------------------------------------------------------------- accounting


def noise_multiplier_for(privacy: PrivacyConfig, sample_rate: float, planned_steps: int | None) -> float:
    """sigma: the given one, or the one that spends `target_epsilon` over the planned steps."""
    if privacy.noise_multiplier is not None:
        return privacy.noise_multiplier
    if privacy.target_epsilon is None:
        raise ConfigError("privacy has no noise level; set noise_multiplier or target_epsilon")
    if planned_steps is None:
        raise ConfigError(
            "target_epsilon needs the number of rounds to spread it over (the plan's rounds); "
            "pass planned_rounds or give noise_multiplier instead"
        )
    return plan_noise_multiplier(privacy.target_epsilon, privacy.delta, sample_rate, planned_steps, privacy.accountant)



def _validated_run(noise_multiplier: float, sample_rate: float, steps: int) -> tuple[float, float, int]:
    if not noise_multiplier >= 0.0 or not math.isfinite(noise_multiplier):
        raise ConfigError(f"noise multiplier must be a number >= 0, got {noise_multiplier}; e.g. --noise-multiplier 1.0")
    if not 0.0 < sample_rate <= 1.0:
        raise ConfigError(
            f"sample rate must be in (0, 1], got {sample_rate}; it is batch size / dataset size, e.g. --sample-rate 0.01"
        )
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps must be a positive integer, got {steps}; e.g. --steps 1000")
    return float(noise_multiplier), float(sample_rate), steps


def _check_accountant(accountant: str) -> None:
    if accountant not in ACCOUNTANTS:
        raise ConfigError(f"unknown privacy accountant '{accountant}'; choose prv or rdp (--accountant)")


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ConfigError(f"delta must be in (0, 1), got {delta}; use well below 1/n, e.g. --delta 1e-5")


def epsilon_of_history(history: Sequence[tuple[float, float, int]], delta: float, accountant: str = "prv") -> float:
    """Cumulative epsilon at delta of a DP-SGD history; infinite once any step had no noise."""
    _check_accountant(accountant)
    _check_delta(delta)
    if not history:
        return 0.0
    if any(noise_multiplier == 0.0 for noise_multiplier, _, _ in history):
        return math.inf
    # RDP warns when its best order sits at the edge of its grid (a valid, slightly loose bound);
    # PRV takes log(0) on its way at sample rate 1. Neither is news to the user.
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        if accountant == "rdp":
            # Opacus' RDPAccountant computes exactly this; RDP is linear in steps, so caching one
            # step's RDP per setting makes a round's check one conversion instead of ~150 series.
            rdp = sum(steps * _one_step_rdp(noise_multiplier, rate) for noise_multiplier, rate, steps in history)
            return float(rdp_analysis.get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)[0])
        prv = PRVAccountant()
        prv.history = [tuple(run) for run in history]
        return float(prv.get_epsilon(delta=delta))


@lru_cache(maxsize=256)
def _one_step_rdp(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    return rdp_analysis.compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDP_ORDERS)


def compute_epsilon(noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "prv") -> float:
    """Epsilon at delta after `steps` DP-SGD steps with Poisson sample rate q and noise multiplier sigma."""
    return epsilon_of_history([_validated_run(noise_multiplier, sample_rate, steps)], delta, accountant)


@lru_cache(maxsize=64)
def plan_noise_multiplier(target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "prv") -> float:
    """The smallest noise multiplier (to 0.01 in epsilon) whose `steps` steps spend at most target_epsilon."""
    if not target_epsilon > 0.0 or not math.isfinite(target_epsilon):
        raise ConfigError(f"target epsilon must be a positive number, got {target_epsilon}; e.g. --target-epsilon 3")
    _check_accountant(accountant)
    _check_delta(delta)
    _, sample_rate, steps = _validated_run(1.0, sample_rate, steps)
    try:
        with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
            warnings.simplefilter("ignore")
            return float(
                get_noise_multiplier(
                    target_epsilon=target_epsilon,
                    target_delta=delta,
                    sample_rate=sample_rate,
                    steps=steps,
                    accountant=accountant,
                )
            )
    except ValueError:
        raise ConfigError(
            f"no noise multiplier reaches epsilon {target_epsilon} at delta {delta} over {steps} steps at sample rate "
            f"{sample_rate:g}; raise the target epsilon, or lower the rounds or the batch size"
        ) from None


def privacy_state_path(checkpoint: Path) -> Path:
    """Where a collaborator keeps its accountant: beside its checkpoint, e.g. `ckpt.pt` -> `ckpt.privacy.json`."""
    return checkpoint.with_suffix(".privacy.json")


class PrivacyAccountant:
    """One collaborator's privacy spend over the whole federation: its DP-SGD history, persisted.

    The history is mechanism-neutral (noise multiplier, sample rate, steps), so the
    same file can be read with either accountant. With a `path` every `spend` is
    written atomically before it returns, so a crash or restart can only
    over-count, never forget, what was spent.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.history: History = []
        self.rounds = 0
        if path is not None and path.exists():
            self._load(path)

    @property
    def steps(self) -> int:
        return sum(steps for _, _, steps in self.history)

    def epsilon(self, delta: float, accountant: str = "prv", *, then: tuple[float, float, int] | None = None) -> float:
        """Cumulative epsilon at delta so far, or after one more run `then` if given."""
        history = _merged(self.history, then) if then is not None else self.history
        return epsilon_of_history(history, delta, accountant)

    def spend(self, noise_multiplier: float, sample_rate: float, steps: int) -> None:
        """Record one round's steps (and persist them) before they are taken."""
        self.history = _merged(self.history, _validated_run(noise_multiplier, sample_rate, steps))
        self.rounds += 1
        if self.path is not None:
            self._save(self.path)

    def _save(self, path: Path) -> None:
        state = {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "rounds": self.rounds,
            "history": [list(run) for run in self.history],
        }
        atomic_write(path, lambda stream: stream.write(json.dumps(state, indent=1).encode()))

    def _load(self, path: Path) -> None:
        fix = "restore it from a backup (starting afresh would forget the privacy already spent)"
        try:
            state = json.loads(path.read_text())
            if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
                raise ValueError(f"not a {STATE_FORMAT} version {STATE_VERSION} file")
            history = [_validated_run(float(sigma), float(rate), steps) for sigma, rate, steps in state["history"]]
            rounds = state["rounds"]
            if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
                raise ValueError(f"rounds must be a count, got {rounds!r}")
        except (OSError, ValueError, TypeError, KeyError, AttributeError, ConfigError) as error:
            raise ConfigError(f"privacy accountant state {path} is unreadable ({error}); {fix}") from None
        self.history, self.rounds = history, rounds


def _merged(history: History, run: tuple[float, float, int]) -> History:
    """Append a run, folding it into the last one when the settings are equal.

    Merging keeps the history short (PRV's cost grows with its length) and makes R
    rounds of tau steps the very same computation as one run of R * tau steps.
    """
    if history and history[-1][:2] == run[:2]:
        return [*history[:-1], (run[0], run[1], history[-1][2] + run[2])]
    return [*history, run]


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

    def to_dict(self) -> dict[str, float | int | str | None]:
        return asdict(self)

    def describe(self) -> str:
        cross = f" (RDP {self.rdp_epsilon:.3f})" if self.rdp_epsilon is not None else ""
        budget = f" of budget {self.budget:g}" if self.budget is not None else ""
        return (
            f"epsilon {self.epsilon:.3f}{cross}{budget} at delta {self.delta:g} "
            f"after {self.rounds} private rounds ({self.steps} steps, {self.accountant} accountant)"
        )


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
    in the accountant before any step is taken; it raises `PrivacyBudgetExhausted`
    instead when the round would exceed the budget.

    The batches of a round are drawn on the host when it begins and moved to the
    device in one transfer, so the step loop never waits on the device.
    """

    def __init__(
        self,
        learner: LocalLearner,
        privacy: PrivacyConfig,
        *,
        accountant: PrivacyAccountant | None = None,
        planned_rounds: int | None = None,
        name: str = "collaborator",
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
        parameters = [*learner.model.parameters()] + ([learner.threshold.c] if learner.threshold is not None else [])
        if any(hasattr(parameter, "grad_sample") for parameter in parameters):
            raise ConfigError("this model already has per-sample gradient hooks; make a PrivateLearner once per LocalLearner")
        self.learner = learner
        self.privacy = privacy
        self.name = name
        self.accountant = accountant if accountant is not None else PrivacyAccountant()
        self.steps_per_round = learner.config.local_steps
        self.sample_rate = learner.batch_size / learner.num_samples
        planned_steps = planned_rounds * self.steps_per_round if planned_rounds is not None else None
        self.noise_multiplier = noise_multiplier_for(privacy, self.sample_rate, planned_steps)
        if not privacy.poisson_sampling:
            logger.warning("%s: Poisson sampling is off; the epsilon reported assumes it and does not hold here", name)
        if privacy.delta >= 1.0 / learner.num_samples:
            logger.warning(
                "%s: delta %g is not below 1/n = %g for its %d samples; a delta that large permits leaking a record",
                name, privacy.delta, 1.0 / learner.num_samples, learner.num_samples,
            )
        heads = [learner.model] + ([learner.threshold] if learner.threshold is not None else [])
        # Hooks only: the learner keeps calling its own modules, and "sum" makes each
        # captured gradient exactly one sample's, whatever the Poisson batch size.
        self._hooks = GradSampleHooks(nn.ModuleList(heads), loss_reduction="sum", strict=True)
        self.device = parameters[0].device
        self.optimizer = DPOptimizer(
            learner.optimizer,
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

    def report(self) -> PrivacyReport:
        """The cumulative spend so far (recomputed; `last_report` holds the one logged after begin)."""
        return self._report(self.accountant.epsilon(self.privacy.delta, self.privacy.accountant))

    def begin(self, theta: torch.Tensor, c: float) -> None:
        """Check the budget, account for this round's tau steps, load (theta_t, c_t), draw the round's batches."""
        self._spend_round()
        self.learner.begin(theta, c)
        self._draw_round()

    def step(self) -> None:
        """One DP-SGD step on (theta, c): per-sample gradients, joint clipping, noise, then c projected."""
        if self._cursor + 1 >= len(self._bounds):
            raise RuntimeError("a private round takes exactly the tau steps accounted for in begin(); begin the next round")
        start, stop = self._bounds[self._cursor], self._bounds[self._cursor + 1]
        self._cursor += 1
        self.optimizer.zero_grad(set_to_none=True)
        if stop > start:
            index = self._index[start:stop]
            features = self.learner.features.index_select(0, index)
            labels = self.learner.labels.index_select(0, index)
            with warnings.catch_warnings():
                # The first layer's input needs no gradient; Opacus's hook then fires on the output, as intended.
                warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
                self.learner.objective(features, labels).sum().backward()
        else:
            # An empty Poisson sample still takes its step: the update is pure noise.
            for parameter in self.optimizer.params:
                parameter.grad_sample = parameter.new_zeros((0, *parameter.shape))
        self.optimizer.step()
        if self.learner.threshold is not None:
            self.learner.threshold.project()

    def finish(self) -> Update:
        """The round's update, exactly as the plain learner reports it."""
        return self.learner.finish()

    def train_round(self, theta: torch.Tensor, c: float) -> Update:
        """begin, tau private steps, finish; raises PrivacyBudgetExhausted before training when spent."""
        self.begin(theta, c)
        for _ in range(self.steps_per_round):
            self.step()
        return self.finish()

    def _spend_round(self) -> None:
        run = (self.noise_multiplier, self.sample_rate, self.steps_per_round)
        delta, mechanism, budget = self.privacy.delta, self.privacy.accountant, self.privacy.budget
        epsilon = self.accountant.epsilon(delta, mechanism, then=run)
        if budget is not None and epsilon > budget:
            spent = self.accountant.epsilon(delta, mechanism)
            raise PrivacyBudgetExhausted(
                f"{self.name} stops contributing: one more round would bring its epsilon to {epsilon:.3f}, above its "
                f"budget {budget:g} (delta {delta:g}, {mechanism} accountant; {spent:.3f} spent over "
                f"{self.accountant.rounds} rounds); only a larger budget_epsilon would let it go on"
            )
        self.accountant.spend(*run)
        self.last_report = self._report(epsilon)
        logger.info("%s: %s", self.name, self.last_report.describe())
        if self.last_report.rdp_epsilon is not None and epsilon > self.last_report.rdp_epsilon + 0.05:
            logger.warning(
                "%s: PRV epsilon %.3f exceeds the RDP bound %.3f; the tighter (RDP) bound also holds",
                self.name, epsilon, self.last_report.rdp_epsilon,
            )

    def _report(self, epsilon: float) -> PrivacyReport:
        # RDP is cheap and independent of PRV's discretisation: a cross-check, not the reported value.
        cross = self.accountant.epsilon(self.privacy.delta, "rdp") if self.privacy.accountant != "rdp" else None
        return PrivacyReport(
            rounds=self.accountant.rounds,
            steps=self.accountant.steps,
            epsilon=epsilon,
            delta=self.privacy.delta,
            accountant=self.privacy.accountant,
            rdp_epsilon=cross,
            budget=self.privacy.budget,
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


# ---------------------------------------------------------------- flags and commands


def add_privacy_arguments(parser: argparse.ArgumentParser) -> None:
    """The `--dp-*` flags of `fedfair simulate`: DP-SGD on every collaborator, off unless a noise level is given."""
    group = parser.add_argument_group("differential privacy (DP-SGD on every collaborator; off by default)")
    group.add_argument("--dp-noise-multiplier", type=float, help="noise std over the clip bound (sigma), e.g. 1.0")
    group.add_argument("--dp-target-epsilon", type=float, help="calibrate sigma so the whole run spends this epsilon")
    group.add_argument("--dp-max-grad-norm", type=float, help="per-sample clip bound C (default 1.0)")
    group.add_argument("--dp-delta", type=float, help="delta of the (epsilon, delta) guarantee (default 1e-5)")
    group.add_argument("--dp-budget", type=float, help="epsilon after which a collaborator stops contributing")
    group.add_argument("--dp-accountant", choices=ACCOUNTANTS, help="prv (tight, default) or rdp (fast)")


def privacy_config_from_args(args: argparse.Namespace) -> PrivacyConfig:
    """The PrivacyConfig the `--dp-*` flags ask for; enabled when a noise level or target is given."""
    enabled = args.dp_noise_multiplier is not None or args.dp_target_epsilon is not None
    extras = {
        "--dp-max-grad-norm": args.dp_max_grad_norm,
        "--dp-delta": args.dp_delta,
        "--dp-budget": args.dp_budget,
        "--dp-accountant": args.dp_accountant,
    }
    given = [flag for flag, value in extras.items() if value is not None]
    if not enabled and given:
        raise ConfigError(f"{given[0]} needs --dp-noise-multiplier or --dp-target-epsilon to turn privacy on")
    defaults = PrivacyConfig()
    return PrivacyConfig(
        enabled=enabled,
        noise_multiplier=args.dp_noise_multiplier,
        target_epsilon=args.dp_target_epsilon,
        max_grad_norm=args.dp_max_grad_norm if args.dp_max_grad_norm is not None else defaults.max_grad_norm,
        delta=args.dp_delta if args.dp_delta is not None else defaults.delta,
        budget_epsilon=args.dp_budget,
        accountant=args.dp_accountant or defaults.accountant,
    )


def _epsilon_command(args: argparse.Namespace) -> int:
    epsilon = compute_epsilon(args.noise_multiplier, args.sample_rate, args.steps, args.delta, args.accountant)
    print(
        f"{epsilon:.3f}  (epsilon at delta {args.delta:g} after {args.steps} steps, noise multiplier "
        f"{args.noise_multiplier:g}, sample rate {args.sample_rate:g}, {args.accountant} accountant)"
    )
    return 0


def _plan_command(args: argparse.Namespace) -> int:
    for flag, value in (("--rounds", args.rounds), ("--local-steps", args.local_steps), ("--dataset-size", args.dataset_size)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if not 1 <= args.batch_size <= args.dataset_size:
        raise ConfigError(f"--batch-size must be in [1, --dataset-size = {args.dataset_size}], got {args.batch_size}")
    sample_rate = args.batch_size / args.dataset_size
    steps = args.rounds * args.local_steps
    noise = plan_noise_multiplier(args.target_epsilon, args.delta, sample_rate, steps, args.accountant)
    epsilon = compute_epsilon(noise, sample_rate, steps, args.delta, args.accountant)
    print(
        f"{noise:.4f}  (noise multiplier: epsilon {epsilon:.3f} at delta {args.delta:g} after {args.rounds} rounds x "
        f"{args.local_steps} local steps at sample rate {sample_rate:.4g}, {args.accountant} accountant)"
    )
    return 0


def register_commands(subparsers: argparse._SubParsersAction) -> None:
    """`fedfair privacy epsilon` and `fedfair privacy plan`."""
    privacy = subparsers.add_parser("privacy", help="DP-SGD accounting: epsilon of a run, noise for a target epsilon")
    actions = privacy.add_subparsers(dest="privacy_command", required=True, metavar="ACTION")

    epsilon = actions.add_parser("epsilon", help="epsilon spent by DP-SGD steps (Poisson sampling)")
    epsilon.add_argument("--noise-multiplier", type=float, required=True, help="sigma: noise std over the clip bound")
    epsilon.add_argument("--sample-rate", type=float, required=True, help="q: batch size / dataset size")
    epsilon.add_argument("--steps", type=int, required=True, help="number of DP-SGD steps (rounds x local steps)")
    epsilon.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    epsilon.add_argument("--accountant", choices=ACCOUNTANTS, default="prv", help="prv (default) or rdp")
    epsilon.set_defaults(handler=_epsilon_command)

    plan = actions.add_parser("plan", help="the noise multiplier that spends a target epsilon over a training run")
    plan.add_argument("--target-epsilon", type=float, required=True)
    plan.add_argument("--delta", type=float, default=1e-5, help="delta (default 1e-5)")
    plan.add_argument("--rounds", type=int, required=True, help="federation rounds")
    plan.add_argument("--local-steps", type=int, default=1, help="tau: local steps per round (default 1)")
    plan.add_argument("--batch-size", type=int, required=True, help="this collaborator's batch size b_k")
    plan.add_argument("--dataset-size", type=int, required=True, help="this collaborator's training samples n_k")
    plan.add_argument("--accountant", choices=ACCOUNTANTS, default="prv", help="prv (default) or rdp")
    plan.set_defaults(handler=_plan_command)
