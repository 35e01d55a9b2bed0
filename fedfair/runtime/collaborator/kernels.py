"""The compiled kernels a collaborator loads as it starts, rather than inside its first round's deadline."""

from __future__ import annotations

import numpy as np

from fedfair.runtime.plan.aggregator_plan import SharedSettings
from fedfair.runtime.plan.input_bound import prepare_verification
from fedfair.secagg import Encoder
from fedfair.secagg.prg import KEY_BYTES, apply_masks
from fedfair.secagg.verify import Challenge


def load_kernels(shared: SharedSettings, name: str) -> None:
    """Encode, tag and mask a one-value update once, then drop it, when the plan sums securely.

    numba and the compiled rounding and masking kernels load on first use: here, once the plan is fetched and before
    the task stream (under a [schema] too, whose data is encoded only at the first round), rather than inside the
    first round's deadline (about 45 MB and, on a first run, their compilation). Under the two-verifier input bound
    the proof's arithmetic too (:func:`~fedfair.runtime.plan.input_bound.prepare_verification`, which says so as site
    `name`). The noise kernels of distributed DP still load at the first noised round.
    """
    prepare_verification(shared.secure_aggregation, name)
    if not shared.secure_aggregation.enabled:
        return
    encoder = Encoder(shared.secure_aggregation.encoding(), shared.collaborator_count)
    values = np.zeros(1, dtype=np.float64 if shared.training.local.corrects_drift else np.float32)
    words = encoder.encode(values, 1.0)
    # The verified sum's challenge kernel too: a first tag compiled within the stage's grace came late.
    Challenge(bytes(KEY_BYTES), bytes(KEY_BYTES), words.size).dots(words)
    apply_masks(words, [(bytes(KEY_BYTES), 1), (bytes(KEY_BYTES), -1)])
