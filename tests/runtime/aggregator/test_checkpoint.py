"""The checkpoint's digest: every changed byte is refused with a clear error, never resumed from."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
from pathlib import Path

import pytest
import torch

from fedfair.core import server
from fedfair.core.errors import ConfigError
from fedfair.runtime.output_folder import CHECKPOINT_NAME
from fedfair.runtime.aggregator.checkpoint import (
    DIGEST_PREFIX,
    Checkpoint,
    load_checkpoint,
    save_checkpoint,
    state_digest,
)

PLAN = "d" * 64


def saved(folder: Path) -> bytes:
    state = server.init(torch.linspace(-1.0, 1.0, 7, dtype=torch.float64), bound=10.0)
    save_checkpoint(folder, Checkpoint(4, state, PLAN, {"worst_risk": 0.5}, plan={"training": {"rounds": 9}}))
    return (folder / CHECKPOINT_NAME).read_bytes()


def test_every_flipped_bit_of_a_checkpoint_is_refused_by_its_digest(tmp_path: Path) -> None:
    """A flip in the zip's padding or headers changed nothing torch reads, and loaded silently before
    the digest; now each of the file's bytes, flipped, is refused (one bit at every position)."""
    data = saved(tmp_path)
    assert data.startswith(DIGEST_PREFIX) and load_checkpoint(tmp_path, PLAN).round == 4
    for position in range(len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 1 << (position % 8)
        (tmp_path / CHECKPOINT_NAME).write_bytes(bytes(flipped))
        with pytest.raises(ConfigError, match="restore it from a backup") as refused:
            load_checkpoint(tmp_path, PLAN)
        if position > len(DIGEST_PREFIX) + 64:  # past the digest line: the content no longer matches it
            assert "does not match its own SHA-256 digest" in str(refused.value)


def test_a_checkpoint_streams_exactly_what_torch_save_writes_under_its_digest(tmp_path: Path) -> None:
    """The state is streamed to disk past the hash rather than serialised whole in memory first: the file is
    still the digest line of the content, then the content torch.save writes to a buffer, byte for byte."""
    header, _, content = saved(tmp_path).partition(b"\n")
    assert header == DIGEST_PREFIX + hashlib.sha256(content).hexdigest().encode()
    buffered = io.BytesIO()
    torch.save(torch.load(io.BytesIO(content), weights_only=True), buffered)
    assert buffered.getvalue() == content


def test_a_checkpoint_from_before_digests_loads_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = saved(tmp_path)
    bare = data.partition(b"\n")[2]
    (tmp_path / CHECKPOINT_NAME).write_bytes(bare)
    with caplog.at_level(logging.WARNING, logger="fedfair.aggregator"):
        assert load_checkpoint(tmp_path, PLAN).round == 4
    assert "predates checkpoint digests" in caplog.text


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("round", 10**30, "field round must be a count"),
        ("round", -1, "field round must be a count"),
        ("evaluation", '{"worst_risk": 1e999}', "field evaluation: field worst_risk = 1e999 is out of range"),
        ("plan", "[" * 100_000 + "]" * 100_000, "field plan: nested 100000 levels deep"),
    ],
)
def test_an_odd_value_in_a_checkpoint_is_a_named_error(tmp_path: Path, field: str, value: object, named: str) -> None:
    """Values a digest does not vouch for (a checkpoint re-written whole, digest and all) are range-checked."""
    data = saved(tmp_path)
    payload = torch.load(io.BytesIO(data.partition(b"\n")[2]), weights_only=True)
    payload[field] = value
    (tmp_path / CHECKPOINT_NAME).unlink()
    bare = io.BytesIO()
    torch.save(payload, bare)
    (tmp_path / CHECKPOINT_NAME).write_bytes(bare.getvalue())
    with pytest.raises(ConfigError, match=f"checkpoint {tmp_path / CHECKPOINT_NAME}.*{named[:30]}") as refused:
        load_checkpoint(tmp_path, PLAN)
    assert named in str(refused.value) and len(str(refused.value)) < 600


def test_the_server_momentums_velocity_is_kept_so_a_resume_goes_on_with_it(tmp_path: Path) -> None:
    state = server.init(torch.linspace(-1.0, 1.0, 7, dtype=torch.float64), bound=10.0)
    moving = dataclasses.replace(state, velocity=torch.linspace(0.5, -0.5, 8, dtype=torch.float64))
    save_checkpoint(tmp_path, Checkpoint(2, moving, PLAN))
    loaded = load_checkpoint(tmp_path, PLAN).state
    assert loaded.velocity is not None and torch.equal(loaded.velocity, moving.velocity)
    assert state_digest(loaded) == state_digest(moving) != state_digest(state)
