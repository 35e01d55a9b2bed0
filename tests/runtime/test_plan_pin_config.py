"""`fedfair plan pin --config FILE ...` names the new manifest in the plan and the collaborator configs it is
given, so a rehearsal needs no hand edit; a file it cannot edit is refused before anything is written."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from fedfair import cli
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.new_federation import README
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.pinning import set_value

SITES = ("north", "south")


@pytest.fixture()
def rostered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A federation folder from `fedfair init`, run through its README up to the roster (before the pin)."""
    folder = tmp_path / "fed"
    assert cli.main(["init", str(folder), "--sites", ",".join(SITES)]) == 0
    monkeypatch.chdir(folder)
    for line in (folder / README).read_text().splitlines():
        words = shlex.split(line) if line.startswith("    fedfair pki ") or line.startswith("    cp ") else []
        if words and words[0] == "cp":
            Path(words[2], Path(words[1]).name).write_bytes(Path(words[1]).read_bytes())
        elif words:
            assert cli.main(words[1:]) == 0, line
    assert (folder / "roster.toml").is_file()
    return folder


def configs(folder: Path) -> list[Path]:
    return [folder / "aggregator" / "plan.toml", *(folder / site / "collaborator.toml" for site in SITES)]


def test_pin_names_the_manifest_in_every_file_given_relative_to_its_folder(rostered: Path) -> None:
    files = configs(rostered)
    before = {path: path.read_text() for path in files}
    # A manifest kept in its own folder: each file names it from where it sits.
    (rostered / "agreed").mkdir()
    out = rostered / "agreed" / "manifest.toml"
    words = ["plan", "pin", "--plan", "aggregator/plan.toml", "--manifest", "roster.toml", "--out", str(out)]
    assert cli.main([*words, *(f"--config={path.relative_to(rostered)}" for path in files)]) == 0
    plan = load_aggregator_plan(files[0])  # held to the manifest it now names
    assert plan.manifest is not None and plan.manifest.source == out.resolve()
    for path in files:
        text = path.read_text()
        assert 'manifest = "../agreed/manifest.toml"' in text.splitlines()
        assert "# manifest = " not in text  # the template's example became the setting, in its place
        # Nothing else changed: the file is the template with that one line set.
        assert text == before[path].replace('# manifest = "../manifest.toml"', 'manifest = "../agreed/manifest.toml"')
    for site in SITES:
        assert load_collaborator_config(rostered / site / "collaborator.toml").manifest == plan.manifest


def test_a_file_pin_cannot_edit_is_refused_before_anything_is_written(
    rostered: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = configs(rostered)
    before = {path: path.read_text() for path in files}
    stray = rostered / "notes.toml"
    stray.write_text('[other]\nkey = "value"\n')
    words = ["plan", "pin", "--plan", "aggregator/plan.toml", "--manifest", "roster.toml", "--out", "manifest.toml"]
    capsys.readouterr()
    assert cli.main([*words, "--config", str(files[1]), "--config", "notes.toml"]) != 0
    error = capsys.readouterr().err
    assert "--config notes.toml has no [collaborator], [aggregator] or [auditor] table" in error
    assert not (rostered / "manifest.toml").exists()
    assert {path: path.read_text() for path in files} == before


def test_set_value_replaces_a_setting_then_an_example_then_adds_the_key() -> None:
    source = Path("c.toml")
    active = '[collaborator]\nmanifest = "old.toml"  # kept comment\n# manifest = "example.toml"\n'
    assert set_value(active, "collaborator", "manifest", '"new.toml"', source) == (
        '[collaborator]\nmanifest = "new.toml"  # kept comment\n# manifest = "example.toml"\n'
    )
    example = '[collaborator]\nname = "a"\n# manifest = "../manifest.toml"\n[data]\n# manifest = "x"\n'
    assert set_value(example, "collaborator", "manifest", '"m.toml"', source) == (
        '[collaborator]\nname = "a"\nmanifest = "m.toml"\n[data]\n# manifest = "x"\n'
    )
    # Another table's example is not this table's: the key goes under the header.
    elsewhere = '[collaborator]\nname = "a"\n[data]\n# manifest = "x"\n'
    assert set_value(elsewhere, "collaborator", "manifest", '"m.toml"', source) == (
        '[collaborator]\nmanifest = "m.toml"\nname = "a"\n[data]\n# manifest = "x"\n'
    )
