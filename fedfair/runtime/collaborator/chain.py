"""The models a site verified: each one the plan's server step applied to a sum this site verified.

Verified aggregation proves a round's sum (:mod:`fedfair.secagg.verify`); :class:`ModelChain` proves what the
aggregator did with it. From round 1's model (the server's initial state) a site keeps the server state it
computed itself: once it verified round r's sum it applies the plan's server step to it
(``SharedSettings.algorithm().server_apply``, the function the aggregator and the simulation call), and it takes
round r + 1's model, and an evaluated output model, only if it is bit for bit that state's (or, the round void
after its check, the one before). A site that missed a round's check (it joined late, restarted, sat a round
out) has no trusted state from then on: it checks nothing more, and says so. docs/security.md, "Verified
aggregation", says what is covered. A large model's states live in files (:mod:`fedfair.runtime.state_files`).
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from pathlib import Path

import numpy as np
import torch

from fedfair.core.errors import AggregateError, VerificationError, VerifyReason
from fedfair.core.server import Aggregate, ServerState
from fedfair.runtime.contract import model_download
from fedfair.runtime.memory import release_freed
from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.state_files import HeldState, keep, held_in_file, spans, stepped, tensors_of
from fedfair.secagg import Encoder

logger = logging.getLogger("fedfair.collaborator")

_COMPARED = 1 << 20
"""Values of the output model narrowed and compared at a time (4 MiB of float32, 8 MiB of float64)."""


class ModelChain:
    """The server state this site computed from the sums it verified, and the models it accepts from it.

    `folder` is where it keeps a state too large for memory (the site's own; None: the system's temporary folder).
    """

    def __init__(self, name: str, shared: SharedSettings, folder: Path | None = None) -> None:
        self._name = name
        self._shared = shared
        self._folder = folder
        self._state: HeldState | None = None
        """The state whose model was sent for training round `_round`; None before round 1 or once unchecked."""
        self._round = 0
        self._verified = False
        """Whether this site verified training round `_round`'s sum."""
        self._next: HeldState | None = None
        """The server step applied to that verified sum (None: not verified, or a sum no step applies)."""
        self.unchecked_from: int | None = None
        """The first round whose model this site could not check (it missed a check), None while it checked all."""

    @property
    def active(self) -> bool:
        """Whether the plan verifies its training sums (secure aggregation): only then is there a chain."""
        return self._shared.secure_aggregation.enabled

    def sent(self, round_number: int, theta: np.ndarray, c: float, control: np.ndarray | None) -> None:
        """Check the model (theta, c, sigma) sent for training round `round_number` before anything trains on it.

        Round 1's model starts the chain (it is the server's initial state, sigma zeros). A round run again
        (the aggregator resumed) must be sent its model again.

        Raises:
            VerificationError: NEXT_MODEL, this site verified the previous round's sum and the model is neither
                the server step applied to it nor (the round void) the model before.
        """
        if not self.active:
            return
        state = self._state
        if state is None and round_number == 1 and self.unchecked_from is None:
            start = self._start(theta, c)
            if self._matches(start, theta, c, control):
                self._state, self._round, self._verified, self._next = start, 1, False, None
                return
            raise VerificationError(
                round_number, VerifyReason.NEXT_MODEL, "round 1's control variate is not the initial zeros"
            )
        if state is None:
            self._uncheck(round_number, "it has no model it verified before this one")
            return
        if round_number == self._round:
            candidates = [state]  # the round runs again: on the model it ran on, whatever was verified of it
        elif round_number == self._round + 1:
            candidates = [state] if self._next is None else [self._next, state]
        else:
            self._uncheck(round_number, f"it last checked round {self._round}'s model")
            return
        for candidate in candidates:
            if self._matches(candidate, theta, c, control):
                self._state, self._round, self._verified, self._next = candidate, round_number, False, None
                return
        if round_number == self._round + 1 and not self._verified:
            self._uncheck(round_number, f"it did not verify round {self._round}'s sum")
            return
        raise VerificationError(
            round_number,
            VerifyReason.NEXT_MODEL,
            f"the model sent for round {round_number} is neither the plan's server step applied to the sum of round "
            f"{self._round} this site verified nor the model before it ({self._gap(candidates[0], theta, c)})",
        )

    def verified(self, round_number: int, words: np.ndarray, survivors: Collection[str], encoder: Encoder) -> None:
        """Apply the plan's server step to training round `round_number`'s verified sum (`words`, encoded).

        The sum is decoded as the aggregator decodes it and divided by the weight the plan agrees for `survivors`
        (the aggregator's own rule). A sum the step refuses (AggregateError) leaves the model as it was. A state
        in a file is stepped a piece at a time, its sum decoded by piece where the encoding allows.
        """
        state = self._state
        if not self.active or state is None or round_number != self._round:
            return
        shared = self._shared
        weight = shared.influence.total_weight(survivors, shared.batch_fraction)
        self._verified = True
        whole = None if encoder.decodes_by_slice else encoder.decode(words, len(survivors)).weighted_sum

        def read(start: int, stop: int) -> np.ndarray:
            return encoder.decode_slice(words, start, stop) if whole is None else whole[start:stop]

        if state.in_file:
            # Before this site's pass over its state, the round's freed buffers go back to the system: at this
            # size they are worth the faults of taking them again (fedfair.runtime.memory).
            release_freed()
        algorithm, average_from = shared.algorithm(), shared.training.average_from_round

        def server_step(piece: ServerState, aggregate: Aggregate, consume: bool) -> ServerState:
            return algorithm.server_apply(piece, aggregate, average_from=average_from, consume=consume)

        try:
            # The state the site verified is kept beside the next (a void round goes back to it): never given up.
            self._next = stepped(state, read, weight, server_step, give_up=False, folder=self._folder)
        except AggregateError:
            self._next = None

    def evaluated(self, round_number: int, theta: np.ndarray, c: float) -> None:
        """Check the output model (theta-bar, c-bar) sent for round `round_number`'s evaluation.

        Raises:
            VerificationError: NEXT_MODEL, this site verified round `round_number`'s sum and the model is not the
                average of the state after it (or, the round void, before it).
        """
        if not self.active or self._state is None or round_number != self._round:
            return
        candidates = [self._state] if self._next is None else [self._next, self._state]
        for candidate in candidates:
            if c == candidate.c_average and self._downloaded(candidate, "theta_average", theta, narrowed=True):
                return
        if self._verified:
            raise VerificationError(
                round_number,
                VerifyReason.NEXT_MODEL,
                f"the output model sent to evaluate in round {round_number} is not the average of the models the "
                "plan's server step makes of the sums this site verified",
            )
        self._uncheck(round_number, f"it did not verify round {round_number}'s sum")

    def _start(self, theta: np.ndarray, c: float) -> HeldState:
        """Round 1's state, the server's initial one made of the model sent (theta, c), kept by its size."""
        algorithm = self._shared.algorithm()
        dimension = theta.size
        in_file = held_in_file(dimension, tensors_of(algorithm))
        pieces = (
            (start, stop, algorithm.server_init(torch.from_numpy(np.asarray(theta[start:stop], dtype=np.float64)), c))
            for start, stop in spans(dimension, in_file)
        )
        return keep(pieces, dimension, in_file, self._folder)

    def _matches(self, state: HeldState, theta: np.ndarray, c: float, control: np.ndarray | None) -> bool:
        """Whether (theta, c, control) is, bit for bit, what the aggregator sends of `state` (contract's downloads)."""
        if c != state.c or (control is None) == state.has("control"):
            return False
        if control is not None and not self._downloaded(state, "control", control, narrowed=False):
            return False
        builtin = self._shared.model.factory is None
        wire = np.dtype(np.float64) if control is not None else model_download(np.empty(0), builtin).dtype
        return theta.dtype == wire and self._downloaded(state, "theta", theta, narrowed=control is None)

    def _downloaded(self, state: HeldState, field: str, sent: np.ndarray, *, narrowed: bool) -> bool:
        """Whether `sent` equals `state`'s tensor `field` as a download carries it (`narrowed`: model_download's).

        Narrowed and compared a slice at a time: a float32 copy of the whole costs a model's worth.
        """
        length = state.dimension + (1 if field == "control" else 0)
        if sent.size != length:
            return False
        builtin = self._shared.model.factory is None
        for start, stop in state.spans(length):
            values = state.values(field, start, stop)
            for at in range(0, values.size, _COMPARED):
                expected = values[at : at + _COMPARED]
                if narrowed:
                    expected = model_download(expected, builtin)
                if not np.array_equal(expected, sent[start + at : start + at + expected.size]):
                    return False
        return True

    def _gap(self, state: HeldState, theta: np.ndarray, c: float) -> str:
        """How far (theta, c) is from `state`'s model: the refusal's figures."""
        if state.dimension != theta.size:
            return f"{theta.size} values where the step makes {state.dimension}"
        differ, largest = 0, 0.0
        for start, stop in state.spans():
            expected, part = state.values("theta", start, stop), theta[start:stop]
            differ += int(np.count_nonzero(expected.astype(theta.dtype) != part))
            largest = max(largest, float(np.abs(expected - part).max(initial=0.0)))
        return f"{differ} of {theta.size} values differ, the largest by {largest:.3g}; c by {abs(c - state.c):.3g}"

    def _uncheck(self, round_number: int, why: str) -> None:
        """Stop checking from `round_number` on: this site has no trusted state to check its models against."""
        if self.unchecked_from is None:
            self.unchecked_from = round_number
            logger.warning(
                "%s: round %d: this site cannot check the model it was sent (%s); it trains on it and the later "
                'ones unchecked (docs/security.md, "Verified aggregation")',
                self._name,
                round_number,
                why,
            )
        self._state, self._next, self._verified = None, None, False
