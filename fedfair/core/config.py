"""The learning core's settings, in one place: the objective's knobs and a collaborator's local steps.

Plain frozen dataclasses that check themselves and import no torch, so the plan
reader, the experiment flags and the simulation all build these very objects
(one definition of every setting, no copies to keep in step).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from fedfair.core.errors import ConfigError

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
        """"(0, 1]", or "> 0" when unbounded above."""
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
BATCH_FRACTION = Interval(
    0.0, 1.0, low_open=True, meaning="each collaborator's batch is round(batch_fraction * n_k)"
)
SERVER_MOMENTUM = Interval(
    0.0, 1.0, high_open=True, meaning="the server's heavy-ball momentum on the mean update; 0 is Algorithm 1's step"
)
DEFAULT_SERVER_MOMENTUM = 0.9
"""FedSRCVaR's server momentum in `fedfair init`'s plan and `fedfair simulate` (docs/paper.md,
"Fitting as fast as FedAvg")."""
AVERAGE_FROM = Interval(
    0.0, 1.0, high_open=True, meaning="the fraction of rounds before iterates enter the average"
)


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
            raise ConfigError(f"rho must be in {RHO.text}, got {self.rho}; it is the smallest group fraction protected, e.g. --rho 0.3")
        if self.epsilon not in EPSILON:
            raise ConfigError(f"epsilon must be in {EPSILON.text}, got {self.epsilon}; 1 is plain ERM, 0 is CVaR, e.g. --epsilon 0.1")
        if self.bound not in BOUND:
            raise ConfigError(f"bound must be a positive number, got {self.bound}; it caps the threshold c, e.g. --bound 10")
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
