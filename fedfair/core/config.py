"""The learning core's settings: the objective's knobs, a collaborator's local steps, the schedule.

Plain frozen dataclasses that check themselves and import no torch, so the plan
reader, the experiment flags, the Python API and the simulation all build these very
objects (one definition of every setting, no copies to keep in step).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedfair.core.errors import ConfigError

if TYPE_CHECKING:
    from fedfair.core.server import Adam

SMOOTH_FUNCTIONS = ("softrelu", "quadratic", "zang")
"""Names of the smooth plus functions (fedfair.core.objective builds them)."""

MODEL_NAMES = ("logreg", "mlp", "cnn")
"""Names of the built-in models (fedfair.core.models builds them)."""

FACTORY_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""A model factory's path: a module's dotted name, a colon, the function's (possibly dotted) name."""

DRIFT_CORRECTIONS = ("none", "scaffold")
"""How local steps are kept from drifting toward each collaborator's own optimum (LocalConfig.drift_correction)."""


@dataclass(frozen=True)
class Interval:
    """Where a setting's value must lie, stated once.

    The core objects check it, and the plan reader and the command line quote it in their errors (`expected`),
    so no reader keeps its own copy.
    """

    low: float
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    meaning: str = ""

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    @property
    def text(self) -> str:
        """The range in words, e.g. ``(0, 1]``, or ``> 0`` when unbounded above."""
        if math.isinf(self.high):
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        return f"{'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    @property
    def expected(self) -> str:
        """What a reader says a value must be, e.g. "a number in (0, 1] (the smallest group protected)"."""
        where = self.text if math.isinf(self.high) else f"in {self.text}"
        return f"a number {where}" + (f" ({self.meaning})" if self.meaning else "")


EPSILON = Interval(0.0, 1.0, meaning="1 = ERM, 0 = CVaR")
RHO = Interval(0.0, 1.0, low_open=True, meaning="the smallest group protected")
GAMMA = Interval(0.0, low_open=True, meaning="the smoothing width")
BOUND = Interval(0.0, low_open=True, meaning="the cap B on the threshold c")
STEP_SIZE = Interval(0.0, low_open=True)
BATCH_FRACTION = Interval(0.0, 1.0, low_open=True, meaning="each collaborator's batch is round(batch_fraction * n_k)")
SERVER_MOMENTUM = Interval(
    0.0, 1.0, high_open=True, meaning="the server's heavy-ball momentum on the mean update; 0 is Algorithm 1's step"
)
DEFAULT_SERVER_MOMENTUM = 0.9
"""FedSRCVaR's server momentum in `fedfair init`'s plan and `fedfair simulate` (docs/paper.md,
"Fitting as fast as FedAvg")."""
AVERAGE_FROM = Interval(0.0, 1.0, high_open=True, meaning="the fraction of rounds before iterates enter the average")


def check_smooth_plus(name: str, gamma: float) -> None:
    """Refuse an unknown smooth plus function and a smoothing width gamma that is not positive."""
    if gamma not in GAMMA:
        raise ConfigError(f"gamma must be a positive number, got {gamma}; pass --gamma 0.05 (the paper's value)")
    if name not in SMOOTH_FUNCTIONS:
        choices = ", ".join(SMOOTH_FUNCTIONS)
        raise ConfigError(f"unknown smooth plus function '{name}'; choose one of: {choices}")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The knobs of RCVaR: protected group size rho, trade-off epsilon, smoothing, threshold bound B."""

    epsilon: float = 0.1
    rho: float = 0.3
    gamma: float = 0.05
    smooth: str = "softrelu"
    bound: float = 10.0

    def __post_init__(self) -> None:
        if self.rho not in RHO:
            raise ConfigError(
                f"rho must be in {RHO.text}, got {self.rho}; it is the smallest group fraction protected, e.g. --rho 0.3"
            )
        if self.epsilon not in EPSILON:
            raise ConfigError(
                f"epsilon must be in {EPSILON.text}, got {self.epsilon}; 1 is plain ERM, 0 is CVaR, e.g. --epsilon 0.1"
            )
        if self.bound not in BOUND:
            raise ConfigError(
                f"bound must be a positive number, got {self.bound}; it caps the threshold c, e.g. --bound 10"
            )
        check_smooth_plus(self.smooth, self.gamma)


@dataclass(frozen=True)
class LocalConfig:
    """How a collaborator trains within a round.

    `lr` is eta (for theta), `threshold_lr` is eta_c (for c). With `reuse_batch`
    one mini-batch is drawn per round and used for all tau steps, as the
    algorithm box literally reads; by default every step draws a fresh one.

    Algorithm 1 projects c onto [0, B] only at the server, after averaging; within a
    round the tau local steps leave c unconstrained. `project_locally` also projects
    c after every local step (projected local SGD). It changes nothing when tau = 1
    and no client's step leaves [0, B]; it helps when local steps throw c far outside
    the box, so that the rest of the round's steps, theta's included, would be taken
    at an infeasible c: under DP-SGD, where each step adds Gaussian noise to c of
    standard deviation threshold_lr * sigma * C / b_k, with a large `threshold_lr`,
    or with many local steps. Projection is post-processing, so it costs no privacy.

    `drift_correction` "scaffold" adds SCAFFOLD's control variates (Karimireddy et al.
    2020, option II) for theta and c alike: each local step is corrected by the
    difference between the federation's and the collaborator's estimate of the
    gradient, so tau > 1 local steps no longer pull theta toward the collaborator's
    own optimum and c toward its own (1 - rho)-quantile. Each collaborator then sends
    twice as many numbers per round (its control variate's change beside its update),
    still as one secure sum. "none" is Algorithm 1 as written. The corrected steps act
    on a one-round-old estimate, so they are stable only for a step well below what
    plain local SGD tolerates (docs/paper.md, the drift study).
    """

    local_steps: int = 1
    lr: float = 0.1
    threshold_lr: float = 0.1
    reuse_batch: bool = False
    project_locally: bool = False
    drift_correction: str = "none"

    def __post_init__(self) -> None:
        if self.local_steps < 1:
            raise ConfigError(f"local steps must be at least 1, got {self.local_steps}; pass --local-steps 1")
        for name, value in (("lr", self.lr), ("threshold_lr", self.threshold_lr)):
            if value not in STEP_SIZE:
                raise ConfigError(f"{name} must be a positive number, got {value}; e.g. --{name.replace('_', '-')} 0.1")
        if self.drift_correction not in DRIFT_CORRECTIONS:
            choices = ", ".join(DRIFT_CORRECTIONS)
            raise ConfigError(
                f"unknown drift correction '{self.drift_correction}'; choose one of: {choices} "
                "(e.g. --drift-correction scaffold)"
            )

    @property
    def corrects_drift(self) -> bool:
        """Whether local steps carry control variates (any drift correction but "none")."""
        return self.drift_correction != "none"


@dataclass(frozen=True)
class TrainingConfig:
    """Algorithm 1's schedule: rounds, batches, local steps, seed, averaged output, server step.

    The plan's ``[training]``, the experiment flags, the Python API and the simulation all read
    into this one class; the defaults are Algorithm 1 as the paper runs it.

    `batch_size` is the total mini-batch per round, split across collaborators in proportion to
    their sizes (b_k proportional to n_k, as the paper does); 0 means full local batches (b_k = n_k),
    i.e. federated gradient descent. A deployment, where nobody knows the total, sets
    `batch_fraction` instead: b_k = round(f * n_k) (at least 1), which overrides `batch_size`; the
    weights w_k = b_k stay proportional to n_k without any institution revealing n_k.
    `average_from` is the fraction of rounds skipped before averaging: the output averages the pairs
    rounds `average_from_round` + 1, ..., T start from (`server.apply`); 0 is the paper's
    (1/T) sum_{t=1..T} theta^t. c is projected at the server only unless `local.project_locally`.
    `server_momentum` is the server's heavy-ball beta on the mean update (`fedfair.core.server`), a
    function of the sums alone, so nothing more travels; 0 is Algorithm 1's step (`fedfair simulate`
    and `fedfair init` use `DEFAULT_SERVER_MOMENTUM` for FedSRCVaR). `server_adam` is FedAdam's server
    step instead (`fedfair.core.server.Adam`, with `server_momentum` 0; docs/paper.md measures it).
    """

    rounds: int = 1000
    local: LocalConfig = field(default_factory=LocalConfig)
    batch_size: int = 1024
    batch_fraction: float | None = None
    seed: int = 0
    average_from: float = 0.5
    server_momentum: float = 0.0
    server_adam: Adam | None = None

    def __post_init__(self) -> None:
        if self.server_momentum not in SERVER_MOMENTUM:
            raise ConfigError(
                f"server momentum must be in {SERVER_MOMENTUM.text}, got {self.server_momentum}; e.g. --server-momentum 0.9"
            )
        if self.server_adam is not None and self.server_momentum > 0.0:
            raise ConfigError(
                "the server takes FedAdam's step or heavy-ball momentum, not both; set --server-momentum 0"
            )
        if self.rounds < 1:
            raise ConfigError(f"rounds must be at least 1, got {self.rounds}; e.g. --rounds 1000")
        if self.batch_size < 0:
            raise ConfigError(f"batch size must be 0 (full batches) or positive, got {self.batch_size}")
        if self.batch_fraction is not None and self.batch_fraction not in BATCH_FRACTION:
            raise ConfigError(f"batch fraction must be in {BATCH_FRACTION.text}, got {self.batch_fraction}; e.g. 0.01")
        if self.average_from not in AVERAGE_FROM:
            raise ConfigError(
                f"average_from must be in {AVERAGE_FROM.text}, got {self.average_from}; 0 averages every iterate"
            )

    @property
    def average_from_round(self) -> int:
        """`server.apply`'s average_from: the pairs rounds average_from_round + 1, ..., T start from are averaged."""
        return int(self.average_from * self.rounds)
