"""One aggregator per output folder: the lock refuses a second owner at once, naming the first."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.runtime.output_folder import LOCK_NAME
from fedfair.runtime.aggregator.lock import output_lock
from tests.runtime.harness import lock_attempts


def test_a_second_owner_in_this_process_is_refused_at_once_naming_the_pid(tmp_path: Path) -> None:
    folder = tmp_path / "output"
    with output_lock(folder) as path:
        assert path == folder / LOCK_NAME and path.read_text() == f"{os.getpid()}\n"
        with lock_attempts() as attempts, pytest.raises(ConfigError) as refused, output_lock(folder):
            pass
        assert attempts == [fcntl.LOCK_EX | fcntl.LOCK_NB]  # one try, never a wait for the holder
    assert str(refused.value) == (
        f"another aggregator (PID {os.getpid()}) is running on {folder} (lock {folder / LOCK_NAME}); "
        "stop it first, or give this one another output folder (--output)"
    )
    with output_lock(folder):  # released with its holder: the next owner gets it
        pass


def test_a_second_process_is_refused_while_the_first_holds_the_folder(tmp_path: Path) -> None:
    script = (
        "import sys; from pathlib import Path; from fedfair.runtime.aggregator.lock import output_lock\n"
        "try:\n    output_lock(Path(sys.argv[1])).__enter__()\nexcept Exception as e:\n    print(e); sys.exit(2)\n"
    )
    with output_lock(tmp_path):
        second = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)], check=False, capture_output=True, text=True, timeout=60
        )
    assert second.returncode == 2, second.stderr
    assert f"another aggregator (PID {os.getpid()}) is running on {tmp_path}" in second.stdout
    # The kernel dropped the lock when its holder let go: a later process takes it.
    assert subprocess.run([sys.executable, "-c", script, str(tmp_path)], check=False, timeout=60).returncode == 0
