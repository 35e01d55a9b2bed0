"""A real `fedfair launch` trains its sites on the GPU when one is present (device "auto")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.gpu_helpers import GPU_ONLY

pytestmark = [*GPU_ONLY, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]


def test_launch_trains_every_site_on_the_gpu(tmp_path: Path) -> None:
    """Every collaborator of the demo's federation logs device cuda, and the run ends with its comparison."""
    workdir = tmp_path / "federation"
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "fedfair.cli", "launch", "--collaborators", "3", "--rounds", "3"]
    done = subprocess.run(
        [*command, "--workdir", str(workdir), "--keep"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    logs = sorted((workdir / "logs").glob("*.log"))
    sites = [log for log in logs if log.name != "aggregator.log"]
    assert len(sites) == 3, [log.name for log in logs]
    for log in sites:
        text = log.read_text()
        assert "device cuda" in text, f"{log.name} did not train on the GPU:\n{text[-2000:]}"
    assert "FedAvg" in done.stdout, done.stdout[-2000:]
