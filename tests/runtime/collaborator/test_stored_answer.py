"""An answer's kept bits on disk: its words read back a piece at a time, and only while they are the record's."""

from __future__ import annotations

import dataclasses
import weakref
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.collaborator import steps
from fedfair.runtime.collaborator.input_record import InputRecord
from fedfair.runtime.collaborator.stored_answer import StoredAnswer, answer_words, read_answer, write_answer
from fedfair.runtime.contract import TRAINING, RoundParameters
from fedfair.runtime.plan import aggregator_plan as plan
from tests.runtime.test_plan import aggregator_plan


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 40),
    span=st.integers(1, 9),
    dtype=st.sampled_from([np.uint16, np.uint32, np.uint64]),
    with_vector=st.booleans(),
)
def test_the_words_read_back_are_the_kept_ones_in_order_none_longer_than_asked(
    tmp_path_factory: pytest.TempPathFactory, size: int, span: int, dtype: type[np.unsignedinteger], with_vector: bool
) -> None:
    path = tmp_path_factory.mktemp("kept") / "site.fed.train.kept.npz"
    words = np.random.default_rng(size).integers(0, 2**16, size + 1).astype(dtype)
    digest = write_answer(path, StoredAnswer(np.linspace(0.0, 1.0, size) if with_vector else None, 2.5, words))
    pieces = list(answer_words(path, digest, span))
    assert all(0 < piece.size <= span and piece.dtype == words.dtype for piece in pieces)
    assert np.concatenate(pieces).tobytes() == words.tobytes()
    again = read_answer(path, digest)
    assert again is not None and again.encoded is not None and again.encoded.tobytes() == words.tobytes()


def test_words_changed_lost_or_of_another_answer_are_not_read(tmp_path: Path) -> None:
    """Tagging words other than those masked would fail the whole round's check: the site withdraws instead."""
    path = tmp_path / "site.fed.train.kept.npz"
    digest = write_answer(path, StoredAnswer(None, 1.0, np.arange(100, dtype=np.uint16)))
    changed = bytearray(path.read_bytes())
    changed[-3] ^= 1
    other = tmp_path / "other.npz"
    other.write_bytes(bytes(changed))
    for where, named in ((other, digest), (tmp_path / "lost.npz", digest), (path, "0" * 64)):
        with pytest.raises(RefusedError, match="changed or were lost") as refused:
            list(answer_words(where, named, 7))
        assert refused.value.reason is Refusal.WITHDRAWN


def test_a_secure_answer_kept_as_its_words_alone_counts_and_reads_back(tmp_path: Path) -> None:
    record = InputRecord(tmp_path / "site-1.fed.bindings.json", "fed", reset=True)
    view = record.view(1, "train", "m1")
    words = np.arange(11, dtype=np.uint32)
    view.keep(StoredAnswer(None, 2.0, words))
    assert record.trainings == 1
    assert np.concatenate(list(view.read_words(4))).tobytes() == words.tobytes()
    replaced = record.view(2, "train", "m2")
    replaced.keep(StoredAnswer(None, 2.0, words + 1))
    with pytest.raises(RefusedError, match="changed or were lost"):
        list(view.read_words(4))  # another answer of its kind is the one kept now
    assert np.concatenate(list(replaced.read_words(4))).tobytes() == (words + 1).tobytes()


def test_a_verified_rounds_client_reads_its_words_without_keeping_the_round_alive() -> None:
    """The client reads the words through its round's work; were that a strong reference, the work and its client
    would hold each other, and the claimed sum with them, until a garbage collection: a sum more per site."""
    shared = plan.load_shared_settings(plan.shared_settings(aggregator_plan()))
    roster, secure = ("hospital-a", "hospital-b", "hospital-c"), shared.secure_aggregation  # the template's
    me = steps.Participant(roster[0], shared, 10, ec.generate_private_key(ec.SECP256R1()), b"", lambda *_: None)
    work = steps.Work(2, TRAINING, None, 1.0)
    kind, dimension, encoding = me.expected(work)
    parameters = RoundParameters(kind, 2, True, roster, dimension, encoding, secure.security(3), graph_roster=roster)
    parameters = dataclasses.replace(
        parameters, graph_seed=parameters.implied_graph_seed(shared.federation_id, TRAINING)
    )
    steps.advertise(me, work, parameters.to_bytes())
    assert work.client is not None and TRAINING.claim is not None
    left = weakref.ref(work)
    del work
    assert left() is None  # let go at once, by its count of references alone
