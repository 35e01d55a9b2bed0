"""A weighted vector read a piece at a time: what the encoder reads, whole or never formed whole.

A site's update is encoded from its pieces (:class:`fedfair.core.update.WeightedVector`), each formed as it is
rounded, so the weighted vector is never held beside its encoding; a vector already whole is read as views of
its blocks (:class:`Blocks`). Either way :func:`placed` checks that the pieces are the values announced.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from fedfair.core.errors import ConfigError

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
"""The value types the encoder reads without a conversion."""


@runtime_checkable
class Pieces(Protocol):
    """A vector of `size` float32 or float64 values, read in order a piece at a time."""

    @property
    def size(self) -> int:
        """The vector's length."""
        ...

    def pieces(self, span: int) -> Iterator[np.ndarray]:
        """The vector's values in order, at most `span` a piece, `size` of them in all."""
        ...


@dataclass(frozen=True)
class Blocks:
    """A whole 1-D vector as :class:`Pieces`: views of its consecutive blocks, nothing copied."""

    vector: np.ndarray

    @property
    def size(self) -> int:
        """The vector's length."""
        return self.vector.size

    def pieces(self, span: int) -> Iterator[np.ndarray]:
        """Views of the vector's blocks of `span` values (the last may be shorter)."""
        for start in range(0, self.vector.size, span):
            yield self.vector[start : start + span]


def placed(values: Pieces, span: int) -> Iterator[tuple[int, np.ndarray]]:
    """Each piece of `values` (at most `span` long) with the coordinate it starts at.

    Raises:
        ConfigError: the pieces are not the `size` values `values` announces, in 1-D float32 or float64 pieces.
    """
    start = 0
    for piece in values.pieces(span):
        if start + piece.size > values.size or piece.ndim != 1 or piece.dtype not in FLOATS:
            raise ConfigError(
                f"the update's pieces are not {values.size} values in 1-D float pieces as it announces; "
                "encode the whole vector instead"
            )
        yield start, piece
        start += piece.size
    if start != values.size:
        raise ConfigError(
            f"the update's pieces hold {start} values, not the {values.size} it announces; "
            "encode the whole vector instead"
        )


def gathered(values: Pieces, span: int) -> np.ndarray:
    """The values of `values` in one vector of their type (what a noised encoding rotates, mixing them all)."""
    whole = np.empty(0)
    for start, piece in placed(values, span):
        if start == 0:
            whole = np.empty(values.size, dtype=piece.dtype)
        whole[start : start + piece.size] = piece
    return whole
