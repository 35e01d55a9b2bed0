"""The files a collaborator keeps per federation, and the final model bundle it receives at FINISHED.

Each is kept beside the config as NAME.FEDERATION.SUFFIX (bindings, outcome, model bundle). The bundle is
the aggregator's word, so it is kept only once :func:`bundle_mismatch` finds nothing: its federation id
and plan the ones this collaborator joined under, its architecture and encoder its plan's, its weights and
threshold exactly the output model it evaluated at the final round (itself the average of the training
models it was sent), and its evaluation figures those of the sums this collaborator verified
(:mod:`.figures`: one it did not verify is left out of the kept copy). A bundle that differs is refused
(``bundle-refused``, nothing kept). The closing
line counts from the outcome record only, never from the bundle's provenance, and says where the bundle is.

Why: docs/design.md, "Inside the collaborator".
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from fedfair.bundle import Bundle, load_bundle, write_bundle
from fedfair.bundle.format import describe_architecture
from fedfair.core.errors import ConfigError, WireError
from fedfair.core.files import atomic_write
from fedfair.core.models import load_flat_parameters
from fedfair.pki.roster import settings_digest
from fedfair.runtime.collaborator.config import CollaboratorConfig
from fedfair.runtime.collaborator.figures import EvaluationFigures
from fedfair.runtime.collaborator.trajectory import ServedModel, Values, slices_of, whole
from fedfair.runtime.failures import finished_exit
from fedfair.runtime.observe.logs import CLOSING_LINE
from fedfair.runtime.manifest_plan import setting_differences
from fedfair.runtime.plan.model import ModelSettings

logger = logging.getLogger("fedfair.collaborator")

BUNDLE_SUFFIX = "model_bundle.pt"
"""The federation's final model bundle is kept as NAME.FEDERATION.model_bundle.pt beside the config."""

SHOWN_DIFFERENCES = 6
"""How many differing plan fields a refusal names."""


def federation_file(config: CollaboratorConfig, federation_id: str, suffix: str) -> Path:
    """A file this collaborator keeps for one federation: beside its config, NAME.FEDERATION.SUFFIX."""
    return config.source.parent / f"{config.name}.{federation_id}.{suffix}"


@dataclass(frozen=True)
class Expectation:
    """What the federation's bundle must hold, from this collaborator's own copy of the plan.

    `settings` are the plan's shared settings it joined under (as served, checked against its pin); `model` the
    plan's model with the input size the federation's encoder gives; `seed` the plan's seed (every party builds
    the model from it); `factories` the model factories this institution allows; `encoder` the federation's
    encoder as this collaborator received it (:meth:`fedfair.datasets.encoder.Encoder.to_mapping`), None
    without a [schema].
    """

    federation_id: str
    settings: Mapping[str, Any]
    model: ModelSettings
    seed: int
    factories: Collection[str]
    encoder: Mapping[str, Any] | None


def bundle_mismatch(bundle: Bundle, expected: Expectation, output: ServedModel[Values]) -> str | None:
    """Why `bundle` is not this federation's output model, or None when it is.

    The reason starts with what did not match: ``federation``, ``plan``, ``architecture``, ``encoder`` or
    ``model`` (the weights or the threshold, with how many values differ and by how much).
    """
    federation = bundle.plan.get("federation")
    theirs = federation.get("id") if isinstance(federation, Mapping) else None
    if theirs != expected.federation_id:
        return (
            f"federation: the bundle is a model of federation {theirs!r}, not of {expected.federation_id!r}, the "
            "federation this collaborator joined"
        )
    ours, served = settings_digest(expected.settings), settings_digest(bundle.plan)
    if served != ours:
        fields = setting_differences(expected.settings, bundle.plan)
        more = f"; and {len(fields) - SHOWN_DIFFERENCES} more" if len(fields) > SHOWN_DIFFERENCES else ""
        return (
            f"plan: the bundle's plan (settings digest {served[:12]}) is not the one this collaborator joined under "
            f"({ours[:12]}); joined -> bundle: {'; '.join(fields[:SHOWN_DIFFERENCES])}{more}"
        )
    architecture = expected.model.architecture()
    if _json(bundle.architecture) != _json(architecture):
        return (
            f"architecture: the bundle's model is {describe_architecture(bundle.architecture)}, the plan's "
            f"{describe_architecture(architecture)}"
        )
    if _json(bundle.encoder) != _json(expected.encoder):
        return (
            "encoder: the bundle's encoder is not the one the federation's statistics gave this collaborator, so "
            "it would encode a new table otherwise than the federation trained"
        )
    return model_difference(bundle, expected, output)


@dataclass(frozen=True)
class _Wanted:
    """The plan's model holding the output model: each tensor's shape and dtype, and its values a piece at a time.

    `pieces()` yields (name, offset, values): the tensor `name`'s flat values from `offset` on.
    """

    tensors: dict[str, tuple[torch.Size, torch.dtype]]
    pieces: Callable[[], Iterator[tuple[str, int, torch.Tensor]]]


def _wanted(expected: Expectation, theta: Values) -> _Wanted:
    """The state dict of the plan's model holding `theta` (ValueError: it does not fit the model's parameters).

    A built-in model without buffers is built on the meta device, for its tensors' names, shapes and dtypes only,
    and each parameter is `theta`'s slice narrowed as :func:`~fedfair.core.models.load_flat_parameters` narrows it,
    read from the outcome record a slice at a time: at the end of a federation every site holds the bundle beside
    its output model, and the output model whole (and a comparison's mask of a tensor's size) per site was the
    run's peak (d = 10^7, three sites as threads). Any other model is built as the aggregator builds it, its
    buffers being its build's, and `theta` loaded into it whole.
    """
    if expected.model.factory is None:
        with torch.device("meta"):
            layout = expected.model.build(expected.seed)
        if not any(True for _ in layout.buffers()):
            place: dict[int, tuple[int, int]] = {}
            offset = 0
            for parameter in layout.parameters():
                place[id(parameter)] = (offset, parameter.numel())
                offset += parameter.numel()
            if offset != theta.size:
                raise ValueError(f"parameter vector has {theta.size} entries but the model has {offset}")
            named = layout.state_dict(keep_vars=True).items()
            places = [(name, *place[id(parameter)], parameter.dtype) for name, parameter in named]

            def pieces() -> Iterator[tuple[str, int, torch.Tensor]]:
                position = 0
                for part in slices_of(theta):
                    stop = position + part.size
                    for name, start, count, dtype in places:
                        low, high = max(position, start), min(stop, start + count)
                        if low < high:
                            yield name, low - start, torch.tensor(part[low - position : high - position]).to(dtype)
                    position = stop

            return _Wanted({name: (parameter.shape, parameter.dtype) for name, parameter in named}, pieces)
    model = expected.model.build(expected.seed, allowed=expected.factories)
    with torch.no_grad():
        load_flat_parameters(model, torch.from_numpy(whole(theta)))
    built = model.state_dict()
    return _Wanted(
        {name: (tensor.shape, tensor.dtype) for name, tensor in built.items()},
        lambda: ((name, 0, tensor.reshape(-1)) for name, tensor in built.items()),
    )


def model_difference(bundle: Bundle, expected: Expectation, output: ServedModel[Values]) -> str | None:
    """How the bundle's weights and threshold differ from `output` laid out in the plan's model, or None if equal.

    The aggregator builds the plan's model from its seed and copies theta-bar (float64) into its parameters;
    the same build and copy here give the same tensors bit for bit, so any difference is a different model.
    """
    try:
        wanted = _wanted(expected, output.theta)
    except ValueError as error:
        return f"model: the output model this collaborator was sent does not fit the plan's model ({error})"
    if set(bundle.state_dict) != set(wanted.tensors):
        extra = sorted(set(bundle.state_dict) - set(wanted.tensors))
        missing = sorted(set(wanted.tensors) - set(bundle.state_dict))
        return f"model: the bundle's weights name tensors {extra} the plan's model lacks and lack {missing}"
    for name, (shape, dtype) in wanted.tensors.items():
        held = bundle.state_dict[name]
        if held.dtype != dtype or held.shape != shape:
            return (
                f"model: the bundle's {name} is {held.dtype} of shape {tuple(held.shape)}, the plan's model has "
                f"{dtype} of shape {tuple(shape)}"
            )
    flat = {name: tensor.reshape(-1) for name, tensor in bundle.state_dict.items()}
    differing, largest, where = 0, 0.0, ""
    for name, at, values in wanted.pieces():
        held = flat[name][at : at + values.numel()]
        unequal = held != values
        count = int(unequal.sum())
        if count:
            differing += count
            gap = float((held[unequal].double() - values[unequal].double()).abs().nan_to_num(nan=np.inf).max())
            largest, where = max((largest, where), (gap, name))
    if differing:
        total = sum(tensor.numel() for tensor in bundle.state_dict.values())
        return (
            f"model: {differing} of {total} weights differ from the output model (theta-bar) this collaborator was "
            f"sent to evaluate in round {output.round}, the largest by {largest:.3g} (in {where})"
        )
    if bundle.threshold != output.c:
        return (
            f"model: the bundle's threshold c = {bundle.threshold!r} is not the c-bar = {output.c!r} this "
            f"collaborator was sent to evaluate in round {output.round}"
        )
    return None


@dataclass(frozen=True)
class Received:
    """What became of the federation's model bundle at FINISHED: kept at `kept`, refused, or neither."""

    kept: Path | None = None
    refusal: str | None = None
    """Why the bundle is not this federation's output model (nothing kept)."""
    not_kept: str = "the warning above says why"
    """Why nothing was kept when nothing impugns the bundle (it could not be fetched, read or checked)."""

    def describe(self) -> str:
        """The closing line's clause about the bundle: where it is and how to use it, or why there is none."""
        if self.kept is not None:
            return (
                f"the model bundle is in {self.kept}, checked against the output model this collaborator evaluated "
                f"(use it: fedfair predict --model {self.kept} --data TABLE --out PREDICTIONS.csv)"
            )
        if self.refusal is not None:
            return "the model bundle it was sent is refused and nothing is kept (the error below says why)"
        return f"no model bundle is kept ({self.not_kept})"


def receive_bundle(
    name: str,
    path: Path,
    fetch: Callable[[Callable[[bytes], object]], None],
    expected: Expectation | None,
    output: ServedModel[Values] | None,
    figures: EvaluationFigures | None = None,
) -> Received:
    """Fetch the final model bundle (`fetch`, the FINISHED task's input) and keep it at `path` if it checks out.

    It is read as `fedfair predict` would load it (plain tensors and JSON only), from a file beside `path`
    that is removed afterwards, and checked by :func:`bundle_mismatch`. With `figures` (verified aggregation),
    its evaluation records are held to the figures this collaborator verified
    (:meth:`~fedfair.runtime.collaborator.figures.EvaluationFigures.check`): one that differs refuses the
    bundle, one not verified is left out of the copy kept (a warning names it). Without `expected` (the model was never
    built here) or `output` (this collaborator was not sent the output model) it cannot be checked and is not
    kept. A bundle not kept for a reason that does not impugn it is a warning, and leaves the run's status as it
    is; the closing line (:func:`finished_status`) says where a kept one is.
    """
    unchecked = path.with_name(f"{path.name}.unchecked")
    try:
        try:
            atomic_write(unchecked, lambda stream: fetch(stream.write))  # a piece at a time: never held whole
            bundle = load_bundle(unchecked)
        except (grpc.RpcError, WireError, ConfigError, OSError) as error:
            reason = error.code().name if isinstance(error, grpc.RpcError) else str(error)
            logger.warning(
                "%s: could not keep the federation's model bundle (%s); ask the aggregator's operator for "
                "model_bundle.pt from its output folder",
                name,
                reason,
            )
            return Received()
        if expected is None or output is None:
            logger.warning(
                "%s: the federation's model bundle was not kept: this collaborator was not sent the output model "
                "to evaluate at the plan's final round, so it cannot check that the bundle holds it; ask the "
                "aggregator's operator for model_bundle.pt from its output folder",
                name,
            )
            return Received()
        refusal = bundle_mismatch(bundle, expected, output)
        if refusal is not None:
            return Received(refusal=refusal)
        if figures is not None:
            held = figures.check(bundle.metrics)
            if held.forged is not None:
                return Received(refusal=held.forged)
            if held.left_out:
                logger.warning(
                    "%s: the kept model bundle leaves out the evaluation figures of round %s: %s",
                    name,
                    ", ".join(map(str, held.left_out)),
                    "; ".join(f"round {number}: {why}" for number, why in held.left_out.items()),
                )
            if held.metrics != bundle.metrics:  # as this collaborator verified them: never the aggregator's word
                write_bundle(path, dataclasses.replace(bundle, metrics=held.metrics))
                return Received(kept=path)
        with unchecked.open("rb") as checked:
            atomic_write(path, lambda stream: shutil.copyfileobj(checked, stream))
        return Received(kept=path)
    finally:
        unchecked.unlink(missing_ok=True)


def finished_status(name: str, planned: int, contributed: int, bundle: Received, allowed: int = 0) -> int:
    """Log a collaborator's closing line at FINISHED and return its exit status.

    One line says it all: the rounds that hold this institution's update and where the federation's model
    bundle is kept (`bundle`). `contributed` is what this institution's own record counts
    (:attr:`OutcomeRecord.contributed <fedfair.runtime.collaborator.outcome.OutcomeRecord.contributed>`), never
    the bundle's provenance. More than `allowed` (the plan's [quorum] aborted_rounds_allowed) of the `planned`
    rounds without it ends with :data:`~fedfair.runtime.failures.EXIT_INCOMPLETE`, not 0
    (:func:`~fedfair.runtime.failures.finished_exit`); `allowed` or fewer is a warning and 0.
    """
    counted = f"by its own record, its model holds this institution's update in {contributed} of {planned} rounds"
    if contributed >= planned:
        logger.info("%s: the federation has finished; %s; %s", name, counted, bundle.describe(), extra=CLOSING_LINE)
        return 0
    status = finished_exit(planned - contributed, allowed)
    logger.warning(
        "%s: the federation has finished, but %s: rounds aborted or ran without this site; the aggregator's "
        "rounds.jsonl says which and why ([quorum] aborted_rounds_allowed = %d: exit %d); %s",
        name,
        counted,
        allowed,
        status,
        bundle.describe(),
        extra=CLOSING_LINE,
    )
    return status


def _json(value: object) -> object:
    """`value` as JSON reads it back (tuples as lists), so a built entry compares with one a bundle held."""
    return json.loads(json.dumps(value))
