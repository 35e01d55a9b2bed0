"""`fedfair privacy epsilon / plan` and the `--dp-*` flags."""

from __future__ import annotations

import argparse

import pytest

from fedfair.core.errors import ConfigError
from fedfair.privacy.accounting import compute_epsilon, plan_noise_multiplier
from fedfair.cli.privacy import register_commands
from fedfair.privacy.flags import add_privacy_arguments, privacy_config_from_args
from fedfair.privacy.config import PrivacyConfig
from tests.privacy.helpers import DELTA


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """`fedfair ARGV` through the commands this module registers; returns what it printed."""
    parser = argparse.ArgumentParser(prog="fedfair")
    register_commands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.handler(args) == 0
    return capsys.readouterr().out


def test_epsilon_command_prints_opacus_published_rdp_value(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--noise-multiplier", "1.5", "--sample-rate", "0.04", "--steps", "2250", "--delta", "1e-5"]
    assert _run_cli(["privacy", "epsilon", *argv, "--accountant", "rdp"], capsys).split()[0] == "7.329"
    assert compute_epsilon(1.5, 0.04, 2250, DELTA, "prv") == pytest.approx(6.777, abs=0.01)


def test_plan_command_finds_noise_that_spends_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "--target-epsilon",
        "3",
        "--rounds",
        "100",
        "--local-steps",
        "5",
        "--batch-size",
        "64",
        "--dataset-size",
        "3200",
    ]
    noise = float(_run_cli(["privacy", "plan", *argv, "--accountant", "rdp"], capsys).split()[0])
    exact = plan_noise_multiplier(3.0, DELTA, 0.02, 500, "rdp")
    assert noise == pytest.approx(exact, abs=1e-4)
    assert 2.95 <= compute_epsilon(exact, 0.02, 500, DELTA, "rdp") <= 3.0


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "1.5", "--steps", "10"], "sample rate"),
        (["epsilon", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "0"], "steps"),
        (
            ["plan", "--target-epsilon", "3", "--rounds", "10", "--batch-size", "50", "--dataset-size", "20"],
            "batch-size",
        ),
    ],
)
def test_privacy_commands_refuse_bad_input(argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _run_cli(["privacy", *argv], capsys)


def test_flags_map_onto_privacy_config() -> None:
    parser = argparse.ArgumentParser()
    add_privacy_arguments(parser)
    assert privacy_config_from_args(parser.parse_args([])) == PrivacyConfig()
    flags = ["--dp-noise-multiplier", "1.1", "--dp-budget", "8", "--dp-delta", "1e-6"]
    config = privacy_config_from_args(parser.parse_args(flags))
    assert config == PrivacyConfig(enabled=True, noise_multiplier=1.1, budget_epsilon=8.0, delta=1e-6)
    assert privacy_config_from_args(parser.parse_args(["--dp-target-epsilon", "3"])).budget == 3.0
    with pytest.raises(ConfigError, match="--dp-budget needs --dp-noise-multiplier"):
        privacy_config_from_args(parser.parse_args(["--dp-budget", "8"]))


def test_help_states_the_defaults_privacy_config_runs_with(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_privacy_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    defaults = PrivacyConfig()
    assert f"per-sample clip bound C (default {defaults.max_grad_norm:g})" in text
    assert "(default 20)" in text  # what the README's privacy table was measured with
    assert f"(default {defaults.delta:g})" in text and f"(default {defaults.accountant})" in text
    assert f"(default {defaults.mode})" in text


def test_dp_mode_distributed_maps_onto_a_distributed_privacy_config_accounted_in_rdp() -> None:
    parser = argparse.ArgumentParser()
    add_privacy_arguments(parser)
    flags = ["--dp-mode", "distributed", "--dp-target-epsilon", "1", "--dp-delta", "1e-5"]
    config = privacy_config_from_args(parser.parse_args(flags))
    assert config == PrivacyConfig(enabled=True, target_epsilon=1.0, delta=1e-5, accountant="rdp", mode="distributed")
    # The sample rate is the federation's batch fraction, set when the run knows its records.
    assert config.sample_rate is None and config.max_grad_norm == PrivacyConfig().max_grad_norm
    clipped = privacy_config_from_args(parser.parse_args([*flags, "--dp-max-grad-norm", "5", "--dp-accountant", "rdp"]))
    assert clipped.max_grad_norm == 5.0 and clipped.mode == "distributed"
    # Without --dp-mode, a target still means DP-SGD on every collaborator, with its own accountant.
    local = privacy_config_from_args(parser.parse_args(["--dp-target-epsilon", "1"]))
    assert (local.mode, local.accountant) == ("local", PrivacyConfig().accountant)


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--dp-mode", "distributed"], "add --dp-target-epsilon"),
        (["--dp-mode", "distributed", "--dp-noise-multiplier", "1"], "add --dp-target-epsilon"),
        (["--dp-mode", "distributed", "--dp-target-epsilon", "1", "--dp-accountant", "prv"], "drop --dp-accountant"),
        (["--dp-target-epsilon", "1", "--dp-colluders", "1"], "add --dp-mode distributed or drop --dp-colluders"),
        (["--dp-mode", "local"], "--dp-mode needs --dp-noise-multiplier or --dp-target-epsilon"),
    ],
)
def test_distributed_flags_refuse_what_they_cannot_run_naming_the_fix(flags: list[str], fragment: str) -> None:
    parser = argparse.ArgumentParser()
    add_privacy_arguments(parser)
    with pytest.raises(ConfigError, match=fragment):
        privacy_config_from_args(parser.parse_args(flags))
