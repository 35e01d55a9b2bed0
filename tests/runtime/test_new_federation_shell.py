"""The README `fedfair init` writes runs as written in a fresh shell: no checkout's .venv/bin on PATH, no
activation, only the README's own first line.

The first walk found its bare `fedfair` lines exiting 127 in a new terminal (the command lived in the
checkout's .venv, not on PATH). Here its lines run through `bash` with a PATH of the system's folders alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pandas as pd

from fedfair import cli
from fedfair.runtime.new_federation import README

SYSTEM_PATH = "/usr/bin:/bin"
"""A fresh shell's PATH before any profile: the system's folders, none of this installation's."""

SITES = ("north", "south")


def fresh_shell(script: str, folder: Path) -> subprocess.CompletedProcess[str]:
    """`script` run by bash in `folder` with a clean environment: the system PATH and HOME.

    PYTHONPATH passes through only so that a checkout run with it (a worktree) imports the code under test.
    """
    env = {"PATH": SYSTEM_PATH, "HOME": str(folder), "LANG": "C.UTF-8"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    bash = shutil.which("bash")
    assert bash is not None
    return subprocess.run(
        [bash, "--noprofile", "--norc", "-e", "-c", script],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def readme_lines(readme: Path) -> list[str]:
    """The README's command lines, in order (its code blocks are indented four spaces)."""
    return [line[4:] for line in readme.read_text().splitlines() if line.startswith("    ") and line.strip()]


def test_the_readmes_first_lines_run_in_a_fresh_shell(tmp_path: Path) -> None:
    sample = tmp_path / "sample.csv"
    rows = [
        (20 + i, ("ward-a", "ward-b")[i % 2], ("no", "yes")[i % 3 == 0]) for i in range(80)
    ]  # over the 68 a site needs for its batch
    pd.DataFrame(rows, columns=["age", "ward", "outcome"]).to_csv(sample, index=False)
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", ",".join(SITES), "--csv", str(sample), "--label", "outcome"]) == 0
    for site in SITES:  # each institution's table, where the README says to put it
        (folder / site / "data").mkdir()
        shutil.copy(sample, folder / site / "data" / "table.csv")
    lines = readme_lines(folder / README)
    # The cheap lines: the shell's set-up, every site's table check, the CA (no process, no network).
    through_ca = lines[: next(index for index, line in enumerate(lines) if line.startswith("fedfair pki init")) + 1]
    assert through_ca[0].startswith(("export PATH=", "fedfair() {")), through_ca[0]
    assert [line.split()[:3] for line in through_ca[1:]] == [["fedfair", "data", "check"]] * len(SITES) + [
        ["fedfair", "pki", "init"]
    ]
    ran = fresh_shell("\n".join(through_ca), folder)
    # bash -e: a line that is not found (127) or a table that does not fit (1) stops it there.
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert (folder / "ca" / "ca.crt").is_file()
    if shutil.which("fedfair", path=SYSTEM_PATH) is None:
        # Without its first line the same shell cannot find the command: what the README once left out.
        bare = fresh_shell(through_ca[-1].replace("--dir ca", "--dir ca-2"), folder)
        assert bare.returncode == 127, bare.stderr
