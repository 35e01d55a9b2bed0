"""Issue 94's kept settlement outlives a round that is never decided for the site, and it alone is the update.

docs/security.md ("A framed site"): the file is kept "one round at a time, removed once it answered that round's
record"; kinds/bounded_settlement.py: the two shares together are the site's update. Only ``decide`` removes it
(``drop_settlement`` has one caller). A round the aggregator aborts after SHARE (a site lost below the floor, a
proof the auditor never sees, the aggregator's own restart), and a site never sent DECIDE (the docs: a restarted
process is not sent that round's DECIDE), never answer a record: the collaborator's handling of ACTION_ABORTED
(``TaskStream.handle``) only forgets its Work. The file stays on disk, in the clear, until the next bounded SHARE
replaces it, or for good after the federation's last bounded round; whoever reads the folder (a backup, a support
bundle, an operator) reads the exact encoded update, with no party's help.
"""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

import tests.runtime.test_bounded_round as round_module
from fedfair.runtime.collaborator.kinds.bounded_settlement import kept_round, settlement_path
from fedfair.runtime.collaborator.stream import TaskStream
from fedfair.runtime.transport import pb
from fedfair.runtime.transport.stage_gate import make_binding
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.shares import helper_expansion
from tests.runtime.test_bounded_restart import with_folders
from tests.runtime.test_bounded_round import Federation, bounded, run_round  # noqa: F401 (the fixture)
from tests.runtime.test_input_bound import federation  # noqa: F401 (the fixture)


class Aborted(Exception):
    """The aggregator abandons the round after SHARE: no DECIDE is sent."""


def test_an_aborted_rounds_settlement_is_removed_and_does_not_keep_the_update_on_disk(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_folders(bounded)
    encoded: dict[str, np.ndarray] = {}
    encode = round_module.bounded_encoding

    def recording(vector: Any, name: str, shared: Any) -> np.ndarray:
        encoded[name] = encode(vector, name, shared)
        return encoded[name]

    monkeypatch.setattr(round_module, "bounded_encoding", recording)

    def abort(record: bytes, server: object) -> bytes:
        raise Aborted

    with pytest.raises(Aborted):
        run_round(bounded, monkeypatch, record=abort)
    # Each site is then told the round aborted, and handles it as its process does.
    task = pb.Task(action=pb.ACTION_ABORTED, binding=make_binding(bounded.loaded.federation_id, 1, pb_stage()))
    for name, me in bounded.sites.items():
        stream = types.SimpleNamespace(
            _work=types.SimpleNamespace(round=1),
            config=types.SimpleNamespace(name=name),
            training=types.SimpleNamespace(last=lambda secure: None),
            shared=me.shared,
            _note_round=lambda *args, **kwargs: None,
        )
        assert TaskStream.handle(stream, None, task) is True  # type: ignore[arg-type]
        assert stream._work is None
    left = {}
    for name, me in bounded.sites.items():
        path = settlement_path(me)
        assert path is not None
        if path.exists():
            kept = kept_round(me)
            assert kept is not None
            share = kept.settlement.upload.share
            # The auditor's shares expand from the kept seed; only the sizes of the layout are read.
            sizes = types.SimpleNamespace(input_length=share.inputs.size, proof_length=share.values.size)
            helper_inputs, _ = helper_expansion(sizes, kept.settlement.helper_share.seed)  # type: ignore[arg-type]
            x = field.add(share.inputs, helper_inputs)[: encoded[name].size]
            left[name] = bool(np.array_equal(x, field.from_signed(encoded[name])))
    # Found: every site's file is left, and each decodes to that site's exact encoded update.
    assert left == {}, f"settlement files left after the aborted round, file alone == the update: {left}"


def pb_stage() -> Any:
    return round_module.BOUNDED_TRAINING.last(True)
