"""The paper study's runs: each method's hyperparameter points, and the `fedfair simulate` flags of each.

A `Study` is one dataset and profile; its runs share the flags of `Study.base` and differ by a `Point` (a
step, the method's own settings). On a fixed grid `Study.grid` lists a method's points; under the tuning
protocol (`Profile.ladders`) its `tuning.Search` does, each at `ladder_point`. How a point is chosen is
:mod:`fedfair.research.selection`; what the study writes, :mod:`fedfair.research.reproduce`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from fedfair.research import convergence, tuning
from fedfair.research.flags import default_step_size, momentum_step_scale
from fedfair.research.method_names import LOSS_METHODS
from fedfair.research.methods import METHODS
from fedfair.research.paper_splits import PaperSplit
from fedfair.research.profiles import DEFAULT_EPSILON, TABLE_RHO, Profile
from fedfair.research.runs import Run


METHOD_LABELS = {
    "fedsrcvar": "FedSRCVaR",
    "fedavg": "FedAvg",
    "fedavgm": "FedAvgM",
    "afl": "AFL",
    "qfedavg": "q-FedAvg",
    "propfair": "PropFair",
    "term": "TERM",
    "deltafl": "Delta-FL",
    "bpf": "BPF (central)",
    "dro": "DRO (central)",
    "central-cvar": "CVaR-SGD (central)",
    "central-erm": "ERM (central)",
    "fedminmax": "FedMinMax (knows the groups)",
}
RCVAR_METHODS = ("fedsrcvar", "central-cvar")
"""Methods whose default step follows the objective's curvature (epsilon and rho)."""
ADVERSARY_METHODS = ("bpf", "fedminmax")
"""Methods with an adversary whose step (`--adversary-lr`) the protocol chooses too."""
OWN_GRIDS = {
    "propfair": ("--ceiling", (3.0, 5.0)),
    "term": ("--tilt", (1.0, 5.0)),
    "deltafl": ("--client-level", (0.1, 0.5)),
}
"""The setting of each fairness baseline that its grid spans, as FedSRCVaR's spans two epsilons: PropFair's
ceiling M (above ln 10, MNIST's loss at the uniform start), TERM's tilt t and Delta-FL's level over clients."""
LOCAL_STEP_METHODS = ("fedavg", "fedsrcvar", "fedavgm", *OWN_GRIDS)
"""The methods tuned over local steps as FedAvg is (the others take one a round)."""
FEDAVGM_MOMENTA = (0.0, 0.7, 0.9, 0.97)
"""FedAvgM's server momenta (Hsu et al. 2019 try 0.7 to 0.99; 0 is FedAvg), each at the same effective step:
four values, so that its grid is as large as FedSRCVaR's two epsilons times two server steps."""
PAPER_BOUND = 1.0
"""B, the threshold's bound, in the RCVaR methods' runs: Algorithm 1 starts c at B = 1. fedfair's B = 10
costs the first rounds: c descends at most (1 - epsilon) lr per step, about 180 rounds of an MLP on
Census-Income at rho = 0.1, while theta sees only the epsilon-weighted mean and drifts toward ERM."""


@dataclass(frozen=True)
class Study:
    """The runs of one dataset and profile, and how to read the figures off their results."""

    dataset: str
    profile: Profile
    methods: tuple[str, ...]
    device: str = "cpu"
    loss_rows: int = 0
    """`--loss-rows` of the methods that read losses every round (0: all rows)."""
    split: PaperSplit = PaperSplit("race", 3)
    """How the runs split the dataset into clients."""
    groups: str | None = None
    """The sensitive column FedMinMax is told (`--groups`; None: simulate's default, the partition column). No
    other method's runs name it: they never see a group."""

    @property
    def rhos(self) -> tuple[float, ...]:
        """Every rho the study judges at: the profile's and the table's."""
        return tuple(sorted(set(self.profile.rhos) | {TABLE_RHO}))

    def base(self, method: str, rho: float, seed: int) -> list[str]:
        """The experiment flags every run of `method` at `rho` and `seed` shares (a rho-free method trains once)."""
        p = self.profile
        # A method without rho trains the same model whatever rho is: one run, judged at every rho.
        trained_at = TABLE_RHO if METHODS[method].rho_free else rho
        flags = [
            "--dataset",
            self.dataset,
            *self.split.flags,
            "--model",
            p.model,
            "--method",
            method,
            "--rho",
            f"{trained_at:g}",
        ]
        # The device is not part of a run's identity unless it is asked for: a CPU cache stays valid.
        device = [] if self.device == "cpu" else ["--device", self.device]
        # Likewise the loss rows: a run that reads every row keeps the key it always had.
        rows = ["--loss-rows", str(self.loss_rows)] if self.loss_rows and method in LOSS_METHODS else []
        groups = ["--groups", self.groups] if self.groups is not None and method == "fedminmax" else []
        return [*flags, "--rounds", str(p.rounds), "--seed", str(seed), *device, *rows, *groups]

    def grid(self, method: str, rho: float) -> list[Point]:
        """The hyperparameter points of `method` at `rho` (under the tuning protocol: its starting grid)."""
        p = self.profile
        if p.ladders:
            search = self.search(method)
            return [ladder_point(method, search.axes, point) for point in search.start()]
        epsilons = p.fedsrcvar_epsilons if method == "fedsrcvar" else (None,)
        # FedSRCVaR and the methods tuned alike try FedAvg's local steps too: all send one update per round.
        steps = p.fedavg_local_steps if method in LOCAL_STEP_METHODS else (1,)
        adversaries = p.adversary_lrs if method in ADVERSARY_METHODS else (None,)
        momenta: tuple[float | None, ...] = (None,)
        if method == "fedavgm":
            momenta = FEDAVGM_MOMENTA
        elif method == "fedsrcvar" or method in OWN_GRIDS:
            momenta = p.server_momenta
        owns = OWN_GRIDS[method][1] if method in OWN_GRIDS else (None,)
        return [
            Point(scale, epsilon, local_steps, adversary, momentum, setting)
            for momentum in momenta
            for epsilon in epsilons
            for setting in owns
            for local_steps in steps
            for adversary in adversaries
            for scale in p.lr_scales
        ]

    def search(self, method: str) -> tuning.Search:
        """`method`'s search under the tuning protocol, nothing tried yet (its axes: `tuning.axes_of`)."""
        axes = tuning.axes_of(method, method in LOCAL_STEP_METHODS, METHODS[method].server_momentum is not None)
        return tuning.Search(axes, tuning.EXTENSION_RUNS)

    def validation_run(self, method: str, rho: float, point: Point) -> Run:
        """The validation run (seed 0) of `point` of `method` at `rho`, judged at every rho it serves."""
        return Run((*self.base(method, rho, 0), *point.flags(method, rho)), "validation", self.judged_at(method))

    def judged_at(self, method: str) -> tuple[float, ...]:
        """The rhos beyond its own that a run of `method` is judged at (all of them without rho)."""
        return tuple(rho for rho in self.rhos if rho != TABLE_RHO) if METHODS[method].rho_free else ()

    def selection_runs(self, method: str, rho: float) -> list[Run]:
        """One validation run (seed 0) per grid point of `method` at `rho`, judged at every rho it serves."""
        return [self.validation_run(method, rho, point) for point in self.grid(method, rho)]

    def test_runs(self, method: str, rho: float, point: Point, composition: tuple[str, ...] = ()) -> list[Run]:
        """The test runs of the chosen `point`: one per seed of the profile."""
        flags, rhos = point.flags(method, rho), self.judged_at(method)
        return [
            Run((*self.base(method, rho, seed), *flags), "test", rhos, composition)
            for seed in range(self.profile.seeds)
        ]

    def traced_runs(self, method: str, rho: float, point: Point, rounds: int) -> list[Run]:
        """The test runs of `point` at `rounds` rounds, each keeping its training trace (the convergence table)."""
        lasting = dataclasses.replace(self, profile=dataclasses.replace(self.profile, rounds=rounds))
        runs = lasting.test_runs(method, rho, point)
        return [dataclasses.replace(run, history_every=convergence.HISTORY_EVERY) for run in runs]


@dataclass(frozen=True)
class Point:
    """One hyperparameter choice.

    A multiple of the method's default step, FedSRCVaR's epsilon (None: the method has none, or the figure fixes
    it), the local steps per round, the adversary's step, the server momentum (None: the method's default),
    the method's own setting in `OWN_GRIDS` (None: it has none), an absolute step in place of the multiple
    (None: the multiple; the tuning protocol's points set it and leave `scale` at 1) and FedSRCVaR's
    smoothing width gamma (None: its default).
    """

    scale: float
    epsilon: float | None = None
    local_steps: int = 1
    adversary_lr: float | None = None
    momentum: float | None = None
    setting: float | None = None
    step: float | None = None
    gamma: float | None = None

    def flags(self, method: str, rho: float) -> tuple[str, ...]:
        """The `fedfair simulate` flags of this point.

        The default step of the RCVaR methods is fedfair's 0.5 / ((1 - eps) / rho + eps), scaled; BPF's is that
        at eps = 0, 0.5 rho (its sample weights reach 1 / rho); the others' default is 0.5, scaled; an absolute
        `step` replaces all of them, the same for every method. A method with server momentum takes that times
        `momentum_step_scale` under its momentum, as `fedfair simulate` takes it.
        """
        if self.step is not None:
            lr = self.step
        elif method in RCVAR_METHODS:
            lr = self.scale * default_step_size(DEFAULT_EPSILON if self.epsilon is None else self.epsilon, rho)
        elif method == "bpf":
            # Its ratios reach 1 / rho, as CVaR's weights do: CVaR's step (epsilon 0), not ERM's.
            lr = self.scale * default_step_size(0.0, rho)
        else:
            lr = self.scale * 0.5
        momentum = self.momentum_of(method)
        if momentum is not None:
            lr *= momentum_step_scale(momentum)
        flags = ["--lr", f"{lr:.6g}", "--threshold-lr", f"{lr:.6g}", "--local-steps", str(self.local_steps)]
        if method in RCVAR_METHODS:
            flags += ["--bound", f"{PAPER_BOUND:g}"]
        if momentum is not None:  # said outright, so a cached run from before a default momentum is not reused
            flags += ["--server-momentum", f"{momentum:g}"]
        if self.setting is not None:
            flags += [OWN_GRIDS[method][0], f"{self.setting:g}"]
        if self.epsilon is not None:
            flags += ["--epsilon", f"{self.epsilon:g}"]
        elif method == "bpf":  # said outright: BPF's runs from before its default became 0 ran at 0.1
            flags += ["--epsilon", "0"]
        if self.gamma is not None:
            flags += ["--gamma", f"{self.gamma:g}"]
        if self.adversary_lr is not None:
            flags += ["--adversary-lr", f"{self.adversary_lr:g}"]
        return tuple(flags)

    def momentum_of(self, method: str) -> float | None:
        """The point's server momentum for `method`: its default when the grid leaves it unset; None: it takes none."""
        default = METHODS[method].server_momentum
        if default is None:
            return None
        return default if self.momentum is None else self.momentum

    def describe(self, method: str = "fedsrcvar") -> str:
        """The point of `method` in words for the tables, e.g. ``step x0.5, epsilon 0.05``."""
        parts = [f"step x{self.scale:g}" if self.step is None else f"step {self.step:g}"]
        if self.epsilon is not None:
            parts.append(f"epsilon {self.epsilon:g}")
        if self.gamma is not None:
            parts.append(f"gamma {self.gamma:g}")
        if self.local_steps != 1:
            parts.append(f"{self.local_steps} local steps")
        if self.adversary_lr is not None:
            parts.append(f"adversary step {self.adversary_lr:g}")
        if self.setting is not None:
            parts.append(f"{OWN_GRIDS[method][0].removeprefix('--')} {self.setting:g}")
        if self.momentum is not None:
            plain = "Algorithm 1's server step" if method == "fedsrcvar" else "plain server step"
            parts.append(f"server momentum {self.momentum:g}" if self.momentum else plain)
        return ", ".join(parts)


OWN_SETTING_AXES = {"tilt", "ceiling", "client level"}
"""The tuning protocol's axes that are a method's `Point.setting` (its flag in `OWN_GRIDS`)."""


def ladder_point(method: str, axes: Sequence[tuning.Axis], coordinates: tuning.Coordinates) -> Point:
    """The `Point` of `method` at `coordinates` of its tuning-protocol `axes` (its step absolute)."""
    values = dict(zip((axis.name for axis in axes), coordinates, strict=True))
    settings = [value for name, value in values.items() if name in OWN_SETTING_AXES]
    return Point(
        1.0,
        epsilon=values.get(tuning.EPSILON.name),
        local_steps=int(values.get(tuning.LOCAL_STEPS.name, 1)),
        adversary_lr=values.get(tuning.ADVERSARY.name),
        momentum=values.get(tuning.MOMENTUM.name),
        setting=settings[0] if settings else None,
        step=values[tuning.STEP.name],
        gamma=values.get(tuning.GAMMA.name),
    )
