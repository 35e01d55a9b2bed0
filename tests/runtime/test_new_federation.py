"""`fedfair init`: the folder it writes loads, its README's commands exist and work as written, and
every bad request is refused in one line that names the fix."""

from __future__ import annotations

import re
import shlex
import shutil
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from fedfair import cli
from fedfair.datasets.schema import draft_schema
from fedfair.datasets.tabular import read_table
from fedfair.runtime.collaborator.config import load_collaborator_config
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, shared_content
from fedfair.runtime.new_federation import README

SITES = ("hospital-a", "hospital-b", "hospital-c")


@pytest.fixture()
def sample(tmp_path: Path) -> Path:
    """A small table like an institution's: a number, a category and a label; 80 rows, enough for init's batch."""
    path = tmp_path / "sample.csv"
    rows = [(20 + i % 60, ("private", "public", "self")[i % 3], ("no", "yes")[i % 2]) for i in range(80)]
    pd.DataFrame(rows, columns=["age", "sector", "outcome"]).to_csv(path, index=False)
    return path


def init(*words: str) -> int:
    return cli.main(["init", *words])


def commands(readme: Path) -> list[list[str]]:
    """The README's command lines (those of fedfair, the copies and the moves), as words without the program's path."""
    found = []
    for line in readme.read_text().splitlines():
        words = shlex.split(line.strip()) if line.startswith("    ") else []
        if words and words[0] in ("fedfair", ".venv/bin/fedfair", "cp", "mv"):
            found.append(["fedfair", *words[1:]] if words[0] not in ("cp", "mv") else words)
    return found


def test_init_writes_a_plan_and_configs_that_load(tmp_path: Path) -> None:
    folder = tmp_path / "north"
    assert init(str(folder), "--sites", ",".join(SITES)) == 0
    plan = load_aggregator_plan(folder / "aggregator" / "plan.toml")
    assert (plan.federation_id, plan.collaborators, plan.schema) == ("north", SITES, None)
    assert plan.secure_aggregation.max_colluding == 1 and plan.aggregator.certs == folder / "aggregator" / "certs"
    for index, site in enumerate(SITES):
        config = load_collaborator_config(folder / site / "collaborator.toml")
        # The header's command names the file where init wrote it (run from the federation's folder).
        assert (
            f"fedfair collaborator start --config {site}/collaborator.toml"
            in (folder / site / "collaborator.toml").read_text()
        )
        assert (config.name, config.federation, config.data.dataset, config.data.index) == (
            site,
            "north",
            "adult",
            index,
        )
        assert config.certificates.key == folder / site / "certs" / f"{site}.key"
    assert sorted(path.name for path in folder.iterdir()) == sorted([README, "aggregator", *SITES])


def test_with_a_sample_the_plans_schema_is_the_draft_and_the_encoder_sizes_the_model(
    tmp_path: Path, sample: Path
) -> None:
    folder = tmp_path / "fed"
    assert init(str(folder), "--sites", "a,b", "--csv", str(sample), "--label", "outcome", "--federation", "f-1") == 0
    plan = load_aggregator_plan(folder / "aggregator" / "plan.toml")
    assert plan.schema == draft_schema(read_table(sample), "outcome")
    assert plan.secure_aggregation.max_colluding == 0  # two sites cannot leave two honest inputs beside a colluder
    text = (folder / "aggregator" / "plan.toml").read_text()
    assert "features" not in tomllib.loads(text)["model"] and "features" not in shared_content(plan)["model"]
    assert load_collaborator_config(folder / "b" / "collaborator.toml").data.csv == folder / "b" / "data" / "table.csv"


def test_the_readmes_commands_are_verbs_the_cli_has(tmp_path: Path, sample: Path) -> None:
    folder = tmp_path / "fed"
    assert init(str(folder), "--sites", ",".join(SITES), "--csv", str(sample), "--label", "outcome") == 0
    parser = cli.build_parser(cli.COMMAND_MODULES)
    lines = [words for words in commands(folder / README) if words[0] == "fedfair"]
    verbs = {" ".join(words[:3]) for words in lines}
    assert {"fedfair pki init", "fedfair pki request", "fedfair pki sign", "fedfair pki manifest"} <= verbs
    assert {"fedfair plan pin", "fedfair data check", "fedfair aggregator start", "fedfair collaborator start"} <= verbs
    for words in lines:
        try:
            parser.parse_args(words[1:])
        except SystemExit:
            pytest.fail(f"{README} names a command the CLI refuses: {shlex.join(words)}")


def test_the_readmes_steps_work_as_written(tmp_path: Path, sample: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the README's check, PKI, manifest and renewal commands in order, editing nothing by hand; the pinned
    plan (of the renewed federation, the README's last step) and every config then load."""
    folder = tmp_path / "fed"
    assert init(str(folder), "--sites", ",".join(SITES), "--csv", str(sample), "--label", "outcome") == 0
    monkeypatch.chdir(folder)
    for site in SITES:  # each institution's own table, where its config looks
        (folder / site / "data").mkdir()
        shutil.copy(sample, folder / site / "data" / "table.csv")
    for words in commands(folder / README):
        if words[0] == "cp":
            shutil.copy(words[1], words[2])
        elif words[0] == "mv":
            shutil.move(words[1], words[2])
        elif words[2] != "start":  # the processes themselves are the end-to-end tests' business
            assert cli.main(words[1:]) == 0, shlex.join(words)
    # No hand edit: `plan pin --config` named the manifest in the plan and in every config.
    plan = load_aggregator_plan(folder / "aggregator" / "plan.toml")
    assert plan.manifest is not None and plan.manifest.max_colluding == plan.secure_aggregation.max_colluding
    assert plan.federation_id == plan.manifest.federation_id == "fed-2"
    for site in SITES:
        assert load_collaborator_config(folder / site / "collaborator.toml").manifest == plan.manifest


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--sites", "hospital-a"], r"--sites names 1 institution\(s\); a federation needs at least 2"),
        (["--sites", "a,b,a"], r"--sites lists 'a' twice; name each institution once"),
        (["--sites", "a,Hospital_B"], r"--sites: invalid participant name 'Hospital_B'; use lower-case letters"),
        (["--sites", "a,aggregator"], r"'aggregator' is taken by the federation folder itself"),
        (["--sites", "a,b", "--max-colluding", "1"], r"--max-colluding 1 needs rounds of .* 3 sites but there are 2"),
        (["--sites", "a,b", "--csv", "t.csv"], r"--csv and --label go together"),
        (["--sites", "a,b", "--federation", "no spaces"], r"--federation: invalid federation id 'no spaces'"),
    ],
)
def test_bad_requests_are_refused_in_one_line_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], words: list[str], message: str
) -> None:
    folder = tmp_path / "fed"
    assert init(str(folder), *words) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("fedfair: error: ")
    assert re.search(message, error), error
    assert not folder.exists()


def test_a_folder_with_anything_in_it_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert init(str(tmp_path), "--sites", "a,b") == 2
    assert "exists and is not an empty folder; choose a new folder" in capsys.readouterr().err
    assert [path.name for path in tmp_path.iterdir()] == ["notes.txt"]


def test_init_offers_the_drafting_flags_it_names_and_leaves_id_columns_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`init --csv` says "pass --learn-categories, or leave it out with --features": both are its flags;
    an ID-like column is left out of the draft, and the README checks every table before the pin."""
    path = tmp_path / "wide.csv"
    rows = 120  # more distinct notes than a category list may have (MAX_CATEGORIES)
    pd.DataFrame(
        {
            "patient_id": [f"P{i:04d}" for i in range(rows)],
            "age": [20 + i % 40 for i in range(rows)],
            "note": [f"free text {i}" for i in range(rows)],
            "outcome": [("no", "yes")[i % 2] for i in range(rows)],
        }
    ).to_csv(path, index=False)
    refused = tmp_path / "refused"
    assert init(str(refused), "--sites", "a,b", "--csv", str(path), "--label", "outcome", "--features", "age,note") == 2
    assert "pass --learn-categories, or leave it out with --features" in capsys.readouterr().err
    folder = tmp_path / "fed"
    assert init(str(folder), "--sites", "a,b", "--csv", str(path), "--label", "outcome", "--features", "age") == 0
    chosen = load_aggregator_plan(folder / "aggregator" / "plan.toml").schema
    assert chosen is not None and [column.name for column in chosen.columns] == ["age"]
    learnt = tmp_path / "learnt"
    assert init(str(learnt), "--sites", "a,b", "--csv", str(path), "--label", "outcome", "--learn-categories") == 0
    plan_text = (learnt / "aggregator" / "plan.toml").read_text()
    assert "# Left out as ID-like: patient_id (named like an identifier), note (all 120 values distinct)" in plan_text
    schema = load_aggregator_plan(learnt / "aggregator" / "plan.toml").schema
    assert schema is not None and [column.name for column in schema.columns] == ["age"]
    readme = (learnt / README).read_text()
    assert readme.index("fedfair data check --plan aggregator/plan.toml") < readme.index("fedfair plan pin")
