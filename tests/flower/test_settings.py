"""What travels between the strategy and the client app, and the errors a wrong setup gets."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import pytest

pytest.importorskip("flwr")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from flwr.app import Array, ArrayRecord, Context, RecordDict  # noqa: E402

from fedfair.api import federate  # noqa: E402
from fedfair.core.config import LocalConfig, ObjectiveConfig  # noqa: E402
from fedfair.core.errors import ConfigError  # noqa: E402
from fedfair.flower import FedSRCVaRStrategy, FlowerSettings, initial_arrays  # noqa: E402
from fedfair.flower.client import batch_size, partition_of  # noqa: E402
from fedfair.flower.settings import BATCH_FRACTION, BATCH_SIZE, pair_record, read_pair  # noqa: E402


def context(node_config: dict[str, int | float | str]) -> Context:
    return Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})


def test_the_settings_survive_a_config_record() -> None:
    settings = FlowerSettings(
        ObjectiveConfig(epsilon=0.3, rho=0.15, gamma=0.02, smooth="quadratic", bound=4.0),
        LocalConfig(local_steps=5, lr=0.05, threshold_lr=0.7),
        seed=11,
        dtype="float64",
    )
    assert FlowerSettings.from_config(settings.to_config()) == settings


def test_a_message_without_the_settings_names_the_strategy_to_run() -> None:
    config = FlowerSettings().to_config()
    del config["fedfair.rho"]
    with pytest.raises(ConfigError, match="fedfair.rho.*FedSRCVaRStrategy"):
        FlowerSettings.from_config(config)


def test_local_options_the_client_app_does_not_run_are_refused() -> None:
    with pytest.raises(ConfigError, match="drift correction"):
        FlowerSettings(local=LocalConfig(drift_correction="scaffold"))


def test_the_pair_travels_exactly() -> None:
    theta = torch.randn(1000, dtype=torch.float64)
    back, c = read_pair(pair_record(theta, 3.25))
    assert torch.equal(back, theta) and c == 3.25


def test_a_model_state_dict_is_not_taken_for_the_pair() -> None:
    record = ArrayRecord(array_dict={"weight": Array(np.zeros(3))})
    with pytest.raises(ConfigError, match="initial_arrays"):
        read_pair(record)


def test_a_supernode_without_a_partition_id_is_told_how_to_start() -> None:
    assert partition_of(context({"partition-id": 2, "num-partitions": 3})) == 2
    with pytest.raises(ConfigError, match="--node-config 'partition-id=K"):
        partition_of(context({}))
    with pytest.raises(ConfigError, match="not a whole number"):
        partition_of(context({"partition-id": "first"}))


def test_a_site_takes_its_share_or_its_fraction() -> None:
    assert batch_size({BATCH_SIZE: 300}, 5000) == 300
    assert batch_size({BATCH_FRACTION: 0.01}, 5000) == 50
    with pytest.raises(ConfigError, match="no batch size"):
        batch_size({}, 5000)


def test_the_strategy_checks_its_settings_as_federate_does() -> None:
    with pytest.raises(ConfigError, match="rho"):
        FedSRCVaRStrategy(rho=0.0, epsilon=0.1)
    with pytest.raises(ConfigError, match="batch fraction"):
        FedSRCVaRStrategy(rho=0.2, epsilon=0.1, batch_fraction=1.5)
    with pytest.raises(RuntimeError, match="start"):
        FedSRCVaRStrategy(rho=0.2, epsilon=0.1).output()


def defaults(function: Callable[..., object]) -> dict[str, object]:
    return {
        name: parameter.default
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }


FEDERATE_ONLY = {"rounds", "loss", "device", "record_every"}
"""federate's settings the strategy does not take: Flower's `start` takes the rounds, `client_app` the loss and
the device, and a Flower server records no training objective (it holds no rows)."""


def test_the_strategy_has_every_federate_setting_and_its_default() -> None:
    federate_defaults = defaults(federate)
    strategy_defaults = defaults(FedSRCVaRStrategy.__init__)
    shared = set(inspect.signature(federate).parameters) - FEDERATE_ONLY - {"model_factory", "clients"}
    assert shared <= set(inspect.signature(FedSRCVaRStrategy.__init__).parameters)
    for name in shared & set(federate_defaults):
        assert strategy_defaults[name] == federate_defaults[name], name
    for name in set(defaults(initial_arrays)):
        assert defaults(initial_arrays)[name] == federate_defaults[name], name
    assert defaults(FlowerSettings)["dtype"] == federate_defaults["dtype"]
    # And as the defaults build them: the settings every site trains with are federate's objective and steps.
    strategy = FedSRCVaRStrategy(rho=0.2, epsilon=0.1)
    assert strategy.settings == FlowerSettings(ObjectiveConfig(epsilon=0.1, rho=0.2), LocalConfig())
    assert strategy.batch_size == federate_defaults["batch_size"]
    assert strategy.average_from == federate_defaults["average_from"]
