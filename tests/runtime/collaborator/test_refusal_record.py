"""A refused sum stays in the collaborator's outcome record, across restarts, and refuses every output model."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from fedfair.runtime.collaborator.outcome import OutcomeRecord, Refusal


def test_a_refusal_is_kept_first_come_and_refuses_the_output_model(tmp_path: Path) -> None:
    path = tmp_path / "site-a.fed.outcome.npz"
    record = OutcomeRecord(path, 0)
    record.training_model(1, np.zeros(3, dtype=np.float32), 1.0)
    record.output_model(1, np.zeros(3, dtype=np.float32), 1.0)
    assert record.refusal is None and record.output_mismatch() is None  # the honest average of one model

    record.refused(2, "FORGED", "the tags of site-a, site-b do not sum to the claimed aggregate's")
    record.refused(3, "BAD_TAG", "a later refusal does not replace the first")
    again = OutcomeRecord(path, 0)  # a restarted process reads it back
    assert again.refusal == Refusal(2, "FORGED", "the tags of site-a, site-b do not sum to the claimed aggregate's")
    mismatch = again.output_mismatch()
    assert mismatch is not None and "refused round 2's sum (FORGED)" in mismatch
