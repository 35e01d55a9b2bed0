"""README.md's deployment block is what `fedfair init` writes: its `init` line runs, and every later command
line of the block is, word for word, a line of the README.md that init writes, with every step of it shown.

The first walk found the two apart (a shared `certs/` against one per party, `declared` against `equal`
weights) and a manifest line without the flags the pin then needs; this holds them together.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pandas as pd
import pytest

from fedfair import cli
from fedfair.runtime.new_federation import README

ROOT = Path(__file__).resolve().parents[2]
STEPS = (
    "data check",
    "pki init",
    "pki request",
    "pki sign",
    "cp",
    "pki manifest",
    "plan pin",
    "aggregator start",
    "collaborator start",
    "plan renew",
)
"""Every kind of line init's README has; the deployment block shows each at least once."""


def command_lines(text: str, indent: str = "") -> list[list[str]]:
    """The command lines of `text` (those starting with `indent`; backslash continuations joined, comments
    dropped) as words, the program named `fedfair` whatever its path; only fedfair's, copies and moves."""
    joined = text.replace("\\\n", " ")
    found = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True) if line.startswith(indent) else []
        if words and words[0].endswith("fedfair"):
            found.append(["fedfair", *words[1:]])
        elif words and words[0] in ("cp", "mv"):
            found.append(words)
    return found


def deployment_block() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Deployment") :]
    block = section[section.index("```sh\n") + len("```sh\n") :]
    return command_lines(block[: block.index("```")])


def step(words: list[str]) -> str:
    return words[0] if words[0] in ("cp", "mv") else " ".join(words[1:3])


def test_the_readmes_deployment_block_is_what_init_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = deployment_block()
    init, later = lines[0], lines[1:]
    assert init[:2] == ["fedfair", "init"]
    monkeypatch.chdir(tmp_path)
    sample = init[init.index("--csv") + 1]
    label = init[init.index("--label") + 1]
    pd.DataFrame({"age": [30, 41, 52, 63], "ward": ["a", "b", "a", "b"], label: ["no", "yes", "no", "yes"]}).to_csv(
        sample, index=False
    )
    assert cli.main(init[1:]) == 0
    written = command_lines((tmp_path / init[2] / README).read_text(), "    ")
    for words in later:
        assert words in written, f"README.md's `{shlex.join(words)}` is not a line of the README init writes"
    assert set(STEPS) == {step(words) for words in written} - {"mv", "plan diff"}, "a new step: add it to STEPS"
    assert set(STEPS) <= {step(words) for words in later}, "README.md's deployment block leaves a step out"
