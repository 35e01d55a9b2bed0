"""The plan's ``[model]``: the architecture every party builds from the plan's seed.

A built-in model by name, or an institution's own factory that every party must allow in its
own configuration (nothing in a plan that arrived over the wire is ever imported). Reading the
section needs no torch; building the model does.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedfair.core.config import MODEL_NAMES
from fedfair.core.tables import Table, field_names, positive_integer
from fedfair.runtime.plan.limits import MAX_CLASSES, MAX_FEATURES, MAX_PARAMETERS

if TYPE_CHECKING:
    from torch import nn

ADULT_FEATURES = 107
"""Input features of the bundled Adult data: the default model input size."""


@dataclass(frozen=True)
class ModelSettings:
    """Which model, and the data's input/output sizes every collaborator's table must have.

    A built-in model is `name` (fedfair.core.models.build_model). An institution's own
    architecture is `factory`, "package.module:function", called with `arguments` (a
    table of JSON values) under the plan's seed; `name` then repeats the factory's path,
    so that it always names the architecture. Every party must have that package
    installed and allowed in its own configuration (``allowed``: nothing in a plan that
    arrived over the wire is ever imported); the aggregator builds the model only to learn
    its parameter shapes.
    """

    name: str = "logreg"
    features: int = ADULT_FEATURES
    classes: int = 2
    image_shape: tuple[int, ...] | None = None
    factory: str | None = None
    # Left out of the hash: a table is not hashable, and equal settings still compare equal.
    arguments: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)

    def build(self, seed: int = 0, *, allowed: Collection[str] = ()) -> nn.Module:
        """The model with `seed`'s initial weights (the plan's seed gives every side the same theta_0).

        A factory is built only if `allowed`, this party's own list, names it.
        """
        # Imported here: reading a plan must not need torch, only building its model does.
        from fedfair.core.models import build_from_factory, build_model

        if self.factory is not None:
            return build_from_factory(self.factory, self.arguments, allowed=allowed, seed=seed)
        return build_model(self.name, self.features, self.classes, image_shape=self.image_shape, seed=seed)

    def architecture(self) -> dict[str, Any]:
        """The architecture entry of this model's bundle: a factory's path and arguments, or a built-in's sizes."""
        from fedfair.bundle import builtin_architecture, factory_architecture  # loads torch, as building does

        if self.factory is not None:
            return factory_architecture(self.factory, self.arguments)
        return builtin_architecture(self.name, self.features, self.classes, self.image_shape)


def read_model(source: str, data: Mapping[str, object]) -> ModelSettings:
    """The plan's [model] (or the shared settings'), every value checked; no factory is imported here."""
    t = Table.of(source, data, "model", field_names(ModelSettings))
    d = ModelSettings()
    factory: str | None = None
    arguments: dict[str, Any] = {}
    if t.given("factory"):
        # Its form and presence are checked where it is imported (fedfair.core.models.load_factory), which
        # the aggregator does on start: reading a plan needs no torch and runs no user code.
        factory = t.string("factory", expected='"package.module:function", e.g. "mymodels:build"')
        # Shared settings repeat the factory as the name; a plan may leave the name out.
        name = t.string("name", factory)
        if name != factory:
            t.fail(
                f'[model] names both name = "{name}" and factory = "{factory}"; keep one: '
                "name for a built-in model, factory for your own"
            )
        if t.given("arguments"):
            arguments = t.json_table("arguments")
    else:
        name = t.string("name", d.name, choices=MODEL_NAMES)
        if t.given("arguments") and t.data["arguments"] != {}:
            t.fail(
                '[model] arguments apply to a model factory only; add factory = "package.module:function" or drop them'
            )
    features = t.integer("features", d.features, low=1, high=MAX_FEATURES)
    classes = t.integer("classes", d.classes, low=2, high=MAX_CLASSES)
    if features * classes > MAX_PARAMETERS:
        t.fail(
            f"[model] features = {features} and classes = {classes} give {features * classes} weights in the first "
            f"layer, above {MAX_PARAMETERS}; reduce the input (a [schema] with fewer categories) or the classes"
        )
    shape: tuple[int, ...] | None = None
    if t.given("image_shape"):
        value = t.data["image_shape"]
        if not isinstance(value, list) or len(value) != 3 or not all(positive_integer(x) for x in value):
            t.bad("image_shape", value, "a list of 3 positive integers [channels, height, width]")
        shape = tuple(value)
        if math.prod(shape) != features:
            t.fail(
                f"[model] image_shape = {value} holds {math.prod(shape)} values but features = {features}; make them agree"
            )
    if name == "cnn" and shape is None:
        t.fail('[model] name = "cnn" needs image_shape = [channels, height, width]; add it or use "logreg" / "mlp"')
    return ModelSettings(
        name=name, features=features, classes=classes, image_shape=shape, factory=factory, arguments=arguments
    )
