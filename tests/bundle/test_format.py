"""The bundle file: a round trip keeps every field and the model's outputs; anything that is not a
fedfair bundle of this version (pickled objects, a truncated file, another format version) is refused
with a ConfigError naming the file, and a pickled object's code never runs. A factory the bundle names
is imported and called only when the caller allows it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import fedfair
from fedfair.bundle import (
    BUNDLE_VERSION,
    Bundle,
    builtin_architecture,
    factory_architecture,
    load_bundle,
    make_provenance,
    write_bundle,
)
from fedfair.bundle.format import BUNDLE_FORMAT
from fedfair.core.errors import ConfigError, FactoryNotAllowedError
from fedfair.core.models import build_model

# Set by a pickled object's reduce hook if torch.load ever ran it.
CODE_RAN: list[str] = []


def two_layer(features: int, hidden: int) -> nn.Module:
    """A user's own architecture, named in a bundle as tests.bundle.test_format:two_layer."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def leave_marker(marker: str) -> nn.Module:
    """A factory with a side effect: creates ``marker``, so a test sees whether it was ever called."""
    Path(marker).touch()
    return nn.Linear(4, 1)


def _mark_ran(note: str) -> str:
    CODE_RAN.append(note)
    return note


class Payload:
    """An object whose unpickling runs code: what weights_only must refuse."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return _mark_ran, ("unpickled",)


def trained_bundle(model: nn.Module, architecture: dict[str, object]) -> Bundle:
    return Bundle(
        state_dict=model.state_dict(),
        architecture=architecture,
        encoder={"label": "income", "classes": ["<=50K", ">50K"], "numeric": {"age": [38.5, 13.2]}},
        threshold=0.731,
        plan={"objective": {"rho": 0.3, "epsilon": 0.1}, "model": {"name": "mlp"}},
        metrics=[{"round": 1, "worst_risk": 0.9}, {"round": 2, "worst_risk": 0.7}],
        provenance=make_provenance(2, {"hospital-b": 2, "hospital-a": 1}),
    )


def randomised(model: nn.Module, seed: int) -> nn.Module:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return model


@pytest.fixture
def mlp_bundle() -> tuple[nn.Module, Bundle]:
    model = randomised(build_model("mlp", 6, 3, dtype=torch.float64), seed=1)
    return model, trained_bundle(model, builtin_architecture("mlp", 6, 3))


def test_a_round_trip_keeps_every_field_and_the_models_outputs(
    tmp_path: Path, mlp_bundle: tuple[nn.Module, Bundle]
) -> None:
    model, bundle = mlp_bundle
    path = tmp_path / "final.bundle"
    write_bundle(path, bundle)
    loaded = load_bundle(path)

    assert (loaded.architecture, loaded.encoder, loaded.threshold) == (
        bundle.architecture, bundle.encoder, bundle.threshold
    )  # fmt: skip
    assert (loaded.plan, loaded.metrics, loaded.provenance) == (bundle.plan, bundle.metrics, bundle.provenance)
    assert loaded.provenance["contributions"] == {"hospital-a": 1, "hospital-b": 2}
    assert loaded.provenance["fedfair_version"] == fedfair.__version__
    assert loaded.rho == 0.3
    assert loaded.state_dict.keys() == bundle.state_dict.keys()
    for name, tensor in bundle.state_dict.items():
        assert torch.equal(loaded.state_dict[name], tensor) and loaded.state_dict[name].dtype == torch.float64
    rebuilt = loaded.build_model()
    inputs = torch.randn(5, 6, dtype=torch.float64)
    assert torch.equal(rebuilt(inputs), model(inputs))
    assert not rebuilt.training
    # Atomic write: nothing but the bundle is left in the folder.
    assert list(tmp_path.iterdir()) == [path]


def test_a_factory_architecture_is_rebuilt_from_the_installed_function(tmp_path: Path) -> None:
    model = randomised(two_layer(4, 3), seed=2)
    architecture = factory_architecture("tests.bundle.test_format:two_layer", {"features": 4, "hidden": 3})
    write_bundle(tmp_path / "own.bundle", trained_bundle(model, architecture))
    rebuilt = load_bundle(tmp_path / "own.bundle").build_model(allowed={"tests.bundle.test_format:two_layer"})
    inputs = torch.randn(7, 4)
    assert torch.equal(rebuilt(inputs), model(inputs))


@pytest.mark.parametrize(
    ("factory", "arguments"),
    [
        ("tests.bundle.test_format:leave_marker", lambda marker: {"marker": str(marker)}),
        # What a hostile bundle would name: a shell command, run by importing os and calling system.
        ("os:system", lambda marker: {"command": f"touch '{marker}'"}),
    ],
    ids=["test-factory", "os-system"],
)
def test_a_factory_the_caller_did_not_allow_is_never_called(
    tmp_path: Path, factory: str, arguments: Callable[[Path], dict[str, object]]
) -> None:
    marker = tmp_path / "factory-ran"
    path = tmp_path / "hostile.bundle"
    write_bundle(path, trained_bundle(nn.Linear(4, 1), factory_architecture(factory, arguments(marker))))
    bundle = load_bundle(path)  # reading the file is safe; only building the model would run the factory
    assert bundle.factory == factory
    refused = rf"model factory '{factory}' is not allowed here; it was not imported"
    for allowed in ((), ["tests.bundle.test_format:two_layer"]):
        with pytest.raises(FactoryNotAllowedError, match=refused):
            bundle.build_model(allowed=allowed)
    assert not marker.exists()


def test_a_built_in_architecture_needs_no_allowed_factory(mlp_bundle: tuple[nn.Module, Bundle]) -> None:
    assert mlp_bundle[1].factory is None
    assert isinstance(mlp_bundle[1].build_model(), nn.Sequential)


def test_weights_that_do_not_fit_the_architecture_are_refused(tmp_path: Path) -> None:
    model = build_model("logreg", 5, 2)
    write_bundle(tmp_path / "b", trained_bundle(model, builtin_architecture("logreg", 6, 2)))
    with pytest.raises(ConfigError, match=r"weights do not fit its architecture 'logreg' \(6 features, 2 classes\)"):
        load_bundle(tmp_path / "b").build_model()


def test_a_file_carrying_a_pickled_object_is_refused_without_running_it(tmp_path: Path) -> None:
    path = tmp_path / "evil.bundle"
    torch.save({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "metadata": "{}", "state_dict": {},
                "extra": Payload()}, path)  # fmt: skip
    with pytest.raises(ConfigError, match=rf"{path} holds pickled objects other than tensors"):
        load_bundle(path)
    # A whole pickled model (torch.save(model)) is code too.
    torch.save(build_model("logreg", 3, 2), tmp_path / "model.pt")
    with pytest.raises(ConfigError, match="holds pickled objects"):
        load_bundle(tmp_path / "model.pt")
    assert CODE_RAN == []


def test_a_truncated_file_is_refused_naming_it(tmp_path: Path, mlp_bundle: tuple[nn.Module, Bundle]) -> None:
    path = tmp_path / "cut.bundle"
    write_bundle(path, mlp_bundle[1])
    content = path.read_bytes()
    for length in (len(content) // 2, len(content) - 1, 0):
        path.write_bytes(content[:length])
        with pytest.raises(ConfigError, match=rf"bundle {path} is corrupt or truncated .*; copy the bundle again"):
            load_bundle(path)


def test_another_format_version_is_refused_with_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "future.bundle"
    torch.save({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION + 1, "metadata": "{}", "state_dict": {}}, path)
    with pytest.raises(ConfigError, match=rf"{path} has format version {BUNDLE_VERSION + 1}, .* reads version "
                                          rf"{BUNDLE_VERSION}; use the fedfair release that wrote it"):  # fmt: skip
        load_bundle(path)


def test_files_that_are_not_bundles_are_refused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint.pt"
    torch.save({"theta": torch.zeros(3)}, checkpoint)
    with pytest.raises(ConfigError, match=rf"{checkpoint} is not a fedfair model bundle"):
        load_bundle(checkpoint)
    with pytest.raises(ConfigError, match=r"missing.bundle does not exist"):
        load_bundle(tmp_path / "missing.bundle")
    incomplete = tmp_path / "incomplete.bundle"
    torch.save({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "metadata": '{"plan": {}}', "state_dict": {}},
               incomplete)  # fmt: skip
    with pytest.raises(ConfigError, match=r"incomplete metadata"):
        load_bundle(incomplete)


@pytest.mark.parametrize(
    ("metadata", "problem"),
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),
        ('{"threshold": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"plan": {', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
    ],
    ids=["100,000 deep", "5,000 digits", "cut short", "not an object"],
)
def test_metadata_that_is_no_json_object_is_a_named_error(tmp_path: Path, metadata: str, problem: str) -> None:
    path = tmp_path / "damaged.bundle"
    torch.save({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "metadata": metadata, "state_dict": {}}, path)
    with pytest.raises(ConfigError, match=rf"^model bundle {path} metadata: {problem}; copy the bundle again"):
        load_bundle(path)


def test_metadata_that_is_not_json_or_an_unknown_architecture_is_refused_on_writing(tmp_path: Path) -> None:
    model = build_model("logreg", 3, 2)
    with pytest.raises(ConfigError, match="invalid architecture"):
        write_bundle(tmp_path / "b", trained_bundle(model, {"name": "logreg"}))
    # A factory name that is not "package.module:function" (here one that could hide terminal escapes).
    with pytest.raises(ConfigError, match="invalid architecture .* with a 'package.module:function' factory"):
        write_bundle(tmp_path / "b", trained_bundle(model, factory_architecture("os:system\x1b[2K", {})))
    bundle = trained_bundle(model, builtin_architecture("logreg", 3, 2))
    not_json = Bundle(**{**bundle.__dict__, "encoder": {"statistics": object()}})
    with pytest.raises(ConfigError, match=r"metadata is not JSON .* the Encoder's to_mapping\(\)"):
        write_bundle(tmp_path / "b", not_json)
    assert not (tmp_path / "b").exists()
