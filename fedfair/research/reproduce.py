"""`fedfair reproduce`: the paper's study on one dataset, as CSV tables and PNG figures.

Every run is one set of `fedfair simulate` flags and a split, cached under ``OUT/cache/`` by the
SHA-256 of both: an interrupted reproduction resumes, a second call only redraws the figures.
Runs go to a process pool (``--workers``, every core by default), one compute thread each.

Why: docs/design.md, "Inside the research harness".
"""

from __future__ import annotations

import csv
import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedfair.datasets import load_dataset
from fedfair.research import convergence, fronts, tuning
from fedfair.research.method_names import LOSS_METHODS
from fedfair.research.methods import METHODS
from fedfair.research.paper_splits import PaperSplit, paper_split
from fedfair.research.profiles import DEFAULT_EPSILON, TABLE_RHO, Profile
from fedfair.research.flags import default_step_size, momentum_step_scale
from fedfair.research.runs import Run, judged_at, run_all
from fedfair.research.study_options import STUDY_METHODS
from fedfair.research.worst_group import COMPOSITION_COLUMN, COMPOSITION_RHOS, composition_rows


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
FIGURE_METHODS = tuple(method for method in STUDY_METHODS if method != "fedminmax")
"""Figure 2's methods, in its legend's order; those this build lacks are left out and said so."""
TABLE_METHODS = ("fedminmax", "fedsrcvar", "fedavg")
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
METRICS = ("worst_risk", "mean_risk", "disparity", "accuracy")


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
        return [*flags, "--rounds", str(p.rounds), "--seed", str(seed), *device, *rows]

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


def chosen(study: Study, method: str, rho: float, results: Mapping[Run, dict[str, Any]]) -> Point:
    """The grid point with the lowest validation worst-group risk (ties: the first; a diverged run's NaN never wins)."""
    runs = study.selection_runs(method, rho)
    risks = [judged_at(results[run], rho)["worst_risk"] for run in runs]
    best = min(range(len(runs)), key=lambda index: risks[index] if math.isfinite(risks[index]) else math.inf)
    return study.grid(method, rho)[best]


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


@dataclass(frozen=True)
class Selection:
    """How one method's point at one rho was chosen: every validation point tried, the choice, and its marks."""

    points: tuple[Point, ...]
    runs: tuple[Run, ...]
    choice: Point
    limits: tuple[str, ...] = ()
    """Why the choice is not strictly inside finite neighbours on every axis (`tuning.Search.limits`)."""
    search: tuning.Search | None = None
    """The tuning protocol's search (None: a fixed grid)."""


def select(
    study: Study, wanted: Sequence[tuple[str, float]], cache_folder: Path, workers: int, on_ray: bool = False
) -> tuple[dict[tuple[str, float], Selection], dict[Run, dict[str, Any]]]:
    """Each (method, rho) of `wanted` chosen on validation rows, with every validation result it read.

    On a fixed grid: every point, then `chosen`. Under the tuning protocol (`Profile.ladders`): each one's
    `tuning.Search` run to its end, the points of every search trained together each round.
    """
    if not study.profile.ladders:
        runs = [run for method, rho in wanted for run in study.selection_runs(method, rho)]
        fixed = run_all(runs, cache_folder, workers, "choosing hyperparameters", on_ray)
        return {
            (method, rho): Selection(
                tuple(study.grid(method, rho)),
                tuple(study.selection_runs(method, rho)),
                chosen(study, method, rho, fixed),
            )
            for method, rho in wanted
        }, fixed
    searches = [study.search(method) for method, _ in wanted]
    results: dict[Run, dict[str, Any]] = {}

    def evaluate(asked: list[tuple[int, tuning.Coordinates]]) -> list[float]:
        runs = [study.validation_run(*pair(index, point)) for index, point in asked]
        results.update(run_all(runs, cache_folder, workers, "choosing hyperparameters", on_ray))
        pairs = zip(runs, asked, strict=True)
        return [float(judged_at(results[run], wanted[index][1])["worst_risk"]) for run, (index, _) in pairs]

    def pair(index: int, point: tuning.Coordinates) -> tuple[str, float, Point]:
        method, rho = wanted[index]
        return method, rho, ladder_point(method, searches[index].axes, point)

    tuning.settle(searches, evaluate)
    selections = {}
    for (method, rho), search in zip(wanted, searches, strict=True):
        points = tuple(ladder_point(method, search.axes, point) for point in search.tried)
        selections[(method, rho)] = Selection(
            points,
            tuple(study.validation_run(method, rho, point) for point in points),
            ladder_point(method, search.axes, search.choice()),
            tuple(search.limits()),
            search,
        )
    return selections, results


def judged_points(
    study: Study, results: Mapping[Run, dict[str, Any]], selections: Mapping[tuple[str, float], Selection]
) -> list[fronts.Judged]:
    """Every study method's validation points at every rho the study judges, read off their cached `results`."""
    return [
        fronts.Judged(
            rho,
            METHOD_LABELS[method],
            point.describe(method),
            float(judged_at(results[run], rho)["mean_risk"]),
            float(judged_at(results[run], rho)["worst_risk"]),
            point == selections[(method, rho)].choice,
        )
        for rho in study.rhos
        for method in study.methods
        for point, run in zip(selections[(method, rho)].points, selections[(method, rho)].runs, strict=True)
    ]


def tuning_rows(selections: Mapping[tuple[str, float], Selection]) -> list[dict[str, Any]]:
    """Every point the tuning protocol tried, a row each: where it sits on its method's axes and what it read.

    `coordinates` lists the point's value on each of `axes` (both joined by " | "), so that a reader can check
    the edge rule against the ladders (`tuning`) from this table alone.
    """
    rows = []
    for (method, rho), selection in selections.items():
        search = selection.search
        if search is None:
            continue
        choice = search.choice()
        for point, (coordinates, risk) in zip(selection.points, search.tried.items(), strict=True):
            rows.append(
                {
                    "method": METHOD_LABELS[method],
                    "rho": rho,
                    "axes": " | ".join(axis.name for axis in search.axes),
                    "coordinates": " | ".join(f"{value:g}" for value in coordinates),
                    "point": point.describe(method),
                    "round": search.round_of[coordinates],
                    "worst_risk": risk,
                    "chosen": coordinates == choice,
                }
            )
    return rows


def grid_rows(study: Study) -> list[dict[str, Any]]:
    """The tuning protocol's axes of every study method: its ladder, where it starts, what its ends are."""
    return [
        {
            "method": METHOD_LABELS[method],
            "axis": axis.name,
            "ladder": " ".join(f"{value:g}" for value in axis.ladder),
            "start": " ".join(f"{value:g}" for value in axis.start),
            "below": axis.below,
            "above": axis.above,
            "starting_points": len(search.start()),
            "budget": search.budget,
        }
        for method in study.methods
        for search in (study.search(method),)
        for axis in search.axes
    ]


def convergence_rows(
    study: Study,
    choice: Mapping[tuple[str, float], Point],
    rounds: Sequence[int],
    cache_folder: Path,
    workers: int,
    on_ray: bool = False,
) -> list[dict[str, Any]]:
    """Every study method's chosen point at every rho, traced at each of `rounds` (cached): a row per seed."""
    asked = {
        (method, rho, count): study.traced_runs(method, rho, choice[(method, rho)], count)
        for method in study.methods
        for rho in study.rhos
        for count in rounds
    }
    results = run_all([run for runs in asked.values() for run in runs], cache_folder, workers, "tracing", on_ray)
    return [
        {
            "method": METHOD_LABELS[method],
            "rho": rho,
            "rounds": count,
            "seed": seed,
            "point": choice[(method, rho)].describe(method),
            **convergence.trace_row(results[run], rho),
        }
        for (method, rho, count), runs in asked.items()
        for seed, run in enumerate(runs)
    ]


def summary(results: Sequence[Mapping[str, Any]], rho: float | None = None) -> dict[str, float]:
    """Mean and (population) standard deviation over seeds of each metric at `rho` (None: each run's own)."""
    row: dict[str, float] = {"seeds": float(len(results))}
    for metric in METRICS:
        values = np.array([result[metric] if rho is None else judged_at(result, rho)[metric] for result in results])
        row[f"{metric}_mean"] = float(values.mean())
        row[f"{metric}_std"] = float(values.std())
    return row


def reproduce(
    dataset: str,
    out: Path,
    profile: Profile,
    workers: int,
    device: str = "cpu",
    on_ray: bool = False,
    loss_rows: int = 0,
    split: PaperSplit | None = None,
    methods: Sequence[str] | None = None,
    long_rounds: int | None = None,
) -> dict[str, Path]:
    """Run the study (cached), write its CSV tables and PNG figures under `out`; return their paths.

    With `on_ray` the runs go to the connected Ray cluster (:func:`run_all`); `loss_rows` bounds the rows AFL,
    q-FedAvg and FedMinMax read for their per-round losses (0: all); `split` is the client split (None: the
    dataset's paper split, `paper_split`); `methods` narrows the figures' and the table's methods (None: all of
    them).

    Where the dataset has a race column, it also writes the paper's composition table
    (`composition_race.csv`): FedSRCVaR's worst group at rho 0.1 and 0.3 by race and label. Always each method's
    Pareto fronts (`fronts.csv`, `fronts.png`, from the validation runs); with `long_rounds`, `convergence_rows`.
    """
    wanted = set(FIGURE_METHODS + TABLE_METHODS if methods is None else methods)
    available = tuple(method for method in FIGURE_METHODS if method in METHODS and method in wanted)
    missing = [METHOD_LABELS[method] for method in FIGURE_METHODS if method not in METHODS]
    if missing:
        print(f"fedfair reproduce: this build lacks {', '.join(missing)}; the figures leave them out")
    split = paper_split(dataset) if split is None else split
    study = Study(dataset, profile, available, device, loss_rows, split)
    cache_folder = out / "cache"

    # 1. Choose every method's hyperparameters on validation rows, for every rho.
    rhos = study.rhos
    # FedMinMax is told the groups of the split's column; a split by class or at random has none.
    group_columns = set(load_dataset(dataset).attributes_train)
    grouped = split.partition in group_columns
    table_methods = tuple(
        m for m in TABLE_METHODS if m in METHODS and m in wanted and (grouped or not METHODS[m].needs_groups)
    )
    wanted_pairs = [
        (method, rho)
        for method in dict.fromkeys((*available, *table_methods))
        for rho in (rhos if method in available else (TABLE_RHO,))
    ]
    selections, selected = select(study, wanted_pairs, cache_folder, workers, on_ray)
    choice = {pair: selection.choice for pair, selection in selections.items()}

    # 2. The chosen configurations over seeds on the test rows; the epsilon and tau sweeps take
    # FedSRCVaR's step (and under the tuning protocol its smoothing) chosen at the table's rho.
    testing = [run for (method, rho), point in choice.items() for run in study.test_runs(method, rho, point)]
    anchor = choice[("fedsrcvar", TABLE_RHO)]
    anchor = Point(anchor.scale, momentum=anchor.momentum, step=anchor.step, gamma=anchor.gamma)
    trade_off = {
        (rho, eps): study.test_runs("fedsrcvar", rho, dataclasses.replace(anchor, epsilon=eps))
        for rho in profile.trade_off_rhos
        for eps in profile.epsilons
    }
    taus = {
        (rho, tau): study.test_runs(
            "fedsrcvar", rho, dataclasses.replace(anchor, epsilon=DEFAULT_EPSILON, local_steps=tau)
        )
        for rho in profile.rhos
        for tau in profile.taus
    }
    # The paper's composition table: FedSRCVaR's worst group at each rho, by race and label.
    described = (COMPOSITION_COLUMN,) if COMPOSITION_COLUMN in group_columns else ()
    compositions = {
        rho: study.test_runs("fedsrcvar", rho, dataclasses.replace(anchor, epsilon=DEFAULT_EPSILON), described)
        for rho in (COMPOSITION_RHOS if described else ())
    }
    everything = testing + [
        run for runs in (*trade_off.values(), *taus.values(), *compositions.values()) for run in runs
    ]
    results = run_all(everything, cache_folder, workers, "training over seeds", on_ray)

    classes = next(iter(results.values()))["classes"]
    uniform = math.log(classes)

    def chosen_row(method: str, rho: float) -> dict[str, Any]:
        point = choice[(method, rho)]
        seeds = [results[run] for run in study.test_runs(method, rho, point)]
        row = {"method": METHOD_LABELS[method], "rho": rho, **summary(seeds, rho), "chosen": point.describe(method)}
        if profile.ladders:  # the budget each method used and the marks of its choice, beside it
            selection = selections[(method, rho)]
            row |= {"validation_runs": len(selection.points), "limits": "; ".join(selection.limits)}
        return row

    rho_rows = [chosen_row(method, rho) for method in available for rho in profile.rhos]
    epsilon_rows = [
        {"rho": rho, "epsilon": eps, **summary([results[run] for run in runs])}
        for (rho, eps), runs in trade_off.items()
    ]
    tau_rows = [
        {"method": f"FedSRCVaR tau={tau}", "rho": rho, **summary([results[run] for run in runs]), "chosen": ""}
        for (rho, tau), runs in taus.items()
    ] + [row for row in rho_rows if row["method"] == METHOD_LABELS["fedavg"]]
    table_rows = [chosen_row(method, TABLE_RHO) for method in table_methods]

    out.mkdir(parents=True, exist_ok=True)
    from fedfair.research import figures

    title = f"{dataset} {split.describe()}, {profile.name} profile ({profile.model}, {profile.rounds} rounds, {profile.seeds} seeds)"
    written = {"rho": write_csv(out / "fig2_rho.csv", rho_rows)}
    written["rho_png"] = figures.save(
        figures.risks_versus_rho(read_csv(written["rho"]), uniform, title), out / "fig2_rho.png"
    )
    if epsilon_rows:  # a profile may leave the sweeps out (the "table" profile)
        written["epsilon"] = write_csv(out / "fig3_epsilon.csv", epsilon_rows)
        written["epsilon_png"] = figures.save(
            figures.trade_off(read_csv(written["epsilon"]), title), out / "fig3_epsilon.png"
        )
    if taus:
        written["tau"] = write_csv(out / "fig4_tau.csv", tau_rows)
        written["tau_png"] = figures.save(
            figures.risks_versus_rho(read_csv(written["tau"]), uniform, title), out / "fig4_tau.png"
        )
    written["table"] = write_csv(out / f"table_rho{TABLE_RHO:g}.csv", table_rows)
    written["table_png"] = figures.save(figures.table(read_csv(written["table"]), title), out / "table.png")
    written["fronts"] = write_csv(out / "fronts.csv", fronts.front_rows(judged_points(study, selected, selections)))
    if profile.ladders:
        written["tuning"] = write_csv(out / "tuning.csv", tuning_rows(selections))
        written["grids"] = write_csv(out / "grids.csv", grid_rows(study))
    written["fronts_png"] = figures.save(
        figures.fronts(read_csv(written["fronts"]), uniform, title), out / "fronts.png"
    )
    if long_rounds is not None:
        counts = sorted({profile.rounds, long_rounds})
        traced = convergence_rows(study, choice, counts, cache_folder, workers, on_ray)
        written["convergence"] = write_csv(out / "convergence.csv", traced)
    if compositions:
        by_rho = {rho: [results[run] for run in runs] for rho, runs in compositions.items()}
        rows = composition_rows(by_rho, COMPOSITION_COLUMN)
        written["composition"] = write_csv(out / f"composition_{COMPOSITION_COLUMN}.csv", rows)
        drawn = figures.composition(read_csv(written["composition"]), COMPOSITION_COLUMN, f"FedSRCVaR, {title}")
        written["composition_png"] = figures.save(drawn, out / f"composition_{COMPOSITION_COLUMN}.png")
    return written


# ---------------------------------------------------------------- files


def write_csv(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """`rows` as a CSV table with a header (the first row's keys)."""
    with path.open("w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(path: Path) -> list[dict[str, str]]:
    """A table written by :func:`write_csv`, as text (the figures plot exactly what the files say)."""
    with path.open(newline="") as stream:
        return list(csv.DictReader(stream))
