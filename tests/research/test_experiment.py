"""The `fedfair simulate / reference` commands: results, JSON shape, and bad input."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from fedfair.cli import main
from fedfair.core.errors import ConfigError
from fedfair.research import baselines, minimax
from fedfair.research.experiment import ExperimentConfig, Outcome, load_federation, run_method, uniform_risk
from fedfair.research.arguments import DEFAULT_BASELINE_LR
from fedfair.research.flags import config_from_flags, parse_flags
from fedfair.research.task import Task
from fedfair.simulation.federation import Federation
from fedfair.simulation.rounds import SimulationResult, run_fedsrcvar


@pytest.mark.slow
def test_simulate_and_reference_agree_within_one_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's acceptance command pair, with fewer rounds to keep the suite fast."""
    flags = ["--dataset", "adult", "--partition", "race", "--clients", "3", "--model", "logreg", "--epsilon", "0.1"]
    flags += ["--rho", "0.3"]
    assert main(["simulate", *flags, "--rounds", "300", "--json", str(tmp_path / "sim.json")]) == 0
    assert main(["reference", *flags, "--json", str(tmp_path / "ref.json")]) == 0
    simulated = json.loads((tmp_path / "sim.json").read_text())
    optimum = json.loads((tmp_path / "ref.json").read_text())
    for result in (simulated, optimum):
        assert set(result) >= {"config", "final", "history"}
        assert set(result["final"]) >= {"train_objective", "train_objective_smooth", "c", "test"}
        assert set(result["final"]["test"]) >= {
            "mean_risk",
            "worst_risk",
            "best_risk",
            "disparity",
            "accuracy",
            "worst_error",
        }
    gap = simulated["final"]["train_objective_smooth"] / optimum["final"]["train_objective_smooth"] - 1.0
    assert 0.0 <= gap <= 0.01
    assert len(simulated["history"]) == 20
    assert simulated["final"]["uniform_risk"] == optimum["final"]["uniform_risk"] == pytest.approx(math.log(2.0))
    out = capsys.readouterr().out
    assert "worst_risk" in out and "uniform_risk" in out


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--rho", "0"], "rho must be in (0, 1]"),
        (["--rho", "1.2"], "rho must be in (0, 1]"),
        (["--epsilon", "-0.5"], "epsilon must be in [0, 1]"),
        (["--epsilon", "2"], "epsilon must be in [0, 1]"),
        (["--gamma", "0"], "gamma must be a positive number"),
        (["--bound", "-1"], "bound must be a positive number"),
        (["--dataset", "nosuch"], "unknown dataset 'nosuch'"),
        (["--partition", "planet"], "planet"),
    ],
)
def test_bad_flags_give_one_line_error_and_exit_2(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--rounds", "1", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("fedfair: error: ") and fragment in error
    assert "\n" not in error


def test_csv_without_label_column_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = tmp_path / "records.csv"
    table.write_text("age,site,outcome\n30,a,1\n40,b,0\n50,a,1\n60,b,0\n")
    assert main(["simulate", "--rounds", "1", "--data", str(table), "--label", "target", "--split-by", "site"]) == 2
    error = capsys.readouterr().err
    assert "target" in error and "outcome" in error


def test_user_csv_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An institution's own table: real Adult rows written as CSV, split by a site-like column."""
    from fedfair.datasets import load_dataset

    adult = load_dataset("adult")
    table = tmp_path / "records.csv"
    lines = ["age_std,hours_std,group,label"]
    for row, label, race in zip(adult.x_train[:400], adult.y_train[:400], adult.attributes_train["race"][:400]):
        lines.append(f"{row[0]},{row[1]},{'white' if race == 'White' else 'other'},{label}")
    table.write_text("\n".join(lines) + "\n")
    flags = ["--data", str(table), "--label", "label", "--split-by", "group", "--clients", "2", "--rounds", "30"]
    assert main(["simulate", *flags, "--batch-size", "32"]) == 0
    assert "white" in capsys.readouterr().out


def test_piped_simulate_prints_progress_lines_with_an_eta_and_the_epsilon_spent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """stderr is not a terminal under capsys: whole lines, no bar; DP on: epsilon once per collaborator."""
    flags = ["--rounds", "10", "--clients", "2", "--dp-noise-multiplier", "1.0", "--dp-accountant", "rdp"]
    assert main(["simulate", *flags]) == 0
    captured = capsys.readouterr()
    assert "\r" not in captured.err
    progress = [line for line in captured.err.splitlines() if line.startswith("fedsrcvar: ")]
    assert len(progress) == 10
    assert "ETA 00:" in progress[0] and "done in" in progress[-1]
    spent = [line for line in captured.out.splitlines() if "private rounds" in line]
    assert len(spent) == 2
    assert all(re.search(r"epsilon \d+\.\d{3} at delta 1e-05 after 10 private rounds", line) for line in spent)


def test_reference_does_not_offer_federated_training_flags(capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--rounds", "5"], ["--dp-noise-multiplier", "1"], ["--secure-aggregation"], ["--lr", "0.1"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["reference", *flags])
        assert exit_info.value.code == 2
        assert f"unrecognized arguments: {' '.join(flags)}" in capsys.readouterr().err


def test_features_pick_the_columns_of_a_users_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A record-id column cannot be one-hot encoded; the error suggests --features, which then works."""
    table = tmp_path / "records.csv"
    lines = ["record,age,site,outcome"]
    lines += [f"r{row},{20 + row % 50},{'ab'[row % 2]},{(row // 2) % 2}" for row in range(120)]
    table.write_text("\n".join(lines) + "\n")
    flags = ["--rounds", "2", "--data", str(table), "--label", "outcome", "--split-by", "site", "--clients", "2"]
    flags += ["--batch-size", "16"]
    assert main(["simulate", *flags]) == 2
    assert "passing --features without it" in capsys.readouterr().err
    assert main(["simulate", *flags, "--features", "age,site", "--json", str(tmp_path / "run.json")]) == 0
    assert json.loads((tmp_path / "run.json").read_text())["config"]["features"] == ["age", "site"]


def test_features_need_a_users_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--rounds", "1", "--features", "age"]) == 2
    assert (
        "--features picks columns of your own table; pass it with --data FILE --label COLUMN" in capsys.readouterr().err
    )


# The uniform classifier's line and the baselines' flags


def test_uniform_risk_is_ln_k() -> None:
    assert uniform_risk(2) == pytest.approx(math.log(2.0))
    assert uniform_risk(10) == pytest.approx(math.log(10.0))
    with pytest.raises(ConfigError):
        uniform_risk(0)


@pytest.mark.parametrize(
    ("flags", "read", "expected"),
    [
        (["--method", "fedavg", "--local-epochs", "8"], lambda config: config.settings.local_epochs, 8),
        (["--method", "afl", "--mixture-lr", "0.2"], lambda config: config.settings.mixture_lr, 0.2),
        (["--method", "qfedavg", "--q", "2.5"], lambda config: config.settings.q, 2.5),
        (["--threshold-lr", "0.02"], lambda config: config.training.local.threshold_lr, 0.02),
        (["--method", "afl", "--baseline-lr", "0.7"], lambda config: config.training.local.lr, 0.7),
        (["--method", "afl", "--baseline-lr", "0.7", "--lr", "0.2"], lambda config: config.training.local.lr, 0.2),
        (["--method", "fedavg", "--rho", "0.1"], lambda config: config.training.local.lr, DEFAULT_BASELINE_LR),
        (["--method", "bpf", "--adversary-lr", "0.3"], lambda config: config.settings.adversary_lr, 0.3),
        # BPF's epsilon is its ratios' floor: by default 0, whatever RCVaR's default trade-off is.
        (["--method", "bpf", "--rho", "0.1"], lambda config: config.objective.epsilon, 0.0),
        (["--method", "fedsrcvar", "--rho", "0.1"], lambda config: config.objective.epsilon, 0.1),
        (["--method", "afl", "--loss-rows", "64"], lambda config: config.settings.loss_rows, 64),
        (["--method", "fedminmax", "--groups", "sex"], lambda config: config.settings.groups, "sex"),
        (["--method", "dro", "--rho", "0.2"], lambda config: config.training.local.lr, 0.5 * 0.2 / math.sqrt(17.0)),
    ],
)
def test_baseline_flags_reach_the_config(
    flags: list[str], read: Callable[[ExperimentConfig], object], expected: object
) -> None:
    assert read(config_from_flags(flags)) == pytest.approx(expected)


def test_baseline_flags_have_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_flags(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for fragment in (
        "--baseline-lr BASELINE_LR step size for theta of fedavg, fedavgm, afl, qfedavg, fedminmax, propfair, "
        "term, deltafl, central-erm",
        "--local-epochs LOCAL_EPOCHS fedavg: E passes over each collaborator's data per round",
        "--mixture-lr MIXTURE_LR afl: step size of the ascent on the collaborators' mixture weights",
        "--q Q qfedavg: fairness exponent q",
        "--adversary-lr ADVERSARY_LR bpf and fedminmax: step size of the ascent",
        "--groups GROUPS fedminmax: the sensitive column",
        "--threshold-lr THRESHOLD_LR step size for the threshold c",
        "--ceiling CEILING propfair: M in -log(M - F_k)",
        "--tilt TILT term: the tilt t > 0",
        "--client-level CLIENT_LEVEL deltafl: the share of client weight in the tail",
        "{fedsrcvar,fedavg,fedavgm,afl,qfedavg,fedminmax,propfair,term,deltafl,central-erm,central-cvar,bpf,dro}",
    ):
        assert fragment in text


SMALL = ["--rounds", "5", "--batch-size", "64", "--dtype", "float64", "--average-from", "0"]

Direct = Callable[[Federation, ExperimentConfig], SimulationResult]


def task_of(federation: Federation, config: ExperimentConfig) -> Task:
    """The Task a method's run takes for `config` on `federation` (what run_method builds)."""
    return Task(federation, config.objective, config.training, config.privacy, options=config.simulation)


@pytest.mark.parametrize(
    ("method", "flag", "value", "direct"),
    [
        (
            "fedavg",
            "--local-epochs",
            "2",
            lambda f, c: baselines.run_fedavg(task_of(f, c), baselines.FedAvgSettings(local_epochs=2)),
        ),
        (
            "afl",
            "--mixture-lr",
            "3",
            lambda f, c: baselines.run_afl(task_of(f, c), baselines.AFLSettings(mixture_lr=3.0)),
        ),
        ("qfedavg", "--q", "3", lambda f, c: baselines.run_qfedavg(task_of(f, c), baselines.QFedAvgSettings(q=3.0))),
        (
            "fedavg",
            "--baseline-lr",
            "0.05",
            lambda f, c: baselines.run_fedavg(task_of(f, c), baselines.FedAvgSettings()),
        ),
        (
            "bpf",
            "--adversary-lr",
            "5",
            lambda f, c: minimax.run_bpf(task_of(f, c), minimax.BPFSettings(adversary_lr=5.0)),
        ),
        (
            "fedsrcvar",
            "--threshold-lr",
            "0.001",
            lambda f, c: run_fedsrcvar(f, c.objective, c.training, options=c.simulation),
        ),
    ],
)
def test_baseline_flags_change_the_run(
    method: str, flag: str, value: str, direct: Direct, small_adult_federation: Federation
) -> None:
    """parse -> config -> run: the flag's run is the method called with that value, and not the default run."""
    federation = small_adult_federation
    config = config_from_flags(["--method", method, *SMALL, flag, value])
    ours = run_method(config, federation)
    expected = direct(federation, config)
    assert float((ours.theta - expected.state.theta_average).abs().max()) <= 1e-12
    default = run_method(config_from_flags(["--method", method, *SMALL]), federation)
    assert _moved_apart(ours, default)


def _moved_apart(first: Outcome, second: Outcome) -> bool:
    """Whether two runs ended at different parameters or thresholds."""
    thresholds = (first.c or 0.0) - (second.c or 0.0)
    return float((first.theta - second.theta).abs().max()) > 1e-6 or abs(thresholds) > 1e-6


def test_fedminmax_runs_on_the_groups_column_and_its_adversary_lr() -> None:
    """--groups picks the sensitive column load_federation attaches; --adversary-lr is mu's step."""
    flags = ["--method", "fedminmax", "--groups", "sex", *SMALL, "--record-every", "1"]
    config = config_from_flags([*flags, "--adversary-lr", "2"])
    federation = load_federation(config)
    assert isinstance(federation, minimax.GroupedFederation)
    assert federation.group_names == ("Female", "Male")
    ours = run_method(config, federation)
    expected = minimax.run_fedminmax(task_of(federation, config), minimax.FedMinMaxSettings(adversary_lr=2.0))
    assert torch.equal(ours.theta, expected.state.theta_average)
    assert ours.history[-1]["mu_0"] == expected.history[-1]["mu_0"]
    default = run_method(config_from_flags(flags), federation)
    assert default.history[-1]["mu_0"] != pytest.approx(ours.history[-1]["mu_0"], abs=1e-6)


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--method", "afl", "--local-epochs", "3"], "--local-epochs sets FedAvg's local passes"),
        (["--method", "fedavg", "--groups", "sex"], "--groups names FedMinMax's sensitive column"),
        (["--method", "fedsrcvar", "--baseline-lr", "0.1"], "set --lr instead"),
        (["--method", "dro", "--rho", "1"], "chi-square DRO needs rho in (0, 1)"),
        (["--method", "bpf", "--epsilon", "0.5", "--rho", "0.3"], "BPF needs 0 <= epsilon <= rho"),
        (["--method", "bpf", "--epsilon", "0.1", "--rho", "0.1"], "pins every ratio at 1"),
        (["--method", "fedavg", "--loss-rows", "64"], "drop it for --method fedavg"),
        (["--method", "afl", "--loss-rows", "-1"], "--loss-rows must be 0"),
        (["--method", "fedminmax", "--groups", "planet"], "pass --groups COLUMN"),
    ],
)
def test_bad_baseline_flags_give_one_line_error_and_exit_2(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--rounds", "1", *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("fedfair: error: ") and fragment in error


@pytest.mark.parametrize(("method", "key"), [("bpf", "adversary_max_ratio"), ("dro", "eta"), ("fedminmax", "mu_1")])
def test_new_methods_run_from_the_command_line(
    method: str, key: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = ["--method", method, "--rounds", "4", "--rho", "0.2", "--epsilon", "0.01", "--record-every", "2"]
    assert main(["simulate", *flags, "--json", str(tmp_path / "run.json")]) == 0
    result = json.loads((tmp_path / "run.json").read_text())
    assert result["config"]["method"] == method
    assert all(key in record for record in result["history"])
    assert result["final"]["uniform_risk"] == pytest.approx(math.log(2.0))
    assert f"{method} on adult" in capsys.readouterr().out


def test_project_locally_reaches_the_learners_config_and_is_off_by_default() -> None:
    """Algorithm 1 projects c at the server only; --project-locally adds the per-step projection."""
    assert config_from_flags([]).training.local.project_locally is False
    assert config_from_flags(["--project-locally"]).training.local.project_locally is True


def test_server_adam_lr_replaces_the_momentum_and_its_step_scale() -> None:
    """--server-adam-lr: FedAdam's server step, Algorithm 1's momentum (0) and its plain curvature step by
    default; refused beside a momentum, or for a method without FedSRCVaR's server step."""
    from fedfair.core import server
    from fedfair.research.flags import default_step_size

    config = config_from_flags(["--rho", "0.1", "--epsilon", "0.05", "--server-adam-lr", "0.003"])
    assert config.training.server_adam == server.Adam(lr=0.003)
    assert config.training.server_momentum == 0.0
    assert config.training.local.lr == pytest.approx(default_step_size(0.05, 0.1), rel=1e-15)
    with pytest.raises(ConfigError, match="not both"):
        config_from_flags(["--server-adam-lr", "0.003", "--server-momentum", "0.9"])
    with pytest.raises(ConfigError, match="server-adam-lr"):
        config_from_flags(["--method", "fedavg", "--server-adam-lr", "0.003"])


def test_a_simulation_with_server_adam_takes_fedadams_first_step(small_adult_federation: Federation) -> None:
    """Round 1 from the same start and the same mini-batches: Algorithm 1 moves theta by the mean update
    Delta, FedAdam by lr (1 - b1) Delta / (sqrt(1 - b2) |Delta| + tau), and c by the same plain step."""
    from fedfair.core.server import ServerState

    moves: dict[str, ServerState] = {}
    for name, extra in (("plain", ["--server-momentum", "0"]), ("adam", ["--server-adam-lr", "0.003"])):
        config = config_from_flags(["--method", "fedsrcvar", *SMALL, "--rounds", "2", *extra])
        run_method(config, small_adult_federation, lambda state, name=name: moves.setdefault(name, state))
    plain, adam = moves["plain"], moves["adam"]
    delta = plain.theta - plain.theta_average  # after round 1 the average holds theta^1
    expected = 0.003 * 0.1 * delta / (0.1 * delta.abs() + 1e-3)
    torch.testing.assert_close(adam.theta - adam.theta_average, expected, rtol=1e-9, atol=1e-15)
    assert adam.c == pytest.approx(plain.c, abs=1e-12)


@pytest.fixture
def torch_threads() -> Iterator[int]:
    """Restores torch's thread count, which `fedfair simulate` sets for the whole process."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


@pytest.mark.parametrize(("flags", "threads"), [([], 1), (["--threads", "2"], 2), (["--threads", "0"], None)])
def test_simulate_runs_on_one_torch_thread_unless_told_otherwise(
    torch_threads: int, flags: list[str], threads: int | None
) -> None:
    torch.set_num_threads(3)  # a value neither setting gives, so a left-alone count shows
    assert main(["simulate", "--rounds", "2", "--clients", "2", *flags]) == 0
    assert torch.get_num_threads() == (3 if threads is None else threads)


def test_a_negative_thread_count_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--rounds", "1", "--threads", "-1"])
    assert "--threads takes a whole number >= 0" in capsys.readouterr().err


DISTRIBUTED = ["--secure-aggregation", "--dp-mode", "distributed", "--dp-target-epsilon", "1"]
"""FedSRCVaR under distributed DP at epsilon 1: the noise inside the secure sum."""


def test_distributed_dp_takes_the_collusion_bound_fedfair_init_writes_unless_told() -> None:
    assert config_from_flags(DISTRIBUTED).colluders == 1  # Adult's 3 sites by race
    assert config_from_flags([*DISTRIBUTED, "--clients", "2", "--partition", "iid"]).colluders == 0
    assert config_from_flags([*DISTRIBUTED, "--dp-colluders", "0"]).colluders == 0
    # Every other run keeps no bound: its config (and so its JSON) says nothing of colluders.
    assert config_from_flags(["--secure-aggregation"]).colluders is None
    assert config_from_flags(["--dp-target-epsilon", "1"]).colluders is None


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--method", "fedavg"], "use --method fedsrcvar or propfair or term or deltafl, or --dp-mode local"),
        (["--local-steps", "3"], "pass --local-steps 1"),
        (["--drift-correction", "scaffold"], "drop --drift-correction"),
        (["--dp-colluders", "2"], "a number from 0 to 1, got 2"),
    ],
)
def test_distributed_dp_refuses_what_it_cannot_train_naming_the_fix(
    flags: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--rounds", "1", *DISTRIBUTED, *flags]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("fedfair: error: ") and fragment in error


def test_distributed_dp_without_the_secure_sum_is_refused_before_training(
    small_adult_federation: Federation,
) -> None:
    """Its sites add no noise of their own: summed in the clear, the updates would be released unprotected."""
    config = config_from_flags(["--rounds", "1", "--dp-mode", "distributed", "--dp-target-epsilon", "1"])
    with pytest.raises(ConfigError, match="pass --secure-aggregation"):
        run_method(config, small_adult_federation)


@pytest.mark.slow
def test_a_rand_hie_run_under_distributed_dp_spends_at_most_its_target_and_reports_the_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The baselines study's federation (6 sites, logistic regression), 20 rounds at epsilon 1, delta 1e-5."""
    flags = ["--dataset", "rand-hie", "--partition", "site", "--clients", "6", "--model", "logreg", "--rho", "0.1"]
    flags += ["--rounds", "20", "--server-momentum", "0", "--dp-delta", "1e-5", *DISTRIBUTED]
    assert main(["simulate", *flags, "--json", str(tmp_path / "run.json")]) == 0
    result = json.loads((tmp_path / "run.json").read_text())
    sites = result["privacy"]
    assert len(sites) == 6
    for report in sites.values():
        # Calibrated to the target (mu bisected to 1e-4): all of it spent, none beyond.
        assert 0.99 <= report["epsilon"] <= 1.0 and report["delta"] == 1e-5
        assert (report["rounds"], report["steps"], report["accountant"]) == (20, 20, "rdp")
    noise = result["distributed_noise"]
    assert (noise["parties"], noise["colluders"], noise["rounds"]) == (6, 1, 20)
    assert 0.99 <= noise["epsilon"] <= 1.0
    assert noise["sample_rate"] == pytest.approx(1024 / sum(result["clients"].values()), rel=1e-12)
    # Every site adds mu / (6 - 1): the decoded sum's Skellam variance is 2 mu 6 / 5, in units of 2^-f.
    expected = math.sqrt(2 * noise["mu"] * 6 / 5) * 2.0 ** -noise["fractional_bits"]
    assert noise["noise_std"] == pytest.approx(expected, rel=1e-12) and noise["noise_excess"] == pytest.approx(1.2)
    out = capsys.readouterr().out
    assert "distributed DP (Skellam noise inside the secure sum)" in out
    assert "1 of 6 sites" in out and "epsilon 1.000 at delta 1e-05 after 20 rounds" in out


def test_a_secure_run_without_dp_reports_no_noise_and_sums_as_before(small_adult_federation: Federation) -> None:
    """--secure-aggregation alone: no privacy section, no noise section, the plain run within the sum's bound."""
    flags = ["--rounds", "4", "--batch-size", "64", "--server-momentum", "0", "--dtype", "float64"]
    secure = run_method(config_from_flags([*flags, "--secure-aggregation"]), small_adult_federation)
    plain = run_method(config_from_flags(flags), small_adult_federation)
    assert secure.noise == {} and secure.privacy == {}
    # The default encoding's fixed point (43 fractional bits here) errs by about 1e-13 a round.
    assert float((secure.theta - plain.theta).abs().max()) < 1e-9
