"""The examples run as a user runs them: a fresh interpreter, the script's own output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_the_custom_model_example_trains_and_protects_the_worst_group() -> None:
    # One thread: the example's tensors are small, and several torch processes sharing a few
    # cores each spinning up a thread pool slow every one of them down many times over.
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    finished = subprocess.run(
        [sys.executable, str(EXAMPLES / "custom_model.py"), "--quick"],
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr
    rows = {}
    for line in finished.stdout.splitlines():
        match = re.fullmatch(r"(FedSRCVaR|FedAvg) \(epsilon [\d.]+\)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line.strip())
        if match:
            rows[match.group(1)] = tuple(float(value) for value in match.group(2, 3, 4))
    assert set(rows) == {"FedSRCVaR", "FedAvg"}, finished.stdout
    for worst, mean, accuracy in rows.values():
        # Losses of a trained classifier: the worst fifth above the mean, better than chance (ln 2).
        assert 0.0 < mean < worst < 5.0 and mean < 0.693 and 0.75 < accuracy <= 1.0
    assert rows["FedSRCVaR"][0] < rows["FedAvg"][0], "RCVaR must lower the worst group's risk"
