"""A stage is typed where it is declared: mypy refuses a step, an upload or a receive that does not fit the others.

`make types` holds the round's own declarations; this shows the check bites, on a SHARE stage whose step is
CHECK's and whose receive takes a share check, declared as SECURE_ROUND declares its stages, on kinds whose
stages or opening take another kind's server than the one the kind makes, and on kinds whose client takes other
arguments than every runner hands it (:class:`~fedfair.secagg.round.StartsParty`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

WRONG_STAGE = """
from fedfair.secagg.client import Client
from fedfair.secagg.messages import KeyDirectory, ShareKeys
from fedfair.secagg.round import StageSpec, small_upload
from fedfair.secagg.server import Server
from fedfair.secagg.wire import Stage

WRONG = StageSpec[Client, Server, KeyDirectory, ShareKeys](
    Stage.SHARE,
    "SHARE_KEYS",
    "encrypted shares",
    "evaluation encrypted shares",
    received=KeyDirectory.from_bytes,
    step=lambda client, directory, _own: client.check_shares(directory),
    upload=ShareKeys.from_bytes,
    receive=Server.receive_share_check,
    close=None,
    upload_bytes=small_upload,
    unready="no keys were advertised this round",
)
"""

WRONG_KINDS = """
from fedfair.secagg.bounded.server import BoundedServer
from fedfair.secagg.bounded.stages import SHARE_STAGE
from fedfair.secagg.masked_round import ADVERTISE_KEYS_STAGE, _claim as claim, _every_party as every_party
from fedfair.secagg.masked_round import _masked_client as masked_client, _masked_server as masked_server
from fedfair.secagg.round import SecureRound
from fedfair.secagg.wire import Stage

MIXED_STAGES = SecureRound(
    name="mixed-stages",
    sum_stages=(ADVERTISE_KEYS_STAGE, SHARE_STAGE),
    verify_stages=(),
    server=masked_server,
    client=masked_client,
    open_sum=every_party,
    open_verification=claim,
    contribution=Stage.MASK,
    committed=Stage.CONSISTENCY,
)

OTHER_OPENING = SecureRound(
    name="other-opening",
    sum_stages=(ADVERTISE_KEYS_STAGE,),
    verify_stages=(),
    server=masked_server,
    client=masked_client,
    open_sum=BoundedServer.open_shares,
    open_verification=claim,
    contribution=Stage.MASK,
    committed=Stage.CONSISTENCY,
)
"""

WRONG_CLIENT = """
from dataclasses import replace

from fedfair.secagg.bounded.peers import bounded_peer
from fedfair.secagg.client import Client
from fedfair.secagg.masked_round import SECURE_ROUND

CLIENTS_OWN_ARGUMENTS = replace(SECURE_ROUND, name="clients-own-arguments", client=Client)
ANOTHER_KINDS_ARGUMENTS = replace(SECURE_ROUND, name="another-kinds-arguments", client=bounded_peer)
"""


def mypy_says(module: Path, source: str) -> subprocess.CompletedProcess[str]:
    """mypy --strict's verdict on `source`, written to `module` (its cache beside it)."""
    module.write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(module.parent),
            str(module),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )


@pytest.mark.slow
def test_mypy_refuses_a_stage_whose_step_and_receive_do_not_fit_its_types(tmp_path: Path) -> None:
    checked = mypy_says(tmp_path / "wrong_stage.py", WRONG_STAGE)
    said = checked.stdout
    assert checked.returncode == 1, said
    assert 'Argument "step" to "StageSpec" has incompatible type' in said, said
    assert 'Argument 1 to "check_shares" of "Client" has incompatible type "KeyDirectory"' in said, said
    assert 'Argument "receive" to "StageSpec" has incompatible type "Callable[[Server, ShareCheck], None]"' in said, (
        said
    )


@pytest.mark.slow
def test_mypy_refuses_a_kind_whose_stages_or_opening_take_another_server(tmp_path: Path) -> None:
    checked = mypy_says(tmp_path / "wrong_kinds.py", WRONG_KINDS)
    said = checked.stdout
    assert checked.returncode == 1, said
    # A masked stage beside a bounded one: no one server takes both kinds' hooks.
    assert 'wrong_kinds.py:9: error: Cannot infer value of type parameter "_Server" of "SecureRound"' in said, said
    # The masked server made, the bounded sum's opening handed it.
    assert (
        'Argument "open_sum" to "SecureRound" has incompatible type "Callable[[BoundedServer], Opening]"; '
        'expected "Callable[[Server], Opening]"'
    ) in said, said
    assert "Found 2 errors in 1 file" in said, said


@pytest.mark.slow
def test_mypy_refuses_a_kind_whose_client_takes_other_arguments_than_the_runners_hand_it(tmp_path: Path) -> None:
    checked = mypy_says(tmp_path / "wrong_client.py", WRONG_CLIENT)
    said = checked.stdout
    assert checked.returncode == 1, said
    # The masked state machine's own constructor: it takes a verifier where every runner hands the round's setup.
    refused = 'error: Argument "client" to "replace" of "SecureRound" has incompatible type'
    assert f'wrong_client.py:8: {refused} "type[Client]"' in said, said
    # The bounded sum's peer as its own parameters make it, not as a runner starts a party.
    assert f"wrong_client.py:9: {refused}" in said, said
    assert "Found 2 errors in 1 file" in said, said
