"""Models: the built-ins' seeded start, and a user's own model loaded from "package.module:function",
which is imported only when the caller's own list allows it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fedfair.core.errors import ConfigError, FactoryNotAllowedError
from fedfair.core.models import ALLOW_FACTORY_FIX, build_from_factory, build_model, flat_parameters, load_factory


def small_network(features: int = 4, hidden: int = 3) -> nn.Module:
    """A factory this test module offers as "tests.core.test_models:small_network"."""
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, 2))


class Registry:
    """A namespace holding a factory, reached as "tests.core.test_models:Registry.build"."""

    build = staticmethod(small_network)


NOT_CALLABLE = 42


def parameterless() -> nn.Module:
    return nn.ReLU()


def test_a_seed_fixes_the_start_and_leaves_the_callers_generator_alone() -> None:
    before = torch.random.get_rng_state()
    first = flat_parameters(build_model("mlp", 5, 3, seed=4))
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(first, flat_parameters(build_model("mlp", 5, 3, seed=4)))
    assert not torch.equal(first, flat_parameters(build_model("mlp", 5, 3, seed=5)))
    path = "tests.core.test_models:small_network"
    custom = build_from_factory(path, {"features": 5, "hidden": 7}, allowed={path}, seed=4)
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(4)
    assert torch.equal(flat_parameters(custom), flat_parameters(small_network(5, 7)))


def test_a_factory_is_found_by_module_and_dotted_name() -> None:
    paths = ["tests.core.test_models:small_network", "tests.core.test_models:Registry.build", "torch.nn:Identity"]
    assert load_factory("tests.core.test_models:small_network", paths) is small_network
    assert load_factory("tests.core.test_models:Registry.build", paths) is small_network
    assert isinstance(load_factory("torch.nn:Identity", paths)(), nn.Identity)


def test_a_factory_not_allowed_is_refused_before_its_module_is_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    # Importing this module would leave the marker: the import itself runs code.
    (tmp_path / "throwaway_site_models.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\ndef build():\n    raise AssertionError('called')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    refused = "'throwaway_site_models:build' is not allowed here; it was not imported. If you trust it, "
    for allowed in ((), ["throwaway_site_models:other", "tests.core.test_models:small_network"]):
        with pytest.raises(FactoryNotAllowedError, match=re.escape(refused + ALLOW_FACTORY_FIX)):
            load_factory("throwaway_site_models:build", allowed)
        with pytest.raises(FactoryNotAllowedError):
            build_from_factory("throwaway_site_models:build", {}, allowed=allowed)
    assert "throwaway_site_models" not in sys.modules
    assert not marker.exists()
    # The marker is live: once allowed, the import does run the module.
    load_factory("throwaway_site_models:build", {"throwaway_site_models:build"})
    assert marker.exists()
    del sys.modules["throwaway_site_models"]
    # The consent check comes first: a name that would fail to import or to parse is refused the same way.
    for path in ("no_such_package_here.models:build", "not a factory path"):
        with pytest.raises(FactoryNotAllowedError, match="is not allowed here"):
            load_factory(path, ())


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("small_network", r"not of the form 'package.module:function'; .* e.g. 'mymodels.tabular:build'"),
        ("tests.core.test_models:", r"not of the form"),
        ("no_such_package_here.models:build", r"module 'no_such_package_here' is not installed .* every party"),
        ("tests.core.test_models:missing", r"module 'tests.core.test_models' has no 'missing'"),
        ("tests.core.test_models:NOT_CALLABLE", r"names an object of type int, not a function"),
    ],
)
def test_a_factory_that_cannot_be_loaded_names_the_fix(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_factory(path, allowed={path})


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("tests.core.test_models:Registry", r"returned a Registry, not a torch.nn.Module"),
        ("tests.core.test_models:parameterless", r"returned a model without parameters"),
    ],
)
def test_a_factory_must_return_a_trainable_module(path: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_from_factory(path, {}, allowed={path})


def test_a_dependency_missing_inside_the_factorys_module_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "site_models.py").write_text("import no_such_dependency_here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"module 'no_such_dependency_here' .* \(it imports 'no_such_dependency_here'\)"
    ):
        load_factory("site_models:build", allowed={"site_models:build"})
