"""A bounded round's kept settlement (issue 94) goes once the round ends for the site, DECIDE answered or not.

The two shares in the file are the site's exact encoded update, readable with no party's help, so a round the
aggregator aborts after SHARE (a site lost below the floor, a timeout, its own restart), a later round, and a
restarted process at another round than the kept one each remove it (kinds/bounded_settlement.py ``drop_settlement``);
the red team found it left after an aborted round (FINDINGS.md F2).
"""

from __future__ import annotations

import stat
import types
from typing import Any

import numpy as np
import pytest

import tests.runtime.test_bounded_round as round_module
from fedfair.core.errors import Refusal, RefusedError
from fedfair.runtime.collaborator.kinds.bounded_settlement import kept_round, settlement_path
from fedfair.runtime.collaborator.stream import TaskStream
from fedfair.runtime.contract import EVALUATION, Aggregations
from fedfair.runtime.transport import pb
from fedfair.runtime.transport.stage_gate import make_binding
from fedfair.secagg.bounded import field
from fedfair.secagg.bounded.shares import helper_expansion
from tests.runtime.test_bounded_restart import with_folders
from tests.runtime.test_bounded_round import Federation, bounded, run_round  # noqa: F401 (the fixture)
from tests.runtime.test_input_bound import federation  # noqa: F401 (the fixture)
from tests.runtime.wire_stages import BOUNDED_TRAINING, WIRE


class Aborted(Exception):
    """The aggregator abandons the round after SHARE: no DECIDE is sent."""


def aborted_after_share(bounded: Federation, monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:  # noqa: F811
    """Run round 1 to SHARE and abandon it there; each site's exact encoded update, whose settlement is kept."""
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
    for me in bounded.sites.values():
        kept = kept_round(me)
        assert kept is not None and kept.round == 1, "kept at SHARE, before the parts left"
    return encoded


def test_an_aborted_rounds_settlement_is_removed_and_does_not_keep_the_update_on_disk(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    encoded = aborted_after_share(bounded, monkeypatch)
    # Each site is then told the round aborted, and handles it as its process does.
    task = pb.Task(action=pb.ACTION_ABORTED, binding=make_binding(bounded.loaded.federation_id, 1, pb_stage()))
    for name, me in bounded.sites.items():
        stream = types.SimpleNamespace(
            _work=types.SimpleNamespace(round=1),
            config=types.SimpleNamespace(name=name),
            training=types.SimpleNamespace(last=lambda secure: None),
            shared=me.shared,
            _note_round=lambda *args, **kwargs: None,
            participant=me,
        )
        stream._end_round = types.MethodType(TaskStream._end_round, stream)
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
    # Before the fix every site's file was left, and each decoded to that site's exact encoded update.
    assert left == {}, f"settlement files left after the aborted round, file alone == the update: {left}"


def test_a_settlement_readable_by_others_is_refused_naming_its_mode_and_the_fix(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It holds the site's exact update: loosened (a backup restored, a copy by hand), it is not taken up."""
    aborted_after_share(bounded, monkeypatch)
    me = next(iter(bounded.sites.values()))
    path = settlement_path(me)
    assert path is not None and stat.S_IMODE(path.stat().st_mode) == 0o600  # as written
    path.chmod(0o640)
    with pytest.raises(RefusedError) as refused:
        kept_round(me)
    assert refused.value.reason is Refusal.WITHDRAWN
    assert str(path) in str(refused.value) and "0640" in str(refused.value) and "chmod 600" in str(refused.value)
    path.chmod(0o600)
    kept = kept_round(me)
    assert kept is not None and kept.round == 1


def test_a_restarted_process_keeps_its_settlement_only_while_the_federation_is_at_the_kept_round(
    bounded: Federation,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    aborted_after_share(bounded, monkeypatch)
    sent: list[bytes] = []
    for name, me in bounded.sites.items():
        # A restarted process: no Work, so every stage task but a rejoinable one (DECIDE, which it would take up from
        # the file) is sat out with an empty upload.
        stream = types.SimpleNamespace(
            _work=None,
            participant=me,
            submit=lambda stub, binding, data: sent.append(data),
            aggregations=Aggregations(BOUNDED_TRAINING, EVALUATION),
        )
        stream._taken_up = types.MethodType(TaskStream._taken_up, stream)
        for round_number, kept in ((1, True), (2, False)):
            task = pb.Task(
                binding=make_binding(bounded.loaded.federation_id, round_number, WIRE["STAGE_BOUNDED_VERIFY"])
            )
            TaskStream.step(stream, None, task)  # type: ignore[arg-type]
            path = settlement_path(me)
            assert path is not None and path.exists() is kept, (name, round_number)
    assert sent == [b""] * 2 * len(bounded.sites)


def pb_stage() -> Any:
    return round_module.BOUNDED_TRAINING.last(True)
