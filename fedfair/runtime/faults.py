"""Test-only fault injection: make a runtime process die like ``kill -9`` (or freeze) at a precise point, or a site lie.

The fault tests need a collaborator to die exactly before (or right after) it uploads a
given stage of a given round, and the aggregator to die in the middle of any stage of a round or
right after a round's checkpoint. Killing from outside cannot hit those points
reliably, so the processes read one environment variable, ``FEDFAIR_TEST_FAULT``,
which only the runtime tests set; a site lies in every bounded sum where ``FEDFAIR_TEST_LIAR`` names a factor
(:func:`lying`). The points::

Why: docs/design.md, "Inside the runtime's shared modules".
"""

from __future__ import annotations

import math
import os
import signal
import threading

import numpy as np

from fedfair.secagg.bounded.layout import Layout
from fedfair.secagg.bounded.shares import Witness

VARIABLE = "FEDFAIR_TEST_FAULT"

LIAR_VARIABLE = "FEDFAIR_TEST_LIAR"
"""``FEDFAIR_TEST_LIAR=FACTOR``: this site lies in every bounded sum, its update FACTOR times its bound."""


FREEZE = "freeze:"
"""A FEDFAIR_TEST_FAULT of this prefix and a point stops the process there (SIGSTOP, as ``kill -STOP`` does) rather
than killing it: a frozen party whose connections stay open, until a SIGCONT lets it go on from that point. It
freezes once: a point that many threads reach (each upload of a stage) would stop it again after the SIGCONT."""

_FREEZING = threading.Lock()


def maybe_die(point: str, round_number: int, stage: str = "") -> None:
    """Die with SIGKILL if FEDFAIR_TEST_FAULT names this point, round (and stage); freeze if it names it after FREEZE."""
    wanted = os.environ.get(VARIABLE)
    if not wanted:
        return
    here = f"{point}:{round_number}" + (f":{stage}" if stage else "")
    if wanted == here:
        os.kill(os.getpid(), signal.SIGKILL)
    elif wanted == FREEZE + here:
        with _FREEZING:
            first = os.environ.pop(VARIABLE, None) is not None
        if first:
            os.kill(os.getpid(), signal.SIGSTOP)


def lying(encoded: np.ndarray, bound_sq: int) -> tuple[np.ndarray, Witness | None]:
    """The update a site sends in a bounded sum, and the witness it proves it with (None: the honest one).

    Where FEDFAIR_TEST_LIAR names a factor, the update is scaled to that factor times the bound (B = sqrt(bound_sq),
    the encoded scale; a zero update points along every coordinate) and proven with :func:`lying_witness`.
    """
    wanted = os.environ.get(LIAR_VARIABLE)
    if not wanted:
        return encoded, None
    direction = encoded.astype(np.float64) if np.any(encoded) else np.ones(encoded.size)
    scale = float(wanted) * math.sqrt(bound_sq) / float(np.linalg.norm(direction))
    return np.round(direction * scale).astype(np.int64), lying_witness


def lying_witness(layout: Layout, x: np.ndarray, projections: np.ndarray) -> np.ndarray:
    """What a liar can claim: the true values, cut to the bits the layout has (a negative slack wraps)."""
    values = [layout.bound_sq - sum(int(v) ** 2 for v in x), *(int(v) + layout.test_offset for v in projections)]
    widths = [layout.norm_bits] + [layout.test_bits] * layout.tests
    return np.array([(value >> bit) & 1 for value, width in zip(values, widths) for bit in range(width)], np.uint64)
