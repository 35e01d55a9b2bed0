"""The aggregator's server state: a ServerState in memory, or from 64 MiB on a state in a file, read by span.

Everything the aggregator makes of its state (the step, a round's download, the output model, digests,
checkpoints) reads it a span at a time (:mod:`fedfair.runtime.state_files`), so a large model's state costs
the aggregator pieces of memory rather than three models' worth; a small one is stepped whole, as before.
Its file lies in the output folder, beside the checkpoint that outlives it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeAlias

import numpy as np

from fedfair.core.algorithm import FedSRCVaR
from fedfair.core.server import Aggregate, ServerState
from fedfair.runtime.contract import model_download, training_download_size
from fedfair.runtime.state_files import InFile, HeldState, holding, held_in_file, stepped, tensors_of

AggregatorState: TypeAlias = ServerState | InFile
"""What a checkpoint holds: a state in memory, or one in a file (a large model's)."""


def placed(state: AggregatorState, algorithm: FedSRCVaR, folder: Path) -> AggregatorState:
    """`state` where its size keeps it: in a file in `folder` once the plan's state comes to 64 MiB or more.

    Raises:
        OSError: the state's file could not be written (a full disk), naming `folder`.
    """
    if isinstance(state, ServerState) and held_in_file(state.theta.numel(), tensors_of(algorithm)):
        return InFile.of(state, folder)
    return state


def step(
    state: AggregatorState,
    weighted_sum: np.ndarray,
    total_weight: float,
    algorithm: FedSRCVaR,
    average_from: int,
    folder: Path,
) -> AggregatorState:
    """The round's server step on the decoded update sum, `state` given up (formed in its tensors in memory).

    A state in a file is stepped a piece at a time into a new file, bit for bit the whole step (glibc's freed
    memory is not trimmed here, as a site's chain trims it: at d = 10^7 that measured no gain at the
    aggregator). Raises AggregateError (the round void) as the step does.
    """

    def server_step(piece: ServerState, aggregate: Aggregate, consume: bool) -> ServerState:
        return algorithm.server_apply(piece, aggregate, average_from=average_from, consume=consume)

    after = stepped(
        holding(state),
        lambda start, stop: weighted_sum[start:stop],
        total_weight,
        server_step,
        give_up=True,
        folder=folder,
    )
    return _unkept(after)


def training_values(state: AggregatorState, builtin: bool) -> np.ndarray:
    """The values a TRAIN download carries besides c (:func:`fedfair.runtime.contract.training_download`).

    Formed a span at a time into one array: theta narrowed as a model download is, or with drift correction
    theta and the control variate in float64.
    """
    held = holding(state)
    drift = held.has("control")
    dtype = np.float64 if drift else model_download(np.empty(0), builtin).dtype
    values = np.empty(training_download_size(held.dimension, drift), dtype=dtype)
    _fill(values, held, "theta")
    if drift:
        _fill(values[held.dimension :], held, "control")
    return values


def output_values(state: AggregatorState, builtin: bool) -> np.ndarray:
    """Theta-bar as a model download carries it (:func:`fedfair.runtime.contract.model_download`), by span."""
    held = holding(state)
    values = np.empty(held.dimension, dtype=model_download(np.empty(0), builtin).dtype)
    _fill(values, held, "theta_average")
    return values


def parameters(state: AggregatorState) -> int:
    """The model's number of parameters (theta's coordinates)."""
    return holding(state).dimension


def _fill(into: np.ndarray, held: HeldState, field: str) -> None:
    """`into`[:length] set to the tensor `field`'s values, cast to `into`'s type a span at a time."""
    length = held.dimension + (1 if field == "control" else 0)
    for start, stop in held.spans(length):
        into[start:stop] = held.values(field, start, stop)


def _unkept(state: HeldState) -> AggregatorState:
    """A kept state as a checkpoint holds it: the ServerState itself when in memory."""
    if isinstance(state, InFile):
        return state
    return state.piece(0, state.dimension)
