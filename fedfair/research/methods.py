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
from typing import TypeVar

from fedfair.core.config import DEFAULT_SERVER_MOMENTUM, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.privacy.config import PrivacyConfig
from fedfair.research import baselines, dro, fairness_baselines, minimax
from fedfair.secagg import EncodingConfig, largest_safe_fractional_bits
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import RoundCallback, SimulationOptions, SimulationResult, run_fedsrcvar
from fedfair.simulation.secure import DistributedDP, SecureSum, federation_dp

# ---------------------------------------------------------------- each method's own settings


@dataclass(frozen=True)
class NoSettings:
    """A method that takes no settings of its own."""


@dataclass(frozen=True)
class FedAvgSettings:
    """FedAvg's settings: local passes instead of local steps."""

    local_epochs: int | None = None
    """E passes over each collaborator's data per round instead of --local-steps (None: the steps)."""


@dataclass(frozen=True)
class ReadsLosses:
    """Settings of a method whose server reads the collaborators' losses at theta_t every round."""

    loss_rows: int = 0
    """Rows per collaborator each round's losses are read from (0: all)."""

    def __post_init__(self) -> None:
        baselines.LossRows.check(self.loss_rows)


@dataclass(frozen=True)
class AFLSettings(ReadsLosses):
    """AFL's settings: the ascent on the collaborators' mixture weights."""

    mixture_lr: float = 0.01
    """Step size of the ascent on the collaborators' mixture weights."""


@dataclass(frozen=True)
class QFedAvgSettings(ReadsLosses):
    """q-FedAvg's settings: its fairness exponent q."""

    q: float = 1.0
    """The fairness exponent (0 is FedAvg with equal weights)."""


@dataclass(frozen=True)
class FedMinMaxSettings(ReadsLosses):
    """FedMinMax's settings: the ascent on the group weights, and which groups."""

    adversary_lr: float = 0.1
    """Step size of the ascent on the group weights."""
    groups: str | None = None
    """The sensitive column whose groups it protects (None: the partition column)."""


@dataclass(frozen=True)
class BPFSettings:
    """BPF's settings: the ascent on the per-sample weights."""

    adversary_lr: float = 0.1
    """Step size of the ascent on the sample weights."""


@dataclass(frozen=True)
class PropFairSettings:
    """PropFair's settings: the ceiling M of its utilities M - F_k."""

    ceiling: float = 5.0
    """M in -log(M - F_k); it should exceed the losses met (ln K at the uniform start)."""

    def __post_init__(self) -> None:
        fairness_baselines.check_ceiling(self.ceiling)


@dataclass(frozen=True)
class TERMSettings(ReadsLosses):
    """TERM's settings: its tilt t."""

    tilt: float = 1.0
    """t > 0 in (1/t) log mean exp(t l_i); larger t nears the worst sample's loss, t -> 0 is FedAvg."""

    def __post_init__(self) -> None:
        super().__post_init__()
        fairness_baselines.check_tilt(self.tilt)


@dataclass(frozen=True)
class DeltaFLSettings(ReadsLosses):
    """Delta-FL's settings: the superquantile level over clients."""

    client_level: float = 0.5
    """The share of client weight in the tail whose mean loss it minimises (1: every client, FedAvg)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        fairness_baselines.check_level(self.client_level)


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


@dataclass(frozen=True)
class Task:
    """What every method trains on and with: the federation and the settings all methods share."""

    federation: Federation
    objective: ObjectiveConfig
    training: TrainingConfig
    privacy: PrivacyConfig
    options: SimulationOptions = SimulationOptions()
    secure_aggregation: bool = False
    on_round: RoundCallback | None = None
    colluders: int = 0
    """Under distributed DP, the sites that may collude with the aggregator (the others carry the noise)."""

    def __post_init__(self) -> None:
        """Refuse distributed DP without the secure sum: its sites add no noise of their own."""
        if self.privacy.enabled and self.privacy.mode == "distributed" and not self.secure_aggregation:
            raise ConfigError(
                "distributed DP adds its noise inside the secure sum and none at the sites; "
                "pass --secure-aggregation (Task.secure_aggregation = True)"
            )


@dataclass(frozen=True)
class Method:
    """One method: its settings' type, how it runs, and what it supports."""

    name: str
    settings: type[MethodSettings]
    run: Callable[[Task, MethodSettings], SimulationResult]
    has_threshold: bool = False
    """Whether it trains the RCVaR threshold c (its result reports c)."""
    rho_free: bool = False
    """Its objective has no epsilon or rho, so its step size is --baseline-lr, not one scaled by them."""
    private: bool = False
    """Whether it can train with DP-SGD."""
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


Settings = TypeVar("Settings", bound=MethodSettings)


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


def _fedsrcvar(task: Task, settings: MethodSettings) -> SimulationResult:
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


def _fedavg(task: Task, settings: MethodSettings) -> SimulationResult:
    local_epochs = own(settings, FedAvgSettings).local_epochs
    return baselines.run_fedavg(
        task.federation,
        task.training,
        options=task.options,
        local_epochs=local_epochs,
        on_round=task.on_round,
        privacy=task.privacy,
    )


def _fedavg_momentum(task: Task, settings: MethodSettings) -> SimulationResult:
    return baselines.run_fedavg(task.federation, task.training, options=task.options, on_round=task.on_round)


def _afl(task: Task, settings: MethodSettings) -> SimulationResult:
    afl = own(settings, AFLSettings)
    return baselines.run_afl(
        task.federation,
        task.training,
        options=task.options,
        mixture_lr=afl.mixture_lr,
        loss_rows=afl.loss_rows,
        on_round=task.on_round,
    )


def _qfedavg(task: Task, settings: MethodSettings) -> SimulationResult:
    qfedavg = own(settings, QFedAvgSettings)
    return baselines.run_qfedavg(
        task.federation,
        task.training,
        options=task.options,
        q=qfedavg.q,
        loss_rows=qfedavg.loss_rows,
        on_round=task.on_round,
    )


def _fedminmax(task: Task, settings: MethodSettings) -> SimulationResult:
    fedminmax = own(settings, FedMinMaxSettings)
    if not isinstance(task.federation, minimax.GroupedFederation):
        raise ConfigError(
            "FedMinMax needs every training sample's sensitive group: build the federation with "
            "load_federation(config) for --method fedminmax, or attach them with minimax.with_groups"
        )
    return minimax.run_fedminmax(
        task.federation,
        task.training,
        options=task.options,
        adversary_lr=fedminmax.adversary_lr,
        loss_rows=fedminmax.loss_rows,
        on_round=task.on_round,
    )


def _bpf(task: Task, settings: MethodSettings) -> SimulationResult:
    adversary_lr = own(settings, BPFSettings).adversary_lr
    return minimax.run_bpf(
        task.federation,
        task.objective,
        task.training,
        adversary_lr=adversary_lr,
        options=task.options,
        on_round=task.on_round,
    )


def _propfair(task: Task, settings: MethodSettings) -> SimulationResult:
    ceiling = own(settings, PropFairSettings).ceiling
    return fairness_baselines.run_propfair(
        task.federation, task.training, ceiling=ceiling, options=task.options, on_round=task.on_round
    )


def _term(task: Task, settings: MethodSettings) -> SimulationResult:
    term = own(settings, TERMSettings)
    return fairness_baselines.run_term(
        task.federation,
        task.training,
        tilt=term.tilt,
        loss_rows=term.loss_rows,
        options=task.options,
        on_round=task.on_round,
    )


def _deltafl(task: Task, settings: MethodSettings) -> SimulationResult:
    deltafl = own(settings, DeltaFLSettings)
    return fairness_baselines.run_deltafl(
        task.federation,
        task.training,
        level=deltafl.client_level,
        loss_rows=deltafl.loss_rows,
        options=task.options,
        on_round=task.on_round,
    )


def _central_erm(task: Task, settings: MethodSettings) -> SimulationResult:
    return baselines.run_central_erm(task.federation, task.training, options=task.options, on_round=task.on_round)


def _central_cvar(task: Task, settings: MethodSettings) -> SimulationResult:
    return baselines.run_central_cvar(
        task.federation, task.objective, task.training, options=task.options, on_round=task.on_round
    )


def _dro(task: Task, settings: MethodSettings) -> SimulationResult:
    return dro.run_dro(task.federation, task.objective, task.training, options=task.options, on_round=task.on_round)


METHODS: dict[str, Method] = {
    method.name: method
    for method in (
        Method(
            "fedsrcvar",
            NoSettings,
            _fedsrcvar,
            has_threshold=True,
            private=True,
            corrects_drift=True,
            server_momentum=DEFAULT_SERVER_MOMENTUM,
        ),
        Method("fedavg", FedAvgSettings, _fedavg, rho_free=True, private=True, corrects_drift=True),
        # FedAvgM is FedAvg's run with server momentum (Hsu et al. 2019 use 0.9 among others).
        Method("fedavgm", NoSettings, _fedavg_momentum, rho_free=True, server_momentum=DEFAULT_SERVER_MOMENTUM),
        Method("afl", AFLSettings, _afl, rho_free=True),
        Method("qfedavg", QFedAvgSettings, _qfedavg, rho_free=True),
        Method("fedminmax", FedMinMaxSettings, _fedminmax, rho_free=True, needs_groups=True),
        Method("propfair", PropFairSettings, _propfair, rho_free=True, server_momentum=0.0),
        Method("term", TERMSettings, _term, rho_free=True, server_momentum=0.0),
        Method("deltafl", DeltaFLSettings, _deltafl, rho_free=True, server_momentum=0.0),
        Method("central-erm", NoSettings, _central_erm, rho_free=True),
        Method("central-cvar", NoSettings, _central_cvar, has_threshold=True),
        Method("bpf", BPFSettings, _bpf),
        Method("dro", NoSettings, _dro),
    )
}
"""Every method by its --method name, in the order the command line lists them."""


def method_named(name: str) -> Method:
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
    return method.settings(**given)  # type: ignore[arg-type]  # each key is one of this dataclass's fields
