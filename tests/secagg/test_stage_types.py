"""A stage is typed where it is declared: mypy refuses a step, an upload or a receive that does not fit the others.

`make types` holds the round's own declarations; this shows the check bites, on a SHARE stage whose step is
CHECK's and whose receive takes a share check, declared as SECURE_ROUND declares its stages.
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


@pytest.mark.slow
def test_mypy_refuses_a_stage_whose_step_and_receive_do_not_fit_its_types(tmp_path: Path) -> None:
    module = tmp_path / "wrong_stage.py"
    module.write_text(WRONG_STAGE)
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--follow-imports=silent",
            "--cache-dir",
            str(tmp_path),
            str(module),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    said = checked.stdout
    assert checked.returncode == 1, said
    assert 'Argument "step" to "StageSpec" has incompatible type' in said, said
    assert 'Argument 1 to "check_shares" of "Client" has incompatible type "KeyDirectory"' in said, said
    assert 'Argument "receive" to "StageSpec" has incompatible type "Callable[[Server, ShareCheck], None]"' in said, (
        said
    )
