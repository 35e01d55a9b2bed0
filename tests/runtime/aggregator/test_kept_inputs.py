"""Above RESUMMED_WORDS the aggregator keeps the masked inputs in unlinked files, for a tag set that may need them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedfair.runtime.aggregator.kept_inputs import in_file, kept_in_files
from fedfair.secagg import config as config_module
from fedfair.secagg.messages import MaskedInput
from tests.secagg.helpers import Harness, make_config


def test_every_input_kept_for_a_tag_set_alone_goes_to_a_file(monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(4, modulus_bits=16, dimension=999)  # 4 x 1000 words of 2 bytes: 8000 bytes
    assert config.resummed and not kept_in_files(config)  # below the bound the claim carries them: memory
    monkeypatch.setattr(config_module, "RESUMMED_WORDS", 0)
    assert kept_in_files(config)  # above it, however small: the aggregator never holds n (d + 1) words
    assert not kept_in_files(make_config(6, modulus_bits=16, dimension=999, neighbours=3, threshold=3))  # none kept
    # ... unless sites re-check each other's inputs (the plan allows a colluder): every graph keeps them.
    assert kept_in_files(make_config(6, modulus_bits=16, dimension=999, neighbours=3, threshold=4, max_colluding=1))


def test_a_missing_tag_is_re_summed_from_inputs_kept_in_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "RESUMMED_WORDS", 0)
    harness = Harness(make_config(4, modulus_bits=16, max_colluding=1), verified=True)
    masking = harness.through_check()
    parse = in_file(MaskedInput.from_bytes, tmp_path)
    for party in range(1, 5):
        sent = harness.clients[party].masked_input(masking, harness.encoded[party].copy())
        kept = parse(sent.to_bytes())
        assert isinstance(kept.vector, np.memmap) and not kept.vector.flags.writeable
        np.testing.assert_array_equal(kept.vector, sent.vector)
        harness.server.receive_masked_input(kept)
    assert list(tmp_path.iterdir()) == []  # unlinked as soon as made
    harness.sign(harness.server.survivor_set())
    harness.unmask(harness.server.unmask_request())
    harness.server.finish()
    claims = harness.server.claims()  # re-checked (max_colluding = 1): each claim holds its peers' inputs, mapped
    assert all(isinstance(vector, np.memmap) for claim in claims.values() for vector in claim.inputs)
    for party in (1, 2, 3):
        harness.server.receive_tag(harness.clients[party].tag(claims[party]))
    tag_set = harness.server.tag_set()
    assert len(tag_set.inputs) == 4 and all(isinstance(vector, np.memmap) for vector in tag_set.inputs)
    expected = sum((harness.encoded[party] for party in range(1, 5)), np.zeros_like(harness.encoded[1]))
    for party in (1, 2, 3):
        np.testing.assert_array_equal(
            harness.clients[party].verify(type(tag_set).from_bytes(tag_set.to_bytes())), expected
        )
