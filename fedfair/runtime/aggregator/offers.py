"""What the aggregator offers for download at a round's start: the model's parts and the start stage's input.

A round's start stage (TRAIN or EVALUATE) has no open stage of its own: its model and input are offered here,
cut into messages once for every peer, and forgotten when the next round starts
(:meth:`fedfair.runtime.aggregator.board.Board.new_round`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import numpy as np

from fedfair.runtime.transport import DEFAULT_CHUNK_BYTES, WireStage, model_parts, pb

Position = tuple[int, WireStage]
"""A task's (round, stage): the order in which tasks are published."""


class Offers:
    """The model parts and start inputs a round offers, by (round, stage); safe to use from any thread."""

    def __init__(self) -> None:
        """Nothing offered."""
        self._lock = threading.Lock()
        self._models: dict[Position, list[pb.ModelPart]] = {}
        self._start_inputs: dict[Position, tuple[frozenset[str], bytes]] = {}

    def clear(self) -> None:
        """Forget every offer (a new round starts)."""
        with self._lock:
            self._models = {}
            self._start_inputs = {}

    def set_model(
        self, binding: pb.Binding, theta: np.ndarray, c: float, chunk_bytes: int = DEFAULT_CHUNK_BYTES
    ) -> None:
        """Offer (theta, c) for download under `binding`, cut into its messages once for every peer.

        It replaces the model offered before (a round's training model once its evaluation starts): stages run
        one at a time, and a closed stage's model is no longer read, so one model is held, not two.
        """
        with self._lock:
            self._models = {}  # the closed stage's model goes before this one is cut: never two at once
        parts = list(model_parts(binding, theta, c, chunk_bytes))
        with self._lock:
            self._models = {position(binding): parts}

    def model(self, binding: pb.Binding) -> list[pb.ModelPart] | None:
        """The model parts offered at `binding`'s round and stage, or None when none were set."""
        with self._lock:
            return self._models.get(position(binding))

    def set_start_input(self, binding: pb.Binding, peers: Iterable[str], payload: bytes) -> None:
        """Offer `payload` to `peers` for fetching at the start stage `binding` (TRAIN or EVALUATE)."""
        with self._lock:
            self._start_inputs[position(binding)] = (frozenset(peers), payload)

    def start_input(self, peer: str, binding: pb.Binding) -> bytes | None:
        """What `peer` may fetch at the start stage `binding` (None: nothing for it)."""
        with self._lock:
            peers, payload = self._start_inputs.get(position(binding), (frozenset(), b""))
        return payload if peer in peers else None


def position(binding: pb.Binding) -> Position:
    """Where `binding` stands in the federation: its round, then its stage (the order tasks come in)."""
    return binding.round, WireStage.of(binding)
