"""The model bundle: one file with everything needed to use a trained model, and no code.

A bundle holds the model's ``state_dict``, its architecture (a built-in model's name and
sizes, or an installed factory's "package.module:function" and keyword arguments), the
schema encoder's statistics (so a new table is encoded exactly as in training), the final
threshold c, the plan, the metrics history and provenance (rounds, how many rounds each
institution contributed, fedfair's version, when it was written; never any data).

Why: docs/design.md, "Inside the model bundle".
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

import fedfair
from fedfair.core.config import FACTORY_PATH
from fedfair.core.errors import ConfigError
from fedfair.core.files import atomic_write
from fedfair.core.models import build_from_factory, build_model
from fedfair.core.tables import parse_json_object

BUNDLE_FORMAT = "fedfair-model-bundle"
BUNDLE_VERSION = 1
# Tells a missing metadata key from one that is present but null.
_MISSING = object()
_FIX_CORRUPT = "copy the bundle again from the aggregator's output folder (or from the collaborator that received it)"


@dataclass(frozen=True)
class Bundle:
    """A trained model and what it takes to use it and to know where it came from.

    ``architecture`` is either ``{"name", "features", "classes", "image_shape"}`` (a
    built-in model of :func:`fedfair.core.models.build_model`) or ``{"factory",
    "arguments"}`` (a "package.module:function" every user must have installed, and allow).
    ``encoder`` is :meth:`fedfair.datasets.schema.Encoder.to_mapping`'s output, or None
    for a model trained on already-encoded arrays. Everything but the tensors is JSON.
    """

    state_dict: dict[str, torch.Tensor]
    architecture: dict[str, Any]
    encoder: dict[str, Any] | None
    threshold: float
    plan: dict[str, Any]
    metrics: list[dict[str, Any]]
    provenance: dict[str, Any]

    @property
    def factory(self) -> str | None:
        """The "package.module:function" that builds the model, or None for a built-in architecture."""
        factory: str | None = self.architecture.get("factory")
        return factory

    def build_model(self, *, allowed: Collection[str] = ()) -> nn.Module:
        """The architecture with the bundle's weights loaded strictly, in eval mode, on the CPU.

        ``allowed`` is the user's own list of factories they trust: a factory architecture is
        imported and called only if it is named there (else
        :class:`fedfair.core.errors.FactoryNotAllowedError`, before any import), since the name came
        from the bundle's file. A built-in architecture needs none.
        The model takes the weights' dtype, so a model trained in float64 predicts in float64.
        """
        if self.factory is not None:
            model = build_from_factory(self.factory, self.architecture["arguments"], allowed=allowed)
        else:
            model = build_model(
                self.architecture["name"],
                self.architecture["features"],
                self.architecture["classes"],
                image_shape=self.architecture["image_shape"],
            )
        floating = [tensor.dtype for tensor in self.state_dict.values() if tensor.is_floating_point()]
        if floating:
            model = model.to(floating[0])
        try:
            model.load_state_dict(self.state_dict, strict=True)
        except RuntimeError as error:
            # torch's first line only says "Error(s) in loading state_dict"; the mismatches follow.
            summary = "; ".join(line.strip() for line in str(error).splitlines()[1:] if line.strip())[:300]
            raise ConfigError(
                f"the bundle's weights do not fit its architecture {describe_architecture(self.architecture)} "
                f"({summary}); for a factory model install the package version the federation trained with, "
                f"otherwise {_FIX_CORRUPT}"
            ) from None
        return model.eval()

    @property
    def rho(self) -> float | None:
        """The protected group fraction of the plan's objective, if the plan names one."""
        objective = self.plan.get("objective")
        rho = objective.get("rho") if isinstance(objective, Mapping) else None
        return float(rho) if isinstance(rho, (int, float)) and not isinstance(rho, bool) else None


def builtin_architecture(
    name: str, features: int, classes: int, image_shape: tuple[int, ...] | list[int] | None = None
) -> dict[str, Any]:
    """The architecture entry of a built-in model (fedfair.core.models.build_model's arguments)."""
    return {
        "name": name,
        "features": features,
        "classes": classes,
        "image_shape": None if image_shape is None else list(image_shape),
    }


def factory_architecture(factory: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture entry of a model built by an installed factory called with ``arguments``."""
    return {"factory": factory, "arguments": dict(arguments)}


def describe_architecture(architecture: Mapping[str, Any]) -> str:
    """One short phrase naming the architecture, for messages."""
    if "factory" in architecture:
        return f"factory '{architecture['factory']}'"
    return f"'{architecture['name']}' ({architecture['features']} features, {architecture['classes']} classes)"


def make_provenance(rounds: int, contributions: Mapping[str, int]) -> dict[str, Any]:
    """Provenance of a bundle: rounds run, rounds each institution contributed, fedfair's version, time (UTC)."""
    return {
        "rounds": rounds,
        "contributions": {name: int(count) for name, count in sorted(contributions.items())},
        "fedfair_version": fedfair.__version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_bundle(path: Path, bundle: Bundle) -> None:
    """Write ``bundle`` to ``path`` atomically (a crash leaves the old file or the whole new one)."""
    _check_architecture(bundle.architecture, path)
    metadata = {
        "architecture": bundle.architecture,
        "encoder": bundle.encoder,
        "threshold": float(bundle.threshold),
        "plan": bundle.plan,
        "metrics": bundle.metrics,
        "provenance": bundle.provenance,
    }
    try:
        text = json.dumps(metadata, sort_keys=True)
    except (TypeError, ValueError) as error:
        raise ConfigError(
            f"cannot write model bundle {path}: its metadata is not JSON ({error}); "
            "pass plain numbers, strings, lists and dicts (e.g. the Encoder's to_mapping(), not the Encoder)"
        ) from None
    # A clone per tensor: a view of a larger buffer (a flat parameter vector) would otherwise
    # save that whole buffer, and a GPU tensor would need a GPU to load.
    tensors = {str(name): tensor.detach().to("cpu").clone() for name, tensor in bundle.state_dict.items()}
    payload = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "metadata": text, "state_dict": tensors}
    atomic_write(Path(path), lambda stream: torch.save(payload, stream))


def load_bundle(path: Path) -> Bundle:
    """Read a bundle with ``torch.load(weights_only=True)``: tensors and plain values only, never code.

    Raises:
        ConfigError: naming the file and the fix, when it is missing, unreadable, corrupt, holds pickled
            objects other than tensors and plain values, or is not a bundle this fedfair reads.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"model bundle {path} does not exist; pass the path of a bundle file the aggregator wrote")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise ConfigError(
            f"model bundle {path} holds pickled objects other than tensors and plain values, which fedfair never "
            "loads (they could run code); use a bundle written by fedfair, not a torch.save of a model object"
        ) from None
    except PermissionError:
        raise ConfigError(f"cannot read model bundle {path}: permission denied; check the file's permissions") from None
    # A damaged file fails inside torch.load with many exception types (miniz's RuntimeError, OSError,
    # EOFError, KeyError from the legacy reader, ...); each means the same to the user.
    except Exception as error:  # noqa: BLE001 (see the comment above)
        raise ConfigError(
            f"model bundle {path} is corrupt or truncated ({type(error).__name__}); {_FIX_CORRUPT}"
        ) from None
    return _bundle_from_payload(payload, path)


def _bundle_from_payload(payload: object, path: Path) -> Bundle:
    """Check what torch.load returned, field by field, and build the Bundle."""
    if not isinstance(payload, dict) or payload.get("format") != BUNDLE_FORMAT:
        raise ConfigError(
            f"{path} is not a fedfair model bundle (a torch file without the '{BUNDLE_FORMAT}' marker); "
            "pass the bundle the aggregator wrote, not a checkpoint or another tool's file"
        )
    version = payload.get("version")
    if version != BUNDLE_VERSION:
        raise ConfigError(
            f"model bundle {path} has format version {version!r}, but this fedfair ({fedfair.__version__}) reads "
            f"version {BUNDLE_VERSION}; use the fedfair release that wrote it (see its provenance) or retrain"
        )
    text, tensors = payload.get("metadata"), payload.get("state_dict")
    if not isinstance(text, str) or not isinstance(tensors, dict):
        raise ConfigError(f"model bundle {path} lacks its metadata or weights; {_FIX_CORRUPT}")
    if not all(isinstance(name, str) and isinstance(value, torch.Tensor) for name, value in tensors.items()):
        raise ConfigError(f"model bundle {path} has weights that are not named tensors; {_FIX_CORRUPT}")
    metadata = parse_json_object(text, f"model bundle {path} metadata", _FIX_CORRUPT)
    expected: dict[str, type | tuple[type, ...]] = {
        "architecture": dict, "encoder": (dict, type(None)), "threshold": (int, float), "plan": dict,
        "metrics": list, "provenance": dict,
    }  # fmt: skip
    if any(not isinstance(metadata.get(key, _MISSING), kinds) for key, kinds in expected.items()):
        raise ConfigError(f"model bundle {path} has incomplete metadata (needs {', '.join(expected)}); {_FIX_CORRUPT}")
    _check_architecture(metadata["architecture"], path)
    return Bundle(
        state_dict=tensors,
        architecture=metadata["architecture"],
        encoder=metadata["encoder"],
        threshold=float(metadata["threshold"]),
        plan=metadata["plan"],
        metrics=metadata["metrics"],
        provenance=metadata["provenance"],
    )


def _check_architecture(architecture: object, path: Path) -> None:
    """Refuse an architecture entry of neither form, so a bad bundle fails on writing or opening, not later."""
    if isinstance(architecture, Mapping):
        if set(architecture) == {"factory", "arguments"}:
            factory, arguments = architecture["factory"], architecture["arguments"]
            # A well-formed name only: it is shown in messages and pasted into --allow-factory.
            if isinstance(factory, str) and FACTORY_PATH.fullmatch(factory) and isinstance(arguments, Mapping):
                return
        elif set(architecture) == {"name", "features", "classes", "image_shape"}:
            sizes = (architecture["features"], architecture["classes"])
            shape = architecture["image_shape"]
            if (
                isinstance(architecture["name"], str)
                and all(_positive_integer(size) for size in sizes)
                and (shape is None or (isinstance(shape, list) and all(_positive_integer(side) for side in shape)))
                and (shape is None or math.prod(shape) == architecture["features"])
            ):
                return
    raise ConfigError(
        f"model bundle {path} has an invalid architecture {architecture!r}; it must be "
        '{"name", "features", "classes", "image_shape"} for a built-in model or {"factory", "arguments"} '
        "with a 'package.module:function' factory (use builtin_architecture or factory_architecture from "
        "fedfair.bundle)"
    )


def _positive_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
