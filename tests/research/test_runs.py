"""A run's cache key and its opt-in training trace: the key moves only with what is asked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedfair.core.errors import ConfigError
from fedfair.core.evaluation import evaluate
from fedfair.core.objective import cvar
from fedfair.research import runs
from fedfair.research.experiment import evaluation_model, run_method
from fedfair.research.flags import config_from_flags
from fedfair.research.runs import Run, federation_for
from fedfair.simulation.federation import history_sample

FLAGS = ("--dataset", "rand-hie", "--method", "fedavg", "--rounds", "200")

PINNED_KEYS = {
    Run(FLAGS, "test"): "37dab6ab25a6c0330bc2c10d2ea5e5956e7aa15d608fd1b130b4fffba0ca8e96",
    Run(FLAGS, "validation", (0.3, 0.5)): "5f1a11c1a5c6465fbaf0fbfa792b055d535ac674b6b3858dd11c590e3c050d49",
    Run(FLAGS, "test", (0.3,), ("race",)): "0d8c0dd54bbb77c3c8f49225543c4ce16749acd2f75db2fc17a34bdc83f271ea",
}
"""Keys computed on the tree before runs could keep a trace (a5aa756): every cached study, the Census-Income
one in 51 sites among them, finds its runs under them."""


@pytest.mark.parametrize(("run", "key"), PINNED_KEYS.items())
def test_a_run_that_asks_no_trace_keeps_the_key_it_had(run: Run, key: str) -> None:
    assert run.key == key
    assert Run(run.flags, run.split, run.rhos, run.composition, history_every=0).key == key


def test_a_run_key_changes_only_with_what_is_asked() -> None:
    plain = Run(("--dataset", "adult"), "test")
    assert plain.key == Run(("--dataset", "adult"), "test", (), ()).key
    asked = {
        plain.key,
        Run(plain.flags, "test", (0.3,)).key,
        Run(plain.flags, "test", (), ("race",)).key,
        Run(plain.flags, "test", history_every=5).key,
        Run(plain.flags, "test", history_every=10).key,
    }
    assert len(asked) == 5
    with pytest.raises(ConfigError, match="history_every is a number of rounds"):
        Run(plain.flags, "test", history_every=-1)


@pytest.mark.parametrize("method", ["fedavg", "fedsrcvar"])
def test_a_traced_run_reports_what_an_untraced_one_does_and_traces_its_output(method: str) -> None:
    flags = ("--dataset", "rand-hie", "--partition", "site", "--clients", "6", "--method", method)
    flags += ("--rho", "0.1", "--rounds", "12", "--lr", "0.2", "--seed", "1")
    plain = runs.execute(Run(flags, "test", (0.3,)))
    traced = runs.execute(Run(flags, "test", (0.3,), history_every=5))
    trace = traced.pop("history")
    for result in (plain, traced):  # what the run cost differs from run to run
        assert result.pop("cpu_seconds") > 0.0
    assert traced == plain  # the trace is read off the rounds, never changes them
    assert [point["round"] for point in trace] == [5, 10, 12]  # every 5 rounds and the last
    for point in trace:  # CVaR is at least the mean, and shrinks toward it as rho grows
        assert point["worst_risk"]["0.1"] >= point["worst_risk"]["0.3"] >= point["mean_loss"]
    # The last point is the output iterate (theta_average) measured afresh on the pooled training rows.
    config, federation = config_from_flags(flags), federation_for(flags, "test")
    output = run_method(config, federation).theta
    losses = evaluate(evaluation_model(config, federation), output, history_sample(federation)).losses
    assert trace[-1]["mean_loss"] == pytest.approx(float(np.mean(losses)), rel=1e-12)
    assert trace[-1]["worst_risk"] == pytest.approx({"0.1": cvar(losses, 0.1), "0.3": cvar(losses, 0.3)}, rel=1e-12)


def test_a_run_under_distributed_dp_trains_on_the_data_of_the_same_run_without_it() -> None:
    """How a run trains and sums is not its data: DP and secure-sum flags share the plain run's federation, and a
    validation run of a study's flags plus distributed DP runs (the data config once refused them)."""
    flags = ("--dataset", "rand-hie", "--partition", "site", "--clients", "6", "--model", "logreg", "--rounds", "3")
    private = (*flags, "--secure-aggregation", "--dp-mode", "distributed", "--dp-target-epsilon", "1")
    assert federation_for(private, "validation") is federation_for(flags, "validation")
    result = runs.execute(Run(private, "validation"))
    assert "diverged" not in result and np.isfinite(result["worst_risk"])


def test_a_cache_is_stamped_with_its_torch_build_and_refused_under_another(tmp_path: Path) -> None:
    import torch

    run = Run(FLAGS, "test")
    cached = {"flags": list(FLAGS), "split": "test", "worst_risk": 0.5}
    (tmp_path / f"{run.key}.json").write_text(json.dumps(cached))
    assert runs.run_all([run], tmp_path, workers=1, label="cached") == {run: cached}
    assert (tmp_path / runs.BUILD_STAMP).read_text().strip() == torch.__version__
    assert runs.run_all([run], tmp_path, workers=1, label="cached again") == {run: cached}

    (tmp_path / runs.BUILD_STAMP).write_text("2.11.0\n")
    with pytest.raises(ConfigError, match=r"filled under torch 2\.11\.0.*give --out a fresh folder"):
        runs.run_all([run], tmp_path, workers=1, label="another build")
    assert json.loads((tmp_path / f"{run.key}.json").read_text()) == cached  # refused, and nothing lost


def test_a_run_with_checkpoints_judges_at_each_the_output_a_run_stopped_there_gives() -> None:
    # The checkpoints of one 40-round validation run against separate runs of 20 and 40 rounds: a run's output
    # is the mean of its iterates from its own half on, so the longer run's running average at round 20 is not it.
    flags = ("--dataset", "rand-hie", "--partition", "site", "--clients", "6", "--method", "fedsrcvar")
    flags += ("--rho", "0.1", "--lr", "0.2", "--seed", "1", "--server-momentum", "0.9")
    long = runs.execute(Run((*flags, "--rounds", "40"), "validation", (0.3,), validation_every=10))
    assert [point["round"] for point in long["checkpoints"]] == [10, 20, 30, 40]
    for stop in (20, 40):
        short = runs.execute(Run((*flags, "--rounds", str(stop)), "validation", (0.3,)))
        at = next(point for point in long["checkpoints"] if point["round"] == stop)["worst_risk"]
        # Sums in float64 against the server's running mean: equal to rounding.
        assert at["0.1"] == pytest.approx(short["worst_risk"], rel=1e-9)
        assert at["0.3"] == pytest.approx(short["at_rho"]["0.3"]["worst_risk"], rel=1e-9)
    long.pop("checkpoints")
    plain = runs.execute(Run((*flags, "--rounds", "40"), "validation", (0.3,)))
    for result in (plain, long):
        result.pop("cpu_seconds")
    assert long == plain  # checkpoints are read off the rounds, never change them
    with pytest.raises(ConfigError, match="never the test rows"):
        Run(flags, "test", validation_every=10)
    with pytest.raises(ConfigError, match="validation_every is a number of rounds"):
        Run(flags, "validation", validation_every=-1)
