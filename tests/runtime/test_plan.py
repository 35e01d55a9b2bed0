"""Plans and collaborator configs: the templates load into the core's configs, every check refuses
bad input with the file, section and fix, and what the aggregator shares stays byte for byte the same."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric import ec
from torch import nn

from fedfair.core.config import DEFAULT_SERVER_MOMENTUM, LocalConfig, ObjectiveConfig, TrainingConfig
from fedfair.core.errors import ConfigError
from fedfair.core.models import flat_parameters
from fedfair.fairness import sums
from fedfair.privacy.config import PrivacyConfig
from fedfair.runtime.plan import aggregator_plan as plan
from fedfair.runtime.collaborator import config as collaborator_file
from fedfair.runtime.plan.learning_settings import read_learning
from fedfair.runtime.plan.training import PLAN_TRAINING, training_table
from fedfair.runtime.collaborator.steps import Participant
from fedfair.runtime.transport import TlsFiles
from fedfair.secagg import EncodingConfig

REPOSITORY = Path(__file__).resolve().parents[2]
PLAN_TEMPLATE = REPOSITORY / "aggregator" / "plan.toml"
CONFIG_TEMPLATE = REPOSITORY / "collaborator" / "collaborator.toml"


FACTORY = "tests.runtime.test_plan:two_layer_network"
"""A model factory the plans below name: this module's function, importable wherever the tests run."""


def two_layer_network(features: int, hidden: int) -> nn.Module:
    """A user's own architecture, as an institution would ship it in its package."""
    return nn.Sequential(nn.Linear(features, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def not_a_model() -> str:
    return "a string, not a model"


def template(path: Path) -> dict[str, Any]:
    with path.open("rb") as handle:
        return tomllib.load(handle)


def edited(path: Path, sections: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The template at `path` with some keys replaced (a value of ... deletes the key)."""
    data = copy.deepcopy(template(path))
    for section, values in sections.items():
        table = data.setdefault(section, {})
        for key, value in values.items():
            if value is ...:
                table.pop(key, None)
            else:
                table[key] = value
    return data


NO_NOISE = {"report_epsilon": ..., "interim_report_epsilon": ...}
"""Takes the template's evaluation noise out: noise goes inside the secure sum, so a plan without one has none."""


def aggregator_plan(**sections: dict[str, Any]) -> plan.AggregatorPlan:
    return plan.parse_aggregator_plan(edited(PLAN_TEMPLATE, sections), PLAN_TEMPLATE)


def collaborator_config(**sections: dict[str, Any]) -> collaborator_file.CollaboratorConfig:
    return collaborator_file.parse_collaborator_config(edited(CONFIG_TEMPLATE, sections), CONFIG_TEMPLATE)


def test_the_aggregator_template_loads() -> None:
    loaded = plan.load_aggregator_plan(PLAN_TEMPLATE)
    assert loaded.federation_id == "fedfair-demo"
    assert loaded.collaborators == ("hospital-a", "hospital-b", "hospital-c")
    assert loaded.objective == ObjectiveConfig(epsilon=0.1, rho=0.3, gamma=0.05, smooth="softrelu", bound=10.0)
    assert loaded.training.rounds == 50 and loaded.training.local.local_steps == 5
    assert loaded.training.batch_fraction == 0.01 and loaded.training.average_from == 0.5
    assert loaded.model.features == 107  # the bundled Adult data
    # No threshold: the rule's smallest for each round's p participants (floor(p/2) + 1 without colluders);
    # the quorum is a majority of the plan.
    assert loaded.secure_aggregation.enabled and loaded.secure_aggregation.threshold is None
    assert loaded.quorum.min_collaborators == 2
    assert loaded.aggregator.certs == REPOSITORY / "certs"  # relative to the plan file
    assert loaded.aggregator.output == REPOSITORY / "aggregator" / "output"
    assert loaded.aggregator.report  # the end-of-run page, unless the plan says report = false
    with pytest.raises(AttributeError):
        loaded.training.rounds = 3  # type: ignore[misc]


def test_sections_convert_to_the_core_configs_once() -> None:
    loaded = aggregator_plan(secure_aggregation={"neighbours": 2})
    assert loaded.training.local == LocalConfig(local_steps=5, lr=0.1, threshold_lr=0.1)
    assert loaded.training.average_from_round == 25
    assert loaded.secure_aggregation.encoding() == EncodingConfig(
        clip=10.0, max_weight=1e6, fractional_bits=20, modulus_bits=64
    )
    assert loaded.secure_aggregation.mask_neighbours(51) == 2
    template = plan.load_aggregator_plan(PLAN_TEMPLATE).secure_aggregation
    assert template.neighbours is None  # "auto": complete for a few sites, SecAgg+ for many
    assert template.mask_neighbours(3) is None and template.mask_neighbours(51) == 12
    assert aggregator_plan(secure_aggregation={"neighbours": 0}).secure_aggregation.mask_neighbours(51) is None
    assert aggregator_plan(secure_aggregation={"neighbours": "auto"}).secure_aggregation.neighbours is None


def test_a_plan_without_training_keys_takes_the_plan_defaults_and_writes_them_back_flat() -> None:
    """[training] reads into the core's TrainingConfig: what it leaves out is PLAN_TRAINING's, and the
    shared table is the flat one plans have always had (the pinned digests stay)."""
    read = read_learning("plan.toml", {"training": {}}, 3).training
    assert read == PLAN_TRAINING and isinstance(read, TrainingConfig)
    assert training_table(read) == {
        "rounds": 100,
        "local_steps": 1,
        "batch_fraction": 0.01,
        "lr": 0.1,
        "threshold_lr": 0.1,
        "seed": 0,
        "average_from": 0.5,
        "drift_correction": "none",
        "server_momentum": DEFAULT_SERVER_MOMENTUM,
    }
    assert read_learning("plan.toml", {"training": training_table(read)}, 3).training == read


def test_the_collaborator_template_loads() -> None:
    loaded = collaborator_file.load_collaborator_config(CONFIG_TEMPLATE)
    assert loaded.name == "hospital-a" and loaded.aggregator == "localhost:50051"
    assert loaded.aggregator_name == "aggregator" and loaded.device == "auto"
    assert loaded.certificates == TlsFiles(
        ca=REPOSITORY / "certs" / "ca.crt",
        cert=REPOSITORY / "certs" / "hospital-a.crt",
        key=REPOSITORY / "certs" / "hospital-a.key",
    )
    assert loaded.data == collaborator_file.DataSettings(dataset="adult", partition="race", index=0)
    assert loaded.privacy == PrivacyConfig(noise_multiplier=1.0)  # off, the template's values


def test_certificate_paths_default_to_the_name_in_the_folder() -> None:
    loaded = collaborator_config(certificates={"ca": ..., "cert": ..., "key": ...}, collaborator={"name": "bank-7"})
    assert loaded.certificates.cert == REPOSITORY / "certs" / "bank-7.crt"
    assert loaded.certificates.key == REPOSITORY / "certs" / "bank-7.key"


def test_a_csv_data_source() -> None:
    loaded = collaborator_config(
        data={"dataset": ..., "partition": ..., "index": ..., "csv": "data/x.csv", "label": "y", "features": ["a", "b"]}
    )
    assert loaded.data.csv == REPOSITORY / "collaborator" / "data" / "x.csv"
    assert loaded.data.label == "y" and loaded.data.features == ("a", "b") and loaded.data.dataset is None


def test_privacy_keys_are_accepted_and_checked() -> None:
    loaded = collaborator_config(
        privacy={"enabled": True, "target_epsilon": 3.0, "budget_epsilon": 8, "noise_multiplier": 0}
    )
    assert loaded.privacy.enabled and loaded.privacy.target_epsilon == 3.0 and loaded.privacy.budget_epsilon == 8.0
    assert loaded.privacy.noise_multiplier is None  # a target epsilon calibrates the noise
    assert loaded.privacy.budget == 8.0
    assert collaborator_config(privacy={"enabled": True, "noise_multiplier": ...}).privacy.noise_multiplier == 1.0
    with pytest.raises(ConfigError, match=r"\[privacy\] delta must be a number in \(0, 1\)"):
        collaborator_config(privacy={"delta": 1.5})


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"training": {"roundz": 3}}, r"\[training\] unknown key 'roundz'; did you mean 'rounds'\?"),
        ({"objective": {"epsilom": 0.1}}, r"\[objective\] unknown key 'epsilom'; did you mean 'epsilon'\?"),
        ({"secure_aggregation": {"treshold": 2}}, r"did you mean 'threshold'\?"),
        ({"objective": {"rho": 0}}, r"\[objective\] rho must be a number in \(0, 1\]"),
        ({"objective": {"rho": 1.5}}, r"rho must be a number in \(0, 1\]"),
        ({"objective": {"epsilon": -0.1}}, r"epsilon must be a number in \[0, 1\]"),
        ({"objective": {"gamma": 0}}, r"gamma must be a number in \(0, 1e\+09\]"),
        ({"objective": {"bound": -1}}, r"bound must be a number in \(0, 1e\+09\]"),
        ({"objective": {"rho": "0.3"}}, r"rho must be a number"),
        ({"objective": {"smooth": "softrelo"}}, r'smooth = "softrelo" is not known; did you mean .softrelu.\?'),
        ({"training": {"rounds": 0}}, r"\[training\] rounds must be an integer >= 1 <= 1000000, got 0"),
        ({"training": {"rounds": 2.5}}, r"rounds must be an integer"),
        ({"training": {"rounds": True}}, r"rounds must be an integer"),
        ({"training": {"lr": 0}}, r"lr must be a number in \(0, 1e\+09\]"),
        ({"training": {"batch_fraction": 0}}, r"batch_fraction must be a number in \(0, 1\]"),
        ({"training": {"batch_fraction": 1.5}}, r"batch_fraction must be a number in \(0, 1\]"),
        ({"training": {"batch_size": 64}}, r"\[training\] unknown key 'batch_size'"),
        ({"training": {"average_from": 1}}, r"average_from must be a number in \[0, 1\)"),
        ({"secure_aggregation": {"threshold": 4}}, r"threshold = 4 exceeds the 3 collaborators"),
        ({"secure_aggregation": {"threshold": 1}}, r"threshold must be an integer >= 2"),
        ({"secure_aggregation": {"max_weight": 0.5}}, r"max_weight must be a number in \[1, 1e\+09\]"),
        ({"federation": {"collaborators": ["solo"]}}, r"needs at least 2 collaborators"),
        ({"secure_aggregation": {"enabled": "yes"}}, r"enabled must be true or false"),
        (
            {"secure_aggregation": {"modulus_bits": 8}},
            r"modulus_bits must be 16, 32 or 64 \(the masked words' size in bits\), got 8",
        ),
        ({"secure_aggregation": {"fractional_bits": 64}}, r"fractional_bits = 64 must be below modulus_bits"),
        ({"secure_aggregation": {"clip": 0}}, r"clip must be a number in \(0, 1e\+09\]"),
        ({"secure_aggregation": {"neighbours": 5}}, r'neighbours = 5 must be "auto", 0 \(complete graph\) or in 2..2'),
        ({"quorum": {"min_collaborators": 4}}, r"min_collaborators = 4 exceeds the 3 collaborators"),
        ({"quorum": {"min_collaborators": 1}}, r"below the secure-aggregation threshold 2; raise it"),
        (
            {"secure_aggregation": {"threshold": 3}, "quorum": {"min_collaborators": 2}},
            r"below the secure-aggregation threshold 3",
        ),
        (
            {"quorum": {"round_timeout_seconds": 0}},
            r"round_timeout_seconds must be a number in \(0, 1e\+09\] \(seconds\)",
        ),
        ({"evaluation": {"every": -1}}, r"every must be an integer >= 0"),
        ({"evaluation": {"loss_range": [3.0, 1.0]}}, r"\[evaluation\] loss_range: .*0 <= low < high <= 10000"),
        ({"evaluation": {"loss_range": [-1, 3]}}, r"\[evaluation\] loss_range: .*0 <= low < high"),
        ({"evaluation": {"loss_range": [0, 1, 2]}}, r"loss_range must be a list of two numbers \[low, high\]"),
        ({"evaluation": {"loss_range": ["0", "3"]}}, r"loss_range must be a list of two numbers"),
        ({"evaluation": {"min_bucket_count": 0}}, r"min_bucket_count must be an integer >= 1"),
        ({"secure_aggregation": {"max_colluding": -1}}, r"max_colluding must be an integer >= 0"),
        ({"secure_aggregation": {"max_colluding": 2}}, r"max_colluding = 2: no threshold works for 3 holders"),
        (
            {"secure_aggregation": {"max_colluding": 1}, "quorum": {"min_collaborators": 2}},
            r"min_collaborators = 2 is below max_colluding \+ 2 = 3",
        ),
        (
            {"secure_aggregation": {"max_colluding": 1, "threshold": 2}},
            r"threshold=2 is below max_colluding \+ 2 = 3",
        ),
        (
            {"secure_aggregation": {"threshold": 2}, "federation": {"collaborators": ["a", "b", "c", "d"]}},
            r"with 4 collaborators and max_colluding = 0: threshold=2 lets an aggregator",
        ),
        (
            {"secure_aggregation": {"threshold": 2, "neighbours": 3}, "federation": {"collaborators": list("abcdef")}},
            r"threshold=2 lets an aggregator .* holders \+ max_colluding = 4",
        ),
        ({"aggregator": {"manifest": "missing.toml"}}, r"missing.toml not found"),
        ({"federation": {"id": ...}}, r"\[federation\] missing key 'id'"),
        ({"federation": {"id": "bad id!"}}, r"\[federation\] id must be letters"),
        ({"federation": {"collaborators": []}}, r"collaborators must be a non-empty list of strings"),
        ({"federation": {"collaborators": ["a", "a"]}}, r"lists a name twice"),
        ({"federation": {"collaborators": ["Hospital A"]}}, r"invalid participant name 'Hospital A'"),
        ({"aggregator": {"name": "hospital-a"}}, r"is also a collaborator"),
        ({"aggregator": {"address": "localhost"}}, r"\[aggregator\] address must be host:port"),
        ({"aggregator": {"address": "localhost:70000"}}, r"port in 1..65535"),
        ({"aggregator": {"report": "no"}}, r"\[aggregator\] report"),
        ({"model": {"name": "cnn"}}, r'"cnn" needs image_shape'),
        ({"model": {"name": "cnn", "image_shape": [1, 28, 28]}}, r"holds 784 values but features = 107"),
        ({"model": {"name": "resnet"}}, r'name = "resnet" is not known'),
        ({"model": {"classes": 1}}, r"classes must be an integer >= 2"),
        ({"model": {"factory": FACTORY}}, r'names both name = "logreg" and factory = .*; keep one'),
        ({"model": {"arguments": {"hidden": 8}}}, r"arguments apply to a model factory only"),
        ({"model": {"name": ..., "factory": ""}}, r"factory must be \"package.module:function\""),
        (
            {"model": {"name": ..., "factory": FACTORY, "arguments": {"hidden": float("nan")}}},
            r"arguments must be a table of strings, finite numbers",
        ),
        ({"influence": {"weights": "declared"}}, r'weights = "declared" needs sizes = \{ NAME = ROWS'),
        ({"influence": {"weights": "by_size"}}, r'weights = "by_size" is not known'),
        (
            {"influence": {"sizes": {"hospital-a": 10, "hospital-b": 10}}},
            r"declares 2 institutions but the federation has 3",
        ),
        ({"influence": {"sizes": {"hospital-a": 10, "hospital-b": 10, "hospital-c": 0}}}, r"sizes must be a table of"),
        ({"influence": {"sizes": {"hospital-a": 10, "hospital-b": 10, "Hospital C": 5}}}, r"invalid participant name"),
        (
            {"influence": {"sizes": {"hospital-a": 10, "hospital-b": 10, "hospital-d": 5}}},
            r"sizes must declare exactly the collaborators; missing \['hospital-c'\], not collaborators \['hospital-d'\]",
        ),
        (
            {"influence": {"weights": "declared", "sizes": {"hospital-a": 10**9, "hospital-b": 1, "hospital-c": 1}}},
            r"sizes give a weight of 10000000, above \[secure_aggregation\] max_weight = 1e\+06; raise max_weight",
        ),
        ({"influence": {"update_norm": 0}}, r"update_norm must be a number in \(0, 1e\+09\]"),
        ({"trainig": {}}, r"unknown section \[trainig\]; did you mean 'training'\?"),
        ({"objective": 3}, r"\[objective\] must be a table"),
    ],
)
def test_aggregator_plan_errors(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        if "objective" in sections and not isinstance(sections["objective"], dict):
            data = template(PLAN_TEMPLATE)
            data["objective"] = sections["objective"]
            plan.parse_aggregator_plan(data, PLAN_TEMPLATE)
        else:
            aggregator_plan(**sections)
    text = str(caught.value)
    assert text.startswith(f"{PLAN_TEMPLATE}: ") and "\n" not in text


def test_flags_override_the_plan_and_a_plan_can_come_from_flags_alone() -> None:
    overridden = plan.load_aggregator_plan(PLAN_TEMPLATE, {"training": {"rounds": 7}, "aggregator": {"address": "h:1"}})
    assert overridden.training.rounds == 7 and overridden.aggregator.address == "h:1"
    assert overridden.objective == plan.load_aggregator_plan(PLAN_TEMPLATE).objective
    bare = plan.load_aggregator_plan(None, {"federation": {"id": "f", "collaborators": ["a", "b"]}})
    assert bare.collaborators == ("a", "b") and bare.model.features == 107 and bare.quorum.min_collaborators == 2
    with pytest.raises(ConfigError, match=r"rounds must be an integer >= 1"):
        plan.load_aggregator_plan(PLAN_TEMPLATE, {"training": {"rounds": 0}})


def test_the_collusion_bound_raises_the_default_quorum_and_threshold_rule() -> None:
    assert aggregator_plan().secure_aggregation.max_colluding == 0
    colluding = aggregator_plan(secure_aggregation={"max_colluding": 1})
    assert colluding.secure_aggregation.max_colluding == 1
    # Two honest inputs beside one colluder: every round needs all three collaborators.
    assert colluding.quorum.min_collaborators == 3
    # Without secure aggregation the aggregator sees every update anyway: the bound constrains nothing.
    plain = aggregator_plan(
        secure_aggregation={"enabled": False, "max_colluding": 2}, quorum={"min_collaborators": 1}, privacy=NO_NOISE
    )
    assert plain.secure_aggregation.max_colluding == 2 and plain.quorum.min_collaborators == 1


def test_the_evaluation_grid_is_fixed_by_the_plan_on_both_sides() -> None:
    loaded = aggregator_plan(evaluation={"loss_range": [0.5, 2], "min_bucket_count": 25})
    assert loaded.evaluation.loss_range == (0.5, 2.0) and loaded.evaluation.min_bucket_count == 25
    # The collaborator computes the thresholds from its copy of the plan: the very same grid.
    shared = plan.load_shared_settings(plan.shared_settings(loaded))
    assert np.array_equal(shared.evaluation.thresholds(), loaded.evaluation.thresholds())
    default = plan.load_aggregator_plan(PLAN_TEMPLATE).evaluation
    assert default.loss_range == sums.LOSS_RANGE and default.min_bucket_count == sums.MIN_BUCKET_COUNT
    assert np.array_equal(default.thresholds(), sums.threshold_grid(sums.LOSS_RANGE))
    # Another range moves the dense half, never the vector's length.
    assert not np.array_equal(default.thresholds(), loaded.evaluation.thresholds())
    assert default.thresholds().size == loaded.evaluation.thresholds().size == sums.THRESHOLDS


def test_secure_aggregation_off_relaxes_the_quorum() -> None:
    loaded = aggregator_plan(secure_aggregation={"enabled": False}, quorum={"min_collaborators": 1}, privacy=NO_NOISE)
    assert loaded.quorum.min_collaborators == 1
    assert aggregator_plan(model={"name": "cnn", "features": 784, "image_shape": [1, 28, 28]}).model.image_shape == (
        1,
        28,
        28,
    )


def test_a_plan_names_its_own_model_factory_and_every_party_builds_the_same_start() -> None:
    loaded = aggregator_plan(model={"name": ..., "factory": FACTORY, "arguments": {"features": 107, "hidden": 16}})
    assert loaded.model.factory == FACTORY and loaded.model.name == FACTORY
    # Collaborators receive the factory and its arguments, never code, and read them back equal.
    shared = plan.load_shared_settings(plan.shared_settings(loaded))
    assert shared.model == loaded.model
    generator = torch.random.get_rng_state()
    assert loaded.own_factories == (FACTORY,)  # the operator's own plan is the aggregator's consent
    aggregator_side = loaded.model.build(seed=loaded.training.seed, allowed=loaded.own_factories)
    # A collaborator builds it only because its own config allows it (never because the plan names it).
    with pytest.raises(ConfigError, match="not allowed here; it was not imported"):
        shared.model.build(seed=loaded.training.seed)
    collaborator_side = shared.model.build(seed=loaded.training.seed, allowed=(FACTORY,))
    assert torch.equal(torch.random.get_rng_state(), generator), "building must not move the caller's generator"
    assert isinstance(aggregator_side, nn.Sequential) and aggregator_side[0].out_features == 16
    theta_0 = flat_parameters(aggregator_side)
    assert theta_0.numel() == 107 * 16 + 16 + 16 + 1
    assert torch.equal(theta_0, flat_parameters(collaborator_side))
    assert not torch.equal(theta_0, flat_parameters(loaded.model.build(seed=1, allowed=(FACTORY,))))
    # A different factory is a different plan: collaborators and checkpoints tell them apart.
    assert plan.plan_digest(loaded) != plan.plan_digest(aggregator_plan())


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("fedfair_no_such_package.models:build", r"module 'fedfair_no_such_package' is not installed .*every party"),
        ("tests.runtime.test_plan:no_such_function", r"has no 'no_such_function'"),
        ("tests.runtime.test_plan:not_a_model", r"returned a str, not a torch.nn.Module; make it return the model"),
        ("tests.runtime.test_plan", r"not of the form 'package.module:function'"),
    ],
)
def test_a_model_factory_that_cannot_build_is_refused_with_the_fix(factory: str, message: str) -> None:
    loaded = aggregator_plan(model={"name": ..., "factory": factory})
    with pytest.raises(ConfigError, match=message) as caught:
        loaded.model.build(seed=0, allowed=loaded.own_factories)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"collaborator": {"nmae": "x"}}, r"\[collaborator\] unknown key 'nmae'; did you mean 'name'\?"),
        ({"collaborator": {"name": ...}}, r"\[collaborator\] missing key 'name'"),
        ({"collaborator": {"name": "Hospital A"}}, r"\[collaborator\] name: invalid participant name"),
        ({"collaborator": {"aggregator": "nohost"}}, r"aggregator must be host:port"),
        ({"collaborator": {"device": "gpu"}}, r"device must be \"cpu\", \"cuda\""),
        ({"certificates": {"keyfile": "x"}}, r"\[certificates\] unknown key 'keyfile'; did you mean 'key'\?"),
        ({"data": {"dataset": ...}}, r"\[data\] needs exactly one source"),
        ({"data": {"csv": "x.csv"}}, r"\[data\] needs exactly one source"),
        ({"data": {"index": -1}}, r"index must be an integer >= 0"),
        ({"data": {"index": ...}}, r"\[data\] missing key 'index'"),
        ({"data": {"parts": 3, "index": 3}}, r"index = 3 must be below parts = 3"),
        ({"data": {"alpha": 0}}, r"alpha must be a number > 0"),
        ({"data": {"label": "y"}}, r"label applies to csv files only"),
        ({"data": {"test_fraction": 0.1}}, r"test_fraction applies to csv files only"),
        (
            {
                "data": {
                    "dataset": ...,
                    "partition": ...,
                    "index": ...,
                    "csv": "x.csv",
                    "label": "y",
                    "test_fraction": 1.0,
                }
            },
            r"test_fraction must be a number in \(0, 1\) \(the share of rows held out for evaluation\)",
        ),
        (
            {"data": {"dataset": ..., "index": ..., "csv": "x.csv", "label": "y"}},
            r"partition applies to named datasets only",
        ),
        ({"privacy": {"enabeld": True}}, r"\[privacy\] unknown key 'enabeld'; did you mean 'enabled'\?"),
        ({"privacy": {"max_grad_norm": 0}}, r"max_grad_norm must be a number > 0"),
        ({"privacy": {"noise_multiplier": -1}}, r"noise_multiplier must be a number >= 0"),
        ({"privacy": {"target_epsilon": 0}}, r"target_epsilon must be a number > 0"),
        ({"learning": {}}, r"unknown section \[learning\]"),
    ],
)
def test_collaborator_config_errors(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        collaborator_config(**sections)
    assert str(caught.value).startswith(f"{CONFIG_TEMPLATE}: ")


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found; copy the template"):
        plan.load_aggregator_plan(tmp_path / "missing.toml")
    broken = tmp_path / "plan.toml"
    broken.write_text("[training]\nrounds = \n")
    with pytest.raises(ConfigError, match=rf"{broken}: not valid TOML .*; fix the syntax"):
        plan.load_aggregator_plan(broken)
    with pytest.raises(ConfigError, match="not valid TOML"):
        collaborator_file.load_collaborator_config(broken)


def test_plan_digest_is_stable_and_ignores_deployment_details() -> None:
    base = plan.load_aggregator_plan(PLAN_TEMPLATE)
    digest = plan.plan_digest(base)
    assert len(digest) == 64 and digest == plan.plan_digest(aggregator_plan())
    assert (
        plan.plan_digest(
            aggregator_plan(aggregator={"address": "127.0.0.1:6000", "output": "/tmp/elsewhere", "report": False})
        )
        == digest
    )
    assert plan.plan_digest(aggregator_plan(training={"rounds": 51})) != digest
    assert (
        plan.plan_digest(aggregator_plan(federation={"collaborators": ["hospital-a", "hospital-b", "bank"]})) != digest
    )


def test_shared_settings_round_trip_without_names_or_paths() -> None:
    loaded = plan.load_aggregator_plan(PLAN_TEMPLATE)
    payload = plan.shared_settings(loaded)
    for secret in ("hospital", "certs", "50051", "output"):
        assert secret.encode() not in payload
    shared = plan.load_shared_settings(payload)
    assert shared.federation_id == loaded.federation_id and shared.collaborator_count == 3
    for section in ("objective", "model", "training", "influence", "secure_aggregation", "quorum", "evaluation"):
        assert getattr(shared, section) == getattr(loaded, section)
    with pytest.raises(ConfigError, match="not valid JSON"):
        plan.load_shared_settings(b"\xff")
    with pytest.raises(ConfigError, match=r"rho must be a number in \(0, 1\]"):
        plan.load_shared_settings(payload.replace(b'"rho":0.3', b'"rho":3'))


TEMPLATE_DIGEST = "af344ede551a018446d90dd552952bf40f788565627e447d4160f2d4c4399490"
ALGORITHM_ONE_DIGEST = "6f00f9bb1eca070060ae00a05b9412b928d11f2b57e5ef181de9b8b9822ab46e"
"""The template's digest before server momentum existed, which the same plan at server_momentum = 0 keeps."""
TEMPLATE_SHARED_SETTINGS = (
    b'{"evaluation":{"every":5,"loss_range":[0.0,3.0],"min_bucket_count":10},'
    b'"federation":{"collaborator_count":3,"id":"fedfair-demo"},'
    b'"influence":{"sizes":{},"update_norm":1.0,"weights":"equal"},'
    b'"model":{"arguments":{},"classes":2,"factory":null,"features":107,"image_shape":null,"name":"logreg"},'
    b'"objective":{"bound":10.0,"epsilon":0.1,"gamma":0.05,"rho":0.3,"smooth":"softrelu"},'
    b'"privacy":{"budget":10.0,"delta":1e-05,"epsilon":null,"interim_report_epsilon":0.2,"max_grad_norm":20.0,"mode":"off",'
    b'"report_epsilon":1.0},'
    b'"quorum":{"min_collaborators":2,"round_timeout_seconds":300.0},'
    b'"secure_aggregation":{"clip":10.0,"enabled":true,"fractional_bits":20,"max_colluding":0,'
    b'"max_weight":1000000.0,"modulus_bits":64,"neighbours":null,"threshold":null},'
    b'"training":{"average_from":0.5,"batch_fraction":0.01,"local_steps":5,"lr":0.1,"rounds":50,"seed":0,'
    b'"server_momentum":0.9,"threshold_lr":0.1}}'
)


def test_the_templates_digest_and_shared_settings_are_pinned() -> None:
    """Checkpoints carry the digest and collaborators compare it: the same plan must keep both, byte for byte."""
    loaded = plan.load_aggregator_plan(PLAN_TEMPLATE)
    assert plan.plan_digest(loaded) == TEMPLATE_DIGEST
    assert plan.shared_settings(loaded) == TEMPLATE_SHARED_SETTINGS


def test_a_plan_at_algorithm_ones_server_step_keeps_the_digest_it_had_before_server_momentum(tmp_path: Path) -> None:
    """Checkpoints written before the setting existed resume under the same plan with server_momentum = 0."""
    text = PLAN_TEMPLATE.read_text()
    assert text.count("server_momentum = 0.9") == 1
    # The template gained [privacy] (evaluation noise) later; without it, it is the plan as it was then.
    start = text.index("\n[privacy]\n")
    text = text[:start] + text[text.index("\n[", start + 1) :]
    changed = tmp_path / "plan.toml"
    changed.write_text(text.replace("server_momentum = 0.9", "server_momentum = 0.0"))
    assert plan.plan_digest(plan.load_aggregator_plan(changed)) == ALGORITHM_ONE_DIGEST


def test_dropouts_none_needs_every_collaborator_in_every_round() -> None:
    strict = aggregator_plan(secure_aggregation={"dropouts": "none"})
    assert not strict.secure_aggregation.tolerates_dropouts
    assert strict.quorum.min_collaborators == len(strict.collaborators)  # the default quorum is the roster
    with pytest.raises(ConfigError, match=r'dropouts = "none" needs every one of the 3 collaborators'):
        aggregator_plan(secure_aggregation={"dropouts": "none"}, quorum={"min_collaborators": 2})
    shared = plan.load_shared_settings(plan.shared_settings(strict))
    assert shared.secure_aggregation.dropouts == "none"
    # Every collaborator signs only a survivor set of the whole roster; by default, the isolation bound.
    key = ec.generate_private_key(ec.SECP256R1())
    strict_party = Participant("hospital-a", shared, 10, key, b"", lambda credential, name: key.public_key())
    assert strict_party.survivor_floor == 3
    tolerant = plan.load_shared_settings(plan.shared_settings(aggregator_plan()))
    assert (
        Participant("hospital-a", tolerant, 10, key, b"", lambda credential, name: key.public_key()).survivor_floor == 2
    )
    # At its default the setting is left out of what is shared, so existing plans keep their digest.
    assert "dropouts" not in json.loads(plan.shared_settings(aggregator_plan()))["secure_aggregation"]
    with pytest.raises(ConfigError, match=r"dropouts"):
        aggregator_plan(secure_aggregation={"dropouts": "some"})


def test_agreed_weights_are_shared_and_pinned_with_the_plan() -> None:
    sizes = {"hospital-a": 27869, "hospital-b": 3124, "hospital-c": 1569}
    loaded = aggregator_plan(influence={"weights": "declared", "sizes": sizes, "update_norm": 1.5})
    # b_k = round(batch_fraction * n_k) of the declared n_k: Algorithm 1's weights, agreed instead of claimed.
    assert [loaded.influence.weight_of(name, 0.01) for name in sizes] == [279.0, 31.0, 16.0]
    assert loaded.influence.total_weight(["hospital-b", "hospital-c"], 0.01) == 47.0
    shared = plan.load_shared_settings(plan.shared_settings(loaded))
    assert shared.influence == loaded.influence and shared.influence.sizes == sizes
    assert plan.shared_content(loaded)["influence"] == {"weights": "declared", "sizes": sizes, "update_norm": 1.5}
    # Equal weights need no sizes; sizes without "declared" still fix each batch (what DP needs).
    equal = aggregator_plan(influence={"sizes": sizes})
    assert equal.influence.weight_of("hospital-c", 0.01) == 1.0
    assert equal.influence.batch_base("hospital-c", 99) == 1569
    assert aggregator_plan().influence.batch_base("hospital-c", 99) == 99
    # C defaults to 2 * lr * local_steps: the template's 0.1 and 5 give 1.0, and it follows the plan's steps.
    assert aggregator_plan().influence.update_norm == 1.0
    assert aggregator_plan(training={"lr": 0.05, "local_steps": 2}).influence.update_norm == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="sizes has no entry for 'hospital-z'"):
        loaded.influence.weight_of("hospital-z", 0.01)


SCHEMA_SECTION: dict[str, Any] = {
    "label": "income",
    "classes": ["<=50K", ">50K"],
    "columns": [
        {"name": "age", "type": "numeric", "range": [0, 120]},
        {"name": "race", "type": "categorical", "categories": ["White", "Black", "Other"]},
        {"name": "native-country", "type": "categorical", "categories": "learn"},
    ],
}
"""A [schema] with a numeric, a listed and a learnt column (a plan with one states no [model] features)."""


def schema_plan(**evaluation: Any) -> plan.AggregatorPlan:
    return aggregator_plan(schema=SCHEMA_SECTION, model={"features": ...}, evaluation=evaluation)


def test_composition_columns_are_shared_and_only_the_final_evaluation_counts_them() -> None:
    loaded = schema_plan(composition=["race", "income"])
    assert loaded.evaluation.composition == ("race", "income")
    shared = plan.load_shared_settings(plan.shared_settings(loaded))
    assert shared.evaluation == loaded.evaluation
    assert [column.name for column in shared.counted_columns(50)] == ["race", "income"]
    # [White, Black, Other] and [<=50K, >50K], above c and in all: 2 totals and 10 counts after the sums.
    # The template noises its evaluations: the tail sums, not the exact threshold sums, come first.
    assert shared.evaluation_length(50) == shared.evaluation.tail_query().length + 2 + 2 * (3 + 2)
    assert shared.counted_columns(49) == () and shared.evaluation_length(49) == shared.evaluation.tail_query().length
    # Off (left out, or an empty list), it is not shared, so a plan keeps its digest and shared bytes.
    off = schema_plan()
    assert plan.plan_digest(schema_plan(composition=[])) == plan.plan_digest(off)
    assert "composition" not in json.loads(plan.shared_settings(off))["evaluation"]
    assert off.evaluation_length(50) == shared.evaluation.tail_query().length
    exact = aggregator_plan(schema=SCHEMA_SECTION, model={"features": ...}, privacy=NO_NOISE)
    assert exact.evaluation_length(50) == sums.vector_length()  # exact reports: the threshold sums


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["rase"], r"names 'rase', which is not a column of the \[schema\] \(did you mean 'race'\?\)"),
        (["age"], r"names 'age', a numeric column, which has no categories to count"),
        (["native-country"], r"names 'native-country', whose categories are learnt"),
        (["race", "race"], r"lists 'race' twice"),
        ("race", r"composition must be a non-empty list of strings"),
    ],
)
def test_a_plan_naming_a_column_that_cannot_be_counted_is_refused_at_load(names: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        schema_plan(composition=names)
    assert str(caught.value).startswith(f"{PLAN_TEMPLATE}: ") and "\n" not in str(caught.value)
    # A collaborator reads the shared settings with the same check: a plan it cannot count is refused there too.
    served = json.loads(plan.shared_settings(schema_plan()))
    served["evaluation"]["composition"] = names
    with pytest.raises(ConfigError, match=message):
        plan.load_shared_settings(json.dumps(served).encode())
    with pytest.raises(ConfigError, match=r"composition needs a \[schema\]"):
        aggregator_plan(evaluation={"composition": ["race"]})
