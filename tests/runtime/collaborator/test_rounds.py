"""The round job's bookkeeping: what a contribution keeps on disk, and what it lets go of in memory."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.collaborator import steps
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.collaborator.rounds import stored
from fedfair.runtime.contract import TRAINING
from tests.secagg.helpers import Harness, make_config


def test_a_secure_contribution_lets_its_vector_go_once_kept(tmp_path: Path) -> None:
    """Under secure aggregation the words are what is sent: the vector goes from memory once the record holds it
    with the unmasked words, and the round still counts as contributing; a plain one keeps its vector."""
    record = InputRecord(tmp_path / "site-1.fed.bindings.json", "fed", reset=True)
    vector, words = np.linspace(-1.0, 1.0, 6).astype(np.float32), np.arange(7, dtype=np.uint16)
    secure = stored(steps.Work(1, TRAINING, vector, 2.0, encoded=words), record.view(1, "train", "m1"))
    assert secure.vector is None and secure.released and secure.encoded is words
    answer = secure.view.stored
    assert answer is not None and answer.vector is not None and answer.encoded is not None
    assert np.array_equal(answer.vector, vector) and answer.encoded.tobytes() == words.tobytes()
    plain = stored(steps.Work(2, TRAINING, vector, 2.0), record.view(2, "train", "m2"))
    assert plain.vector is vector and not plain.released


def test_an_encoding_masked_already_is_not_masked_again() -> None:
    """A retried MASKED_INPUT stage finds neither words nor vector: it withdraws rather than encode anything anew."""
    secure: Any = SimpleNamespace(shared=SimpleNamespace(secure_aggregation=SimpleNamespace(enabled=True)))
    client = Harness(make_config(parties=3)).clients[1]
    work = steps.Work(1, TRAINING, None, 2.0, client=client, released=True)
    with pytest.raises(RefusedError, match="masked already") as refused:
        steps.masked(secure, work, b"")
    assert refused.value.reason is Refusal.WITHDRAWN
