"""The methods an experiment compares, by name: what each one runs and the settings only it takes.

`METHODS` maps every ``--method`` name to a `Method`: its settings (a frozen dataclass whose
fields are its own flags, `NoSettings` when it takes none), how it runs on a `Task`, and
what it supports (DP-SGD, drift correction, secure aggregation). `fedfair simulate`
dispatches by lookup, and `settings_for` refuses a flag that belongs to another method,
naming whose it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, TypeVar

import numpy as np

from fedfair.core.config import DEFAULT_SERVER_MOMENTUM
from fedfair.core.errors import ConfigError
from fedfair.research import baselines, dro, fair_dp, fairness_baselines, minimax, term_dp
from fedfair.research.baselines import AFLSettings, FedAvgSettings, QFedAvgSettings, ReadsLosses
from fedfair.research.fairness_baselines import DeltaFLSettings, PropFairSettings, TERMSettings
from fedfair.research.minimax import BPFSettings, FedMinMaxSettings
from fedfair.research.task import NoSettings, Task
from fedfair.secagg import EncodingConfig, largest_safe_fractional_bits
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import SimulationResult, run_fedsrcvar
from fedfair.simulation.secure import DistributedDP, SecureSum, federation_dp

MethodSettings = (
    NoSettings
    | FedAvgSettings
    | AFLSettings
    | QFedAvgSettings
    | FedMinMaxSettings
    | BPFSettings
    | PropFairSettings
    | TERMSettings
    | DeltaFLSettings
)

WHOSE: dict[str, str] = {
    "local_epochs": "--local-epochs sets FedAvg's local passes",
    "mixture_lr": "--mixture-lr sets AFL's mixture step",
    "q": "--q sets q-FedAvg's fairness exponent",
    "adversary_lr": "--adversary-lr sets the adversary's step of fedminmax and bpf",
    "groups": "--groups names FedMinMax's sensitive column",
    "loss_rows": "--loss-rows sets how many rows afl, qfedavg, fedminmax, term, deltafl read for their per-round "
    "losses",
    "ceiling": "--ceiling sets PropFair's M",
    "tilt": "--tilt sets TERM's tilt",
    "client_level": "--client-level sets Delta-FL's superquantile level over clients",
}
"""What each method-only flag is for, said when it is given to a method that does not take it."""


# ---------------------------------------------------------------- running a method


Settings = TypeVar("Settings", bound=MethodSettings)


@dataclass(frozen=True)
class Method(Generic[Settings]):
    """One method: its settings' type, how it runs, and what it supports.

    `run` is the method's run function, called with a `Task` and the method's own settings.
    """

    name: str
    settings: type[Settings]
    run: Callable[[Task, Settings], SimulationResult]
    has_threshold: bool = False
    """Whether it trains the RCVaR threshold c (its result reports c)."""
    rho_free: bool = False
    """Its objective has no epsilon or rho, so its step size is --baseline-lr, not one scaled by them."""
    private: bool = False
    """Whether it can train with DP-SGD."""
    distributed: bool = False
    """Whether it can train under distributed DP, its noise inside the secure sum (`--dp-mode distributed`)."""
    secure_only_private: bool = False
    """Whether its secure sum is its DP mechanism only: without `--dp-mode distributed` it has no secure path,
    so `--secure-aggregation` alone is refused rather than run in the clear."""
    corrects_drift: bool = False
    """Whether it can take drift correction with its local steps."""
    needs_groups: bool = False
    """Whether it is told every training sample's sensitive group (a column the data must have)."""
    server_momentum: float | None = None
    """Its default server momentum when it takes `--server-momentum` (0: its paper's plain averaging step);
    None when it takes none."""

    @property
    def reads_losses(self) -> bool:
        """Whether its server needs losses at theta_t every round (`loss_rows` bounds what it reads)."""
        return issubclass(self.settings, ReadsLosses)


def own(settings: MethodSettings, kind: type[Settings]) -> Settings:
    """`settings` as the method's own kind (an ExperimentConfig checks this when it is built)."""
    if not isinstance(settings, kind):
        raise TypeError(f"expected {kind.__name__}, got {type(settings).__name__}")
    return settings


SECURE_CLIP = 10.0
SECURE_MODULUS_BITS = 64


def secure_sum(federation: Federation, distributed: DistributedDP | None = None) -> SecureSum:
    """Secure aggregation with the runtime's default encoding, with ``distributed`` DP noise inside if given.

    Deltas clipped to +-10, 64-bit words, as many fractional bits as the largest possible weighted sum leaves
    room for (under distributed DP the noise's calibration chooses them within that room).
    """
    sizes = [client.size for client in federation.train]
    max_weight = float(max(sizes))
    bits = largest_safe_fractional_bits(SECURE_CLIP, SECURE_MODULUS_BITS, len(sizes), max_weight)
    return SecureSum(EncodingConfig(SECURE_CLIP, max_weight, bits, SECURE_MODULUS_BITS), distributed=distributed)


def _fedsrcvar(task: Task, settings: NoSettings) -> SimulationResult:
    privacy = task.privacy
    distributed = None
    if privacy.enabled and privacy.mode == "distributed":
        # The learners take the plan's sampling rate from the same privacy settings the secure sum noises with.
        distributed = federation_dp(task.federation, task.training, task.objective, privacy, task.colluders)
        privacy = distributed.privacy
    summed = secure_sum(task.federation, distributed) if task.secure_aggregation else None
    result = run_fedsrcvar(
        task.federation,
        task.objective,
        task.training,
        options=task.options,
        # None: the plain sum, which the vectorised clients form without building K updates, bit for bit.
        aggregate=summed,
        on_round=task.on_round,
        privacy=privacy,
    )
    return result if summed is None else replace(result, noise=summed.noise_report())


def _distributed(task: Task) -> bool:
    return task.privacy.enabled and task.privacy.mode == "distributed"


def _term(task: Task, settings: TERMSettings) -> SimulationResult:
    if not _distributed(task):
        return fairness_baselines.run_term(task, settings)
    plan = term_dp.term_plan(task)
    return term_dp.run_term_dp(task, settings.tilt, plan, secure_sum(task.federation, plan))


def _fair_dp(task: Task, factors: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> SimulationResult:
    plan = fair_dp.fair_plan(task)
    return fair_dp.run_fair_dp(task, factors, plan, secure_sum(task.federation, plan))


def _propfair(task: Task, settings: PropFairSettings) -> SimulationResult:
    if not _distributed(task):
        return fairness_baselines.run_propfair(task, settings)
    return _fair_dp(task, fair_dp.propfair_factors(settings.ceiling))


def _deltafl(task: Task, settings: DeltaFLSettings) -> SimulationResult:
    if not _distributed(task):
        return fairness_baselines.run_deltafl(task, settings)
    if settings.loss_rows:
        raise ConfigError("under --dp-mode distributed each site releases its loss over every record; drop --loss-rows")
    return _fair_dp(task, fair_dp.deltafl_factors(settings.client_level))


METHODS: dict[str, Method[Any]] = {
    method.name: method
    for method in (
        Method(
            "fedsrcvar",
            NoSettings,
            _fedsrcvar,
            has_threshold=True,
            private=True,
            distributed=True,
            corrects_drift=True,
            server_momentum=DEFAULT_SERVER_MOMENTUM,
        ),
        Method("fedavg", FedAvgSettings, baselines.run_fedavg, rho_free=True, private=True, corrects_drift=True),
        # FedAvgM is FedAvg's run with server momentum (Hsu et al. 2019 use 0.9 among others).
        Method(
            "fedavgm",
            NoSettings,
            lambda task, _: baselines.run_fedavg(task, FedAvgSettings()),
            rho_free=True,
            server_momentum=DEFAULT_SERVER_MOMENTUM,
        ),
        Method("afl", AFLSettings, baselines.run_afl, rho_free=True),
        Method("qfedavg", QFedAvgSettings, baselines.run_qfedavg, rho_free=True),
        Method("fedminmax", FedMinMaxSettings, minimax.run_fedminmax, rho_free=True, needs_groups=True),
        Method(
            "propfair",
            PropFairSettings,
            _propfair,
            rho_free=True,
            distributed=True,
            server_momentum=0.0,
            secure_only_private=True,
        ),
        Method(
            "term", TERMSettings, _term, rho_free=True, distributed=True, server_momentum=0.0, secure_only_private=True
        ),
        Method(
            "deltafl",
            DeltaFLSettings,
            _deltafl,
            rho_free=True,
            distributed=True,
            server_momentum=0.0,
            secure_only_private=True,
        ),
        Method("central-erm", NoSettings, lambda task, _: baselines.run_central_erm(task), rho_free=True),
        Method("central-cvar", NoSettings, lambda task, _: baselines.run_central_cvar(task), has_threshold=True),
        Method("bpf", BPFSettings, minimax.run_bpf),
        Method("dro", NoSettings, lambda task, _: dro.run_dro(task)),
    )
}
"""Every method by its --method name, in the order the command line lists them."""


def method_named(name: str) -> Method[Any]:
    """The method called `name`, or ConfigError listing the choices."""
    if name not in METHODS:
        raise ConfigError(f"unknown method '{name}'; choose one of: {', '.join(METHODS)}")
    return METHODS[name]


def settings_for(name: str, given: Mapping[str, object]) -> MethodSettings:
    """Method `name`'s settings from the method-only flags `given` (by field name; absent: the default).

    A flag the method does not take is refused, saying whose it is (`WHOSE`).
    """
    method = method_named(name)
    own_fields = {field.name for field in fields(method.settings)}
    for key in given:
        if key not in own_fields:
            raise ConfigError(f"{WHOSE[key]}; drop it for --method {name}")
    settings: MethodSettings = method.settings(**given)  # each key is one of its fields, checked above
    return settings
