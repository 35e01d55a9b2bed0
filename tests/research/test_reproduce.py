"""`fedfair reproduce` on a tiny profile: the protocol, the cache, and figures that show what the tables say."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedfair.cli import main as cli_main
from fedfair.core.errors import ConfigError
from fedfair.datasets import load_dataset
from fedfair.research import figures, reproduce, runs, selection
from fedfair.research.experiment import load_federation
from fedfair.research.methods import METHODS
from fedfair.research.flags import config_from_flags
from fedfair.research.reproduce import read_csv
from fedfair.research.profiles import PROFILES, TABLE_RHO, Profile
from fedfair.research.runs import Run, federation_for, run_all, validation_federation
from fedfair.research.study import FEDAVGM_MOMENTA, METHOD_LABELS, OWN_GRIDS, Point, Study

pytestmark = pytest.mark.slow

TINY = Profile(
    name="tiny",
    rounds=4,
    seeds=2,
    rhos=(0.3,),
    trade_off_rhos=(0.3,),
    epsilons=(0.1, 1.0),
    taus=(1, 2),
    lr_scales=(1.0, 0.5),
    fedsrcvar_epsilons=(0.05,),
    fedavg_local_steps=(1,),
)


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    out = tmp_path_factory.mktemp("reproduce")
    return out, reproduce.reproduce("adult", out, TINY, workers=1)


def test_validation_rows_come_from_training_rows_only() -> None:
    federation = load_federation(config_from_flags(["--dataset", "adult"]))
    carved = validation_federation(federation, seed=0)
    for whole, train, held in zip(federation.train, carved.train, carved.test, strict=True):
        assert train.size + held.size == whole.size
        assert held.size == round(0.2 * whole.size)
        rows = {tuple(row) for row in whole.features.numpy().round(6).tolist()}
        assert {tuple(row) for row in held.features.numpy().round(6).tolist()} <= rows


def test_every_file_is_written_and_every_method_is_in_the_tables(study: tuple[Path, dict[str, Path]]) -> None:
    out, written = study
    for name, path in written.items():
        assert path.exists() and path.stat().st_size > 0, name
    for name in ("rho_png", "epsilon_png", "tau_png", "table_png"):
        assert written[name].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    methods = {row["method"] for row in read_csv(written["rho"])}
    assert methods == {METHOD_LABELS[method] for method in reproduce.FIGURE_METHODS if method in METHODS}
    taus = {row["method"] for row in read_csv(written["tau"])}
    assert taus == {"FedSRCVaR tau=1", "FedSRCVaR tau=2", METHOD_LABELS["fedavg"]}
    assert {float(row["epsilon"]) for row in read_csv(written["epsilon"])} == set(TINY.epsilons)
    assert all(float(row["rho"]) == TABLE_RHO for row in read_csv(written["table"]))


def test_plotted_values_are_the_tables_values(study: tuple[Path, dict[str, Path]]) -> None:
    _, written = study
    rows = read_csv(written["rho"])
    figure = figures.risks_versus_rho(rows, math.log(2), "test")
    lines = {line.get_gid(): line for axis in figure.axes for line in axis.get_lines() if line.get_gid()}
    for row in rows:
        for metric, _ in figures.PANELS:
            line = lines[f"{metric}:{row['method']}"]
            x, y = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
            assert y[list(x).index(float(row["rho"]))] == float(row[f"{metric}_mean"])
    assert list(lines["worst_risk:uniform"].get_ydata()) == [math.log(2)] * 2  # the reference line
    trade = read_csv(written["epsilon"])
    figure = figures.trade_off(trade, "test")
    (line,) = [line for line in figure.axes[0].get_lines() if line.get_gid() == "worst_risk:0.3"]
    ordered = sorted(trade, key=lambda row: float(row["epsilon"]))
    assert list(line.get_ydata()) == [float(row["worst_risk_mean"]) for row in ordered]
    assert list(line.get_xdata()) == [float(row["mean_risk_mean"]) for row in ordered]


def test_each_of_a_full_panels_twelve_methods_has_a_line_of_its_own() -> None:
    # Figure 1 with every method has twelve lines: matplotlib's ten colours alone gave CVaR-SGD FedSRCVaR's blue.
    methods = [METHOD_LABELS[method] for method in reproduce.FIGURE_METHODS if method in METHODS]
    assert len(methods) == 12
    rows = [
        {
            "method": method,
            "rho": "0.1",
            **{f"{metric}_{stat}": "0.5" for metric, _ in figures.PANELS for stat in ("mean", "std")},
        }
        for method in methods
    ]
    figure = figures.risks_versus_rho(rows, math.log(2), "test")
    lines = {
        method: line
        for line in figure.axes[0].get_lines()
        for method in methods
        if line.get_gid() == f"worst_risk:{method}"
    }
    assert len({line.get_color() for line in lines.values()}) == len(methods)
    # Named by method, not by label, so a label that loses its mark fails here rather than turning solid.
    central = {METHOD_LABELS[method] for method in ("bpf", "dro", "central-cvar", "central-erm")}
    assert all((line.get_linestyle() == "--") == (method in central) for method, line in lines.items())


def test_hyperparameters_are_chosen_on_validation_and_each_seed_differs(study: tuple[Path, dict[str, Path]]) -> None:
    out, _ = study
    grid = Study("adult", TINY, ("fedsrcvar",))
    runs = grid.selection_runs("fedsrcvar", 0.3)
    assert len(runs) == len(TINY.lr_scales) * len(TINY.server_momenta)
    assert all(run.split == "validation" for run in runs)
    results = run_all(runs, out / "cache", workers=1, label="cached")  # all cached: nothing trains
    best = min(results.values(), key=lambda result: result["worst_risk"])
    point = selection.chosen(grid, "fedsrcvar", 0.3, results)
    assert results[Run((*grid.base("fedsrcvar", 0.3, 0), *point.flags("fedsrcvar", 0.3)), "validation")] == best
    seeds = [results_of(out, run) for run in grid.test_runs("fedsrcvar", 0.3, point)]
    assert seeds[0]["worst_risk"] != seeds[1]["worst_risk"]  # two seeds, two splits and initialisations


def test_a_diverged_run_is_never_chosen() -> None:
    grid = Study("adult", TINY, ("dro",))
    runs = grid.selection_runs("dro", 0.3)
    results = {run: {"rho": 0.3, "worst_risk": risk} for run, risk in zip(runs, [math.nan, 0.9], strict=True)}
    assert selection.chosen(grid, "dro", 0.3, results) == grid.grid("dro", 0.3)[1]


def results_of(out: Path, run: Run) -> dict[str, float]:
    import json

    return json.loads((out / "cache" / f"{run.key}.json").read_text())


def test_an_interrupted_reproduction_resumes_from_its_cache(
    study: tuple[Path, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, written = study
    before = {name: path.read_bytes() for name, path in written.items() if path.suffix == ".csv"}

    def no_training(run: Run) -> dict[str, float]:
        raise AssertionError(f"{run} trained again although it is cached")

    monkeypatch.setattr(runs, "execute", no_training)
    again = reproduce.reproduce("adult", out, TINY, workers=1)
    assert {name: again[name].read_bytes() for name in before} == before


def test_a_point_says_what_it_tunes() -> None:
    point = Point(0.5, 0.05, 3)
    flags = point.flags("fedsrcvar", 0.1)
    assert flags[flags.index("--epsilon") + 1] == "0.05" and flags[flags.index("--local-steps") + 1] == "3"
    # FedSRCVaR's default step under its default momentum 0.9 is a quarter of the curvature step.
    curvature = 0.5 / ((1 - 0.05) / 0.1 + 0.05)
    assert float(flags[flags.index("--lr") + 1]) == pytest.approx(0.5 * 0.25 * curvature, rel=1e-5)
    assert flags[flags.index("--server-momentum") + 1] == "0.9"
    assert point.describe() == "step x0.5, epsilon 0.05, 3 local steps"
    plain = Point(0.5, 0.05, 3, momentum=0.0)
    flags = plain.flags("fedsrcvar", 0.1)
    assert float(flags[flags.index("--lr") + 1]) == pytest.approx(0.5 * curvature, rel=1e-5)
    assert flags[flags.index("--server-momentum") + 1] == "0"
    assert plain.describe() == "step x0.5, epsilon 0.05, 3 local steps, Algorithm 1's server step"


def test_fedsrcvar_tries_each_server_momentum_and_fedavgs_local_steps_others_keep_their_grid() -> None:
    study = Study("adult", TINY, ("fedsrcvar", "fedavg", "central-cvar"))
    fedsrcvar = study.grid("fedsrcvar", 0.1)
    expected = len(TINY.server_momenta) * len(TINY.fedsrcvar_epsilons) * len(TINY.fedavg_local_steps)
    assert len(fedsrcvar) == expected * len(TINY.lr_scales)
    assert {point.momentum for point in fedsrcvar} == set(TINY.server_momenta)
    assert {point.local_steps for point in fedsrcvar} == set(TINY.fedavg_local_steps)
    assert all(point.momentum is None for point in study.grid("fedavg", 0.1) + study.grid("central-cvar", 0.1))
    assert all("--server-momentum" not in run.flags for run in study.selection_runs("central-cvar", 0.1))


def test_adversaries_get_their_own_grid_every_method_the_same_steps_and_only_loss_methods_loss_rows() -> None:
    profile = Profile(**{**TINY.__dict__, "adversary_lrs": (0.1, 10.0)})
    grid = Study("adult", profile, ("bpf", "dro", "afl", "fedsrcvar"), loss_rows=512)
    bpf = grid.selection_runs("bpf", 0.3)
    steps = {run.flags[run.flags.index("--adversary-lr") + 1] for run in bpf}
    assert len(bpf) == len(TINY.lr_scales) * 2 and steps == {"0.1", "10"}
    dro = grid.selection_runs("dro", 0.3)
    assert all("--adversary-lr" not in run.flags for run in dro)
    assert [float(run.flags[run.flags.index("--lr") + 1]) for run in dro] == [scale * 0.5 for scale in TINY.lr_scales]
    assert all("--adversary-lr" not in run.flags for run in grid.selection_runs("fedsrcvar", 0.3))
    # The RCVaR methods start c at Algorithm 1's B = 1; the others have no threshold.
    assert all(run.flags[run.flags.index("--bound") + 1] == "1" for run in grid.selection_runs("fedsrcvar", 0.3))
    assert all("--bound" not in run.flags for run in (*bpf, *dro))
    afl = grid.selection_runs("afl", 0.3)[0].flags
    assert afl[afl.index("--loss-rows") + 1] == "512"
    assert "--loss-rows" not in grid.selection_runs("fedsrcvar", 0.3)[0].flags
    # Every run's flags are ones `fedfair simulate` accepts, and each run's data loads.
    for run in (*bpf, *dro, *grid.selection_runs("afl", 0.3), *grid.selection_runs("fedsrcvar", 0.3)):
        config_from_flags(run.flags)
    assert federation_for(grid.selection_runs("afl", 0.3)[0].flags, "validation").train
    assert Point(1.0, adversary_lr=10.0).describe() == "step x1, adversary step 10"
    # BPF's ratios reach 1 / rho: its step is CVaR's (0.5 rho at epsilon 0), not ERM's 0.5.
    assert float(bpf[0].flags[bpf[0].flags.index("--lr") + 1]) == pytest.approx(TINY.lr_scales[0] * 0.5 * 0.3)


def test_the_command_refuses_what_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["reproduce", "--dataset", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown dataset 'nope'" in capsys.readouterr().err
    assert cli_main(["reproduce", "--out", str(tmp_path), "--workers", "0"]) == 2
    assert "--workers must be at least 1" in capsys.readouterr().err
    assert cli_main(["reproduce", "--out", str(tmp_path), "--loss-rows", "-1"]) == 2
    assert "--loss-rows must be 0 (every row) or a positive row count" in capsys.readouterr().err


def test_the_composition_table_describes_fedsrcvars_worst_group_by_race_and_label(
    study: tuple[Path, dict[str, Path]],
) -> None:
    _, written = study
    rows = read_csv(written["composition"])
    assert {float(row["rho"]) for row in rows} == {0.1, 0.3}
    for rho in ("0.1", "0.3"):
        at = [row for row in rows if row["rho"] == rho]
        assert sum(float(row["worst_share_mean"]) for row in at) == pytest.approx(1.0)
        assert sum(float(row["overall_share"]) for row in at) == pytest.approx(1.0)
    # Everyone's shares are Adult's test rows counted by hand, race by label.
    adult = load_dataset("adult")
    for row in rows:
        label = adult.class_names.index(row["label"])
        count = np.sum((adult.attributes_test["race"] == row["race"]) & (adult.y_test == label))
        assert float(row["overall_share"]) == pytest.approx(count / len(adult.y_test))
    bars = {patch.get_gid() for patch in figures.composition(rows, "race", "test").axes[0].patches}
    assert bars == {"worst_share:0.1", "worst_share:0.3", "overall_share"}


def test_a_method_without_rho_trains_once_for_every_rho() -> None:
    profile = Profile(**{**TINY.__dict__, "rhos": (0.3, 0.5)})
    grid = Study("adult", profile, ("fedavg", "fedsrcvar"))
    assert grid.rhos == (0.1, 0.3, 0.5)
    assert grid.selection_runs("fedavg", 0.3) == grid.selection_runs("fedavg", 0.5)
    assert all(run.rhos == (0.3, 0.5) for run in grid.selection_runs("fedavg", 0.1))
    assert grid.selection_runs("fedsrcvar", 0.3) != grid.selection_runs("fedsrcvar", 0.5)
    assert all(run.rhos == () for run in grid.selection_runs("fedsrcvar", 0.3))


def test_a_run_judged_at_another_rho_is_the_run_trained_at_it() -> None:
    """FedAvg's training does not depend on rho, so judging its model at rho 0.3 must give exactly
    what a run with --rho 0.3 reports; a rho it was not judged at is refused."""
    flags = ("--dataset", "adult", "--method", "fedavg", "--rounds", "3", "--lr", "0.5")
    trained_at_01 = runs.execute(Run((*flags, "--rho", "0.1"), "test", (0.3,)))
    trained_at_03 = runs.execute(Run((*flags, "--rho", "0.3"), "test"))
    assert runs.judged_at(trained_at_01, 0.3) == {key: trained_at_03[key] for key in runs.judged_at(trained_at_01, 0.3)}
    assert runs.judged_at(trained_at_01, 0.1)["worst_risk"] > trained_at_03["worst_risk"]
    with pytest.raises(ConfigError, match="judged at rho 0.3 only, not 0.5"):
        runs.judged_at(trained_at_03, 0.5)
    with pytest.raises(ConfigError, match="ask it of test runs"):
        runs.execute(Run((*flags, "--rho", "0.1"), "validation", (), ("race",)))


def test_the_paper_study_refuses_the_drift_studys_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["reproduce", "--out", str(tmp_path), "--alpha", "0.1"]) == 2
    assert "--alpha sets the drift study's Dirichlet split" in capsys.readouterr().err
    assert cli_main(["reproduce", "--out", str(tmp_path), "--study", "drift", "--model", "mlp"]) == 2
    assert "--model sets the paper study's model" in capsys.readouterr().err


def test_a_diverging_run_is_kept_as_nan_and_never_chosen() -> None:
    """A grid point whose model diverges is a run with NaN risks at every rho, not a failed study."""
    flags = ("--dataset", "adult", "--method", "afl", "--rounds", "5", "--lr", "1e38", "--rho", "0.1")
    result = runs.execute(Run(flags, "validation", (0.3,)))
    assert "diverged" in result and "lower --lr" in result["diverged"]
    assert math.isnan(runs.judged_at(result, 0.1)["worst_risk"]) and math.isnan(
        runs.judged_at(result, 0.3)["mean_risk"]
    )


def forbid_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any run that would train fail the test: what follows must come from the cache."""

    def no_training(run: Run) -> dict[str, float]:
        raise AssertionError(f"{run} trained again although it is cached")

    monkeypatch.setattr(runs, "execute", no_training)


def test_a_narrowed_study_is_the_same_runs_and_rows_for_the_methods_asked(
    study: tuple[Path, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--methods keeps the other methods out of the tables and trains nothing the full study has cached."""
    out, written = study
    import shutil

    shutil.copytree(out / "cache", out / "narrowed" / "cache")
    forbid_training(monkeypatch)
    narrowed = reproduce.reproduce("adult", out / "narrowed", TINY, workers=1, methods=("fedsrcvar", "fedavg"))
    full_rows = read_csv(written["rho"])
    rows = read_csv(narrowed["rho"])
    wanted = {METHOD_LABELS["fedsrcvar"], METHOD_LABELS["fedavg"]}
    assert {row["method"] for row in rows} == wanted
    assert rows == [row for row in full_rows if row["method"] in wanted]
    assert {row["method"] for row in read_csv(narrowed["table"])} == wanted


def test_the_command_refuses_methods_and_rhos_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["reproduce", "--out", str(tmp_path), "--methods", "fedavg,nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err
    assert cli_main(["reproduce", "--out", str(tmp_path), "--methods", "fedavg"]) == 2
    assert "must include fedsrcvar" in capsys.readouterr().err
    for bad in ("0", "0.1,x", "1.5"):
        assert cli_main(["reproduce", "--out", str(tmp_path), "--rhos", bad]) == 2
        assert "--rhos" in capsys.readouterr().err


@pytest.mark.parametrize("profile", ["quick", "figure1"])
def test_the_fairness_baselines_are_tuned_over_as_many_points_as_fedsrcvar(profile: str) -> None:
    chosen_profile = PROFILES[profile]
    study = Study("mnist", chosen_profile, ("fedsrcvar", "fedavgm", "propfair", "term", "deltafl"))
    size = len(study.grid("fedsrcvar", TABLE_RHO))
    assert size == 24
    for method, (flag, values) in (
        *OWN_GRIDS.items(),
        ("fedavgm", ("--server-momentum", FEDAVGM_MOMENTA)),
    ):
        runs = study.selection_runs(method, TABLE_RHO)
        assert len(runs) == size, method
        assert {run.flags[run.flags.index(flag) + 1] for run in runs} == {f"{value:g}" for value in values}
        for run in runs:  # each at the effective step lr / (1 - momentum) its scale asks for, as FedSRCVaR's
            config = config_from_flags(run.flags)
            momentum = config.training.server_momentum
            scale = float(run.flags[run.flags.index("--lr") + 1]) / (0.5 * min(1.0, 2.5 * (1.0 - momentum)))
            assert scale == pytest.approx(min(chosen_profile.lr_scales, key=lambda s: abs(s - scale)), rel=1e-5)
    term = Point(0.25, local_steps=3, momentum=0.0, setting=5.0)
    assert term.describe("term") == "step x0.25, 3 local steps, tilt 5, plain server step"


FIGURES = Path(__file__).resolve().parents[2] / "docs" / "figures"
"""The committed figures and their tables."""
REGENERATED = FIGURES / "baselines_rand_hie" / "fig2_rho.csv"
REGENERATION_TOLERANCE = 1e-4
"""Absolute, on a held-out worst-decile risk near 0.7: the seeds' own spread in the table is 6e-6 to 5e-4, so
this admits another CPU's summation order (relative 1e-6 over 30 rounds: test_pinned_run) and nothing a code
change could do to a method's result; the nearest two methods in the table are 2.9e-3 apart."""


@pytest.mark.parametrize(
    ("method", "point"),
    [
        ("fedsrcvar", Point(0.05, 0.01, momentum=0.0)),
        ("term", Point(0.05, momentum=0.0, setting=5.0)),
    ],
)
def test_the_committed_rand_hie_baselines_table_regenerates(tmp_path: Path, method: str, point: Point) -> None:
    # The test runs of two rows of docs/figures/baselines_rand_hie/ (FedSRCVaR and the nearest baseline, at
    # the points chosen on validation rows), re-run on today's tree: 2 seeds of 200 rounds of logistic
    # regression, a few seconds each. As `--rhos 0.1` builds them, with the paper's logreg.
    assert_regenerates(
        tmp_path, REGENERATED, "rand-hie", method, point, (TABLE_RHO,), TABLE_RHO, REGENERATION_TOLERANCE
    )


def assert_regenerates(
    tmp_path: Path,
    table: Path,
    dataset: str,
    method: str,
    point: Point,
    study_rhos: tuple[float, ...],
    rho: float,
    tolerance: float,
    loss_rows: int = 0,
) -> None:
    """`method`'s row at `rho` of a committed `table` comes back within `tolerance` from its test runs re-run here.

    The runs are built as `fedfair reproduce --profile figure1` builds them for `dataset` in its paper split, its
    paper model, at `study_rhos` (which a method without rho is judged at, and which enters its runs' keys), with
    the study's `--loss-rows`.
    """
    rows = {row["method"]: row for row in read_csv(table) if float(row["rho"]) == rho}
    committed = rows[METHOD_LABELS[method]]
    assert committed["chosen"] == point.describe(method), "the table chose another point; update this test's"
    split = reproduce.paper_split(dataset)
    model = split.model or PROFILES["figure1"].model
    profile = Profile(**{**PROFILES["figure1"].__dict__, "model": model, "rhos": study_rhos})
    study = Study(dataset, profile, (method,), loss_rows=loss_rows, split=split)
    runs = study.test_runs(method, rho, point)
    results = run_all(runs, tmp_path, 1, "regenerating")
    summary = reproduce.summary([results[run] for run in runs], rho)
    for metric in ("worst_risk_mean", "mean_risk_mean"):
        assert summary[metric] == pytest.approx(float(committed[metric]), abs=tolerance), metric


MNIST_REGENERATED = FIGURES / "baselines_mnist" / "fig2_rho.csv"
MNIST_REGENERATION_TOLERANCE = 2e-3
"""Absolute, on a held-out worst-decile risk near 0.73: 200 rounds of an MLP amplify another CPU's summation order
more than a convex model's, so a quarter of the seeds' own spread (0.007) and a twelfth of the gap between
FedSRCVaR and the nearest baseline (0.024), which is what the page's claim rests on."""

MNIST_ALL_RHO = FIGURES / "baselines_mnist_all_rho" / "fig2_rho.csv"
MNIST_HIGH_RHO_TOLERANCE = 3e-4
"""Absolute, on a held-out worst-30%-risk near 0.113 at rho = 0.7: MNIST_REGENERATION_TOLERANCE scaled to the smaller
risk (2e-3 x 0.113 / 0.73), a sixth of the seeds' own spread (0.002). The page reads FedSRCVaR and FedAvgM as tied
there (2e-4 apart); the test holds each to its committed figure, not the order between them."""

ONE_RHO = (TABLE_RHO,)
FOUR_RHO = PROFILES["figure1"].rhos


@pytest.mark.parametrize(
    ("one_rho", "four_rho", "tolerance", "term_tolerance"),
    [
        ("baselines_mnist", "baselines_mnist_all_rho", 0.0, None),
        ("baselines_adult", "baselines_adult_all_rho", 1e-7, 0.01),
        ("baselines_census", "baselines_census_all_rho", 0.0, None),
    ],
)
def test_a_four_rho_study_repeats_its_one_rho_table_at_rho_0_1(
    one_rho: str, four_rho: str, tolerance: float, term_tolerance: float | None
) -> None:
    # The two studies share no baseline run (a method without rho is judged at every rho of its study, which
    # enters its key), so this column was trained again on another commit. MNIST's and Census-Income's agree
    # bit for bit. Adult's was trained across float32 memory changes that move the last bits: within 1e-7, and
    # TERM, whose tilt amplifies them, within half its seeds' spread (0.019) of its one-rho figure.
    before = {row["method"]: row for row in read_csv(FIGURES / one_rho / "fig2_rho.csv")}
    after = {
        row["method"]: row for row in read_csv(FIGURES / four_rho / "fig2_rho.csv") if float(row["rho"]) == TABLE_RHO
    }
    assert set(after) == set(before)
    for method, row in before.items():
        assert after[method]["chosen"] == row["chosen"], method
        # Every figure of the row; where TERM is held looser, its spread and disparity move with its seeds, so
        # only its two risks.
        term = method == METHOD_LABELS["term"] and term_tolerance is not None
        metrics = (
            ("worst_risk_mean", "mean_risk_mean") if term else [key for key in row if key not in ("method", "chosen")]
        )
        for metric in metrics:
            bound = term_tolerance if term else tolerance
            assert float(after[method][metric]) == pytest.approx(float(row[metric]), abs=bound), (method, metric)


@pytest.mark.study  # about 70 CPU-seconds each: `make test-studies` (the RAND HIE rows above are the suite's)
@pytest.mark.parametrize(
    ("table", "study_rhos", "rho", "method", "point", "tolerance"),
    [
        (
            MNIST_REGENERATED,
            ONE_RHO,
            TABLE_RHO,
            "fedsrcvar",
            Point(1.0, 0.01, 3, momentum=0.9),
            MNIST_REGENERATION_TOLERANCE,
        ),
        (
            MNIST_REGENERATED,
            ONE_RHO,
            TABLE_RHO,
            "fedavgm",
            Point(1.0, local_steps=3, momentum=0.9),
            MNIST_REGENERATION_TOLERANCE,
        ),
        (MNIST_ALL_RHO, FOUR_RHO, 0.7, "fedsrcvar", Point(1.0, 0.05, 3, momentum=0.9), MNIST_HIGH_RHO_TOLERANCE),
        (MNIST_ALL_RHO, FOUR_RHO, 0.7, "fedavgm", Point(1.0, local_steps=3, momentum=0.9), MNIST_HIGH_RHO_TOLERANCE),
    ],
)
def test_the_committed_mnist_baselines_tables_regenerate(
    tmp_path: Path, table: Path, study_rhos: tuple[float, ...], rho: float, method: str, point: Point, tolerance: float
) -> None:
    # FedSRCVaR's and the nearest baseline's rows, at the points chosen on validation rows, re-run on today's tree
    # (2 seeds of 200 rounds of the MLP, about 30 s each): the one-rho table's, and the four-rho study's at rho = 0.7,
    # where FedAvgM is 2e-4 below FedSRCVaR (FedAvgM trained once there and judged at every rho).
    assert_regenerates(tmp_path, table, "mnist", method, point, study_rhos, rho, tolerance)


CENSUS_ALL_RHO = FIGURES / "baselines_census_all_rho" / "fig2_rho.csv"
CENSUS_HIGH_RHO_TOLERANCE = 7e-4
"""Absolute, on a held-out worst-half risk near 0.25 at rho = 0.5: a third of the gap by which FedAvgM is below
FedSRCVaR there (0.0022), so two rows each within it keep their order, and MNIST_REGENERATION_TOLERANCE scaled
to the smaller risk (2e-3 x 0.25 / 0.73); the seeds' own spread is 1e-4 to 3e-4."""


@pytest.mark.study  # about 30 CPU-seconds each: `make test-studies`
@pytest.mark.parametrize(
    ("method", "point"),
    [
        ("fedsrcvar", Point(1.0, 0.05, 3, momentum=0.9)),
        ("fedavgm", Point(1.0, local_steps=3, momentum=0.7)),
    ],
)
def test_the_census_income_rows_where_fedavgm_is_below_fedsrcvar_regenerate(
    tmp_path: Path, method: str, point: Point
) -> None:
    # The four-rho study on Census-Income by race at rho = 0.5, where the page says FedAvgM ends 0.9% below
    # FedSRCVaR: both rows re-run on today's tree (2 seeds of 200 rounds of the MLP, about 40 s each).
    assert_regenerates(
        tmp_path, CENSUS_ALL_RHO, "census-income", method, point, FOUR_RHO, 0.5, CENSUS_HIGH_RHO_TOLERANCE, 8192
    )


def test_the_fronts_points_are_every_validation_run_read_at_every_rho_with_the_choice() -> None:
    """Made-up validation results (nothing trains): FedAvg's one run per point is read at each rho it serves."""
    profile = Profile(**{**TINY.__dict__, "lr_scales": (1.0, 0.5, 0.25)})
    grid = Study("rand-hie", profile, ("fedsrcvar", "fedavg"))
    results: dict[Run, dict[str, Any]] = {}
    for index, run in enumerate(grid.selection_runs("fedavg", TABLE_RHO)):
        at_03 = {"mean_risk": 0.5 + index, "worst_risk": 0.9 - 0.1 * index}
        results[run] = {"rho": TABLE_RHO, "mean_risk": 0.5, "worst_risk": 1.0 + index, "at_rho": {"0.3": at_03}}
    for rho in grid.rhos:
        for index, run in enumerate(grid.selection_runs("fedsrcvar", rho)):
            results[run] = {"rho": rho, "mean_risk": 0.6 + index, "worst_risk": 0.8 - rho * index}
    selections = {
        (method, rho): selection.Selection(
            tuple(grid.grid(method, rho)),
            tuple(grid.selection_runs(method, rho)),
            selection.chosen(grid, method, rho, results),
        )
        for method in grid.methods
        for rho in grid.rhos
    }
    points = reproduce.judged_points(grid, results, selections)
    assert len(points) == len(grid.rhos) * (6 + 3)
    fedavg = [point for point in points if point.method == METHOD_LABELS["fedavg"] and point.rho == 0.3]
    assert [point.worst_risk for point in fedavg] == [0.9 - 0.1 * index for index in range(3)]
    assert [point.mean_risk for point in fedavg] == [0.5 + index for index in range(3)]
    assert [point.chosen for point in fedavg] == [False, False, True]
    for rho in grid.rhos:
        ours = [point for point in points if point.method == METHOD_LABELS["fedsrcvar"] and point.rho == rho]
        assert [point.point for point in ours] == [point.describe("fedsrcvar") for point in grid.grid("fedsrcvar", rho)]
        assert [point.worst_risk for point in ours] == [0.8 - rho * index for index in range(6)]
        assert [point.chosen for point in ours] == [False] * 5 + [True]


BASELINES = ("fedsrcvar", "fedavg", "fedavgm", "propfair", "term", "deltafl")
RAND_HIE = Profile(
    name="tiny",
    rounds=10,
    seeds=2,
    rhos=(0.3,),
    trade_off_rhos=(),
    epsilons=(),
    taus=(),
    lr_scales=(1.0, 0.25),
    fedsrcvar_epsilons=(0.05,),
    fedavg_local_steps=(1,),
)
"""The federated baselines' study on the smallest dataset, 10 rounds: 42 validation runs of a few hundredths of a second."""
LONG_ROUNDS = 20


@pytest.fixture(scope="module")
def baselines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Path]]:
    out = tmp_path_factory.mktemp("baselines")
    split = reproduce.paper_split("rand-hie")
    return out, reproduce.reproduce(
        "rand-hie", out, RAND_HIE, workers=1, split=split, methods=BASELINES, long_rounds=LONG_ROUNDS
    )


def test_every_methods_front_at_every_rho_is_non_empty_non_dominated_and_drawn(
    baselines: tuple[Path, dict[str, Path]],
) -> None:
    _, written = baselines
    rows = read_csv(written["fronts"])
    study = Study("rand-hie", RAND_HIE, BASELINES)
    figure = figures.fronts(rows, math.log(2), "test")
    lines = {line.get_gid(): line for axis in figure.axes for line in axis.get_lines() if line.get_gid()}
    for rho in study.rhos:
        for method in BASELINES:
            label = METHOD_LABELS[method]
            mine = [row for row in rows if float(row["rho"]) == rho and row["method"] == label]
            assert len(mine) == len(study.grid(method, rho))
            risks = [(float(row["mean_risk"]), float(row["worst_risk"])) for row in mine]
            front = [risk for risk, row in zip(risks, mine, strict=True) if row["on_front"] == "True"]
            assert front, (rho, method)
            for point in front:
                assert not any(other[0] <= point[0] and other[1] <= point[1] and other != point for other in front)
            for risk, row in zip(risks, mine, strict=True):  # every point off the front is dominated
                if row["on_front"] == "False" and row["diverged"] == "False":
                    assert any(other[0] <= risk[0] and other[1] <= risk[1] and other != risk for other in front)
            (taken,) = [risk for risk, row in zip(risks, mine, strict=True) if row["chosen"] == "True"]
            assert taken[1] == min(worst for _, worst in risks if math.isfinite(worst))
            drawn = lines[f"front:{rho:g}:{label}"]
            assert list(drawn.get_xdata()) == sorted(mean for mean, _ in front)
            assert list(lines[f"chosen:{rho:g}:{label}"].get_ydata()) == [taken[1]]


def test_the_convergence_table_traces_each_methods_choice_at_both_lengths_on_every_seed(
    baselines: tuple[Path, dict[str, Path]],
) -> None:
    _, written = baselines
    rows = read_csv(written["convergence"])
    study = Study("rand-hie", RAND_HIE, BASELINES)
    assert len(rows) == len(BASELINES) * len(study.rhos) * 2 * RAND_HIE.seeds
    figure = {(row["method"], float(row["rho"])): row for row in read_csv(written["rho"])}
    chosen = {key: row["chosen"] for key, row in figure.items()}
    for (method, rho), row in figure.items():  # at the profile's rounds a traced run is the figure's test run
        traced = [r for r in rows if (r["method"], float(r["rho"]), int(r["rounds"])) == (method, rho, RAND_HIE.rounds)]
        held_out = np.mean([float(r["held_out_worst_risk"]) for r in traced])
        assert held_out == pytest.approx(float(row["worst_risk_mean"]), rel=1e-12)
    for row in rows:
        rounds = int(row["rounds"])
        assert rounds in (RAND_HIE.rounds, LONG_ROUNDS)
        for settled in (int(row["worst_risk_round"]), int(row["mean_loss_round"])):  # none diverged: every cell set
            assert 0 < settled <= rounds and (settled % 5 == 0 or settled == rounds)
        # CVaR of any losses is at least their mean; the trace reads both off the same output iterate.
        assert float(row["final_worst_risk"]) >= float(row["final_mean_loss"]) > 0.0
        assert float(row["held_out_worst_risk"]) >= float(row["held_out_mean_risk"]) > 0.0
        if float(row["rho"]) in RAND_HIE.rhos:  # the point the figure's test runs took
            assert row["point"] == chosen[(row["method"], float(row["rho"]))]
    ours = [row for row in rows if row["method"] == METHOD_LABELS["fedsrcvar"]]
    assert {(float(row["rho"]), int(row["rounds"]), int(row["seed"])) for row in ours} == {
        (rho, rounds, seed) for rho in study.rhos for rounds in (10, 20) for seed in range(RAND_HIE.seeds)
    }


def test_a_traced_run_is_the_test_run_at_its_rounds_with_a_trace() -> None:
    study = Study("rand-hie", RAND_HIE, BASELINES)
    point = Point(0.25, 0.05, momentum=0.0)
    tested, traced = study.test_runs("fedsrcvar", 0.3, point), study.traced_runs("fedsrcvar", 0.3, point, 10)
    assert [run.flags for run in traced] == [run.flags for run in tested]
    assert all(run.history_every == 5 for run in traced) and {run.key for run in traced}.isdisjoint(
        run.key for run in tested
    )
    longer = study.traced_runs("fedavg", 0.3, point, LONG_ROUNDS)
    assert all(run.flags[run.flags.index("--rounds") + 1] == str(LONG_ROUNDS) for run in longer)
    assert all(run.rhos == (0.3,) for run in longer)  # a method without rho is traced at every rho it serves


def test_the_baselines_study_again_on_its_cache_trains_nothing(
    baselines: tuple[Path, dict[str, Path]], monkeypatch: pytest.MonkeyPatch
) -> None:
    out, written = baselines
    forbid_training(monkeypatch)
    split = reproduce.paper_split("rand-hie")
    again = reproduce.reproduce(
        "rand-hie", out, RAND_HIE, workers=1, split=split, methods=BASELINES, long_rounds=LONG_ROUNDS
    )
    for name in ("fronts", "convergence", "rho"):
        assert again[name].read_bytes() == written[name].read_bytes()


def test_paired_gaps_are_the_tables_gaps_from_the_same_runs_rows(
    baselines: tuple[Path, dict[str, Path]],
) -> None:
    out, written = baselines
    split = reproduce.paper_split("rand-hie")
    again = reproduce.reproduce("rand-hie", out, RAND_HIE, workers=1, split=split, methods=BASELINES, paired=True)
    # Runs that keep their rows' losses train and judge exactly as those that do not.
    assert again["rho"].read_bytes() == written["rho"].read_bytes()
    table = {(row["method"], row["rho"]): float(row["worst_risk_mean"]) for row in reproduce.read_csv(again["rho"])}
    rows = reproduce.read_csv(again["paired"])
    assert {row["method"] for row in rows} == {reproduce.METHOD_LABELS[m] for m in BASELINES[1:]}
    for row in rows:
        gap = table[(row["method"], row["rho"])] - table[("FedSRCVaR", row["rho"])]
        # The rows' losses are kept in float32: relative 2^-24 on each risk.
        assert float(row["gap_to_fedsrcvar"]) == pytest.approx(gap, abs=1e-6)
        assert 0.0 <= float(row["gap_standard_error"]) < 1.0


def test_the_command_refuses_a_convergence_it_cannot_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["reproduce", "--out", str(tmp_path), "--long-rounds", "100"]) == 2
    assert "add --convergence" in capsys.readouterr().err
    assert cli_main(["reproduce", "--out", str(tmp_path), "--convergence", "--long-rounds", "0"]) == 2
    assert "--long-rounds must be at least 1" in capsys.readouterr().err
    assert cli_main(["reproduce", "--out", str(tmp_path), "--convergence", "--study", "drift"]) == 2
    assert "the drift study has none" in capsys.readouterr().err
    assert cli_main(["reproduce", "--out", str(tmp_path), "--paired", "--study", "drift"]) == 2
    assert "the drift study has none" in capsys.readouterr().err
