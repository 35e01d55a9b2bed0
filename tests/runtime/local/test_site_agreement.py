"""Sites agree before round 1, through the real `fedfair launch --csv` and a collaborator's start-up.

The tables are Adult rows (three clinics of 200, 150 and 120) with the label as 0/1 in column `y`;
one clinic's table is then changed the way a real export differs: its label written no/yes, a column
left empty, a single outcome. Every refusal comes before any process starts, so these run in seconds.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.core.errors import ConfigError, PermanentFailureError
from fedfair.runtime.collaborator.client import Collaborator
from fedfair.runtime.collaborator.config import load_collaborator_config, parse_collaborator_config
from fedfair.pki.roster import canonical_json
from fedfair.runtime.collaborator.trainer import check_schema_table, read_local_data
from fedfair.runtime.local.rehearsal import rehearsal_workspace
from fedfair.runtime.plan.aggregator_plan import load_shared_settings
from tests.federations import adult_raw_table
from tests.runtime.harness import thread_federation

ROOT = Path(__file__).resolve().parents[3]
SIZES = {"north-clinic": 200, "south-clinic": 150, "east-clinic": 120}


@pytest.fixture(scope="module")
def clinics() -> dict[str, pd.DataFrame]:
    """Three clinics' disjoint Adult rows, the label `y` coded 0/1."""
    table = adult_raw_table().sample(frac=1.0, random_state=11)
    table["y"] = (table.pop("income") == ">50K").astype(int)
    tables, start = {}, 0
    for name, rows in SIZES.items():
        tables[name] = table.iloc[start : start + rows].reset_index(drop=True)
        start += rows
    return tables


def written(folder: Path, tables: dict[str, pd.DataFrame]) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, table in tables.items():
        paths.append(folder / f"{name}.csv")
        table.to_csv(paths[-1], index=False)
    return paths


def with_east(clinics: dict[str, pd.DataFrame], east: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {**clinics, "east-clinic": east}


def yes_no(table: pd.DataFrame) -> pd.DataFrame:
    return table.assign(y=table["y"].map({1: "yes", 0: "no"}))


def launch(tmp_path: Path, tables: list[Path], *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "fedfair.cli", "launch", "--csv", *map(str, tables), "--label", "y",
               "--workdir", str(tmp_path / "federation"), *flags]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


def test_launch_refuses_a_site_coding_the_label_yes_no_naming_it_and_the_mapping(
    tmp_path: Path, clinics: dict[str, pd.DataFrame]
) -> None:
    tables = written(tmp_path / "tables", with_east(clinics, yes_no(clinics["east-clinic"])))
    result = launch(tmp_path, tables)
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        'east-clinic (east-clinic.csv) writes \'y\' as "no", "yes" where north-clinic (north-clinic.csv), '
        'south-clinic (south-clinic.csv) write "0", "1": recode the cells of east-clinic (east-clinic.csv), '
        '"no" -> "0", "yes" -> "1"' in result.stderr
    )
    assert '[data.recode] y = { no = "0", yes = "1" }' in result.stderr
    assert not (tmp_path / "federation").exists(), "refused before anything is drafted or written"


def test_launch_refuses_a_column_empty_at_one_site_before_any_process_starts(
    tmp_path: Path, clinics: dict[str, pd.DataFrame]
) -> None:
    east = clinics["east-clinic"].assign(**{"hours-per-week": np.nan})
    result = launch(tmp_path, written(tmp_path / "tables", with_east(clinics, east)))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "east-clinic's table does not fit the drafted [schema]" in result.stderr
    assert "column 'hours-per-week' is empty in all 120 rows" in result.stderr
    # The schema fix names the plan launch writes unedited, so the refusal says where it can be applied.
    assert "run `fedfair init DIR --csv TABLE --label LABEL`, edit DIR/aggregator/plan.toml" in result.stderr
    assert not (tmp_path / "federation" / "logs").exists() and not (tmp_path / "federation" / "ca").exists()


def test_launch_refuses_a_site_too_small_for_its_batch(tmp_path: Path, clinics: dict[str, pd.DataFrame]) -> None:
    result = launch(tmp_path, written(tmp_path / "tables", with_east(clinics, clinics["east-clinic"].iloc[:5])))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "east-clinic's table does not fit" in result.stderr
    assert "4 training rows are too few for the plan's batch" in result.stderr


def test_a_one_class_site_is_warned_of_before_the_federation_is_set_up(
    tmp_path: Path, clinics: dict[str, pd.DataFrame], capsys: pytest.CaptureFixture[str]
) -> None:
    east = clinics["east-clinic"].assign(y=0)
    rehearsal_workspace(tmp_path / "federation", written(tmp_path / "tables", with_east(clinics, east)), "y")
    err = capsys.readouterr().err
    assert err.startswith("fedfair launch: warning: east-clinic (east-clinic.csv): label 'y' holds only the class")
    assert err.count("warning") == 1


def test_a_collaborator_keeps_its_own_one_class_warning_and_a_re_read_says_none(
    tmp_path: Path, clinics: dict[str, pd.DataFrame], caplog: pytest.LogCaptureFixture
) -> None:
    """A deployed collaborator logs the warning once, before dialing; launch's baseline re-reads the table silently."""
    tables = with_east(clinics, clinics["east-clinic"].assign(y=0))
    workspace = rehearsal_workspace(tmp_path / "federation", written(tmp_path / "tables", tables), "y")
    config = load_collaborator_config(workspace.configs["east-clinic"])
    with caplog.at_level(logging.WARNING):
        Collaborator(config)
    said = [record.getMessage() for record in caplog.records if "holds only the class" in record.getMessage()]
    assert len(said) == 1 and said[0].startswith("east-clinic: ")
    caplog.clear()
    assert config.manifest is not None and config.manifest.plan is not None  # launch pins its plan
    shared = load_shared_settings(canonical_json(config.manifest.plan.settings), source="the pinned plan")
    with caplog.at_level(logging.WARNING):
        check_schema_table(config, shared, read_local_data(config))
    assert not [record for record in caplog.records if "holds only the class" in record.getMessage()]


@pytest.mark.slow
def test_a_rehearsal_with_a_one_class_site_warns_and_runs(
    tmp_path: Path, clinics: dict[str, pd.DataFrame], capsys: pytest.CaptureFixture[str]
) -> None:
    """The warning is all: the site whose label holds one class trains and evaluates with the others to the end.

    Launch's own workspace (`rehearsal_workspace`, which says the warning), its parties in threads of the test
    (the real gRPC server over loopback mutual TLS, real `Collaborator`s): `launch --csv` as processes is
    tests/runtime/local/test_rehearsal.py's."""
    tables = with_east(clinics, clinics["east-clinic"].assign(y=0))
    workspace = rehearsal_workspace(tmp_path / "federation", written(tmp_path / "tables", tables), "y", rounds=1)
    assert "warning: east-clinic (east-clinic.csv): label 'y' holds only the class \"0\" (120 rows)" in (
        capsys.readouterr().err
    )
    with thread_federation(workspace) as federation:
        federation.join()
    assert not federation.errors, federation.errors
    assert federation.exits == dict.fromkeys(tables, 0) and federation.summary["aborted_rounds"] == 0


def test_a_collaborator_maps_its_coding_when_its_config_says_how(
    tmp_path: Path, clinics: dict[str, pd.DataFrame], caplog: pytest.LogCaptureFixture
) -> None:
    """East's own table writes no/yes; without [data.recode] it stops before dialing, with it, it starts."""
    workspace = rehearsal_workspace(tmp_path / "federation", written(tmp_path / "tables", clinics), "y")
    table = tmp_path / "east-export.csv"
    yes_no(clinics["east-clinic"]).to_csv(table, index=False)
    path = workspace.configs["east-clinic"]
    original = path.read_text()
    path.write_text(original.replace('csv = "data/table.csv"', f'csv = "{table}"'))
    with pytest.raises(PermanentFailureError) as stopped:
        Collaborator(load_collaborator_config(path))
    message = str(stopped.value)
    assert message.startswith("data-mismatch: ") and "label column 'y' writes 'no', 'yes'" in message
    assert '[data.recode] y = { no = "0", yes = "1" }' in message

    path.write_text(
        original.replace('csv = "data/table.csv"', f'csv = "{table}"\nrecode = {{ y = {{ no = "0", yes = "1" }} }}')
    )
    config = load_collaborator_config(path)
    assert config.data.recode == {"y": {"no": "0", "yes": "1"}}
    read = read_local_data(config).raw
    assert read is not None and read["y"].tolist() == clinics["east-clinic"]["y"].astype(str).tolist()
    with caplog.at_level(logging.WARNING, logger="fedfair"):
        Collaborator(config)  # checks the mapped table against the pinned [schema]; dials nobody
    assert not [record for record in caplog.records if "holds only the class" in record.getMessage()]


def test_a_collaborator_warns_of_one_class_once_and_refuses_a_site_too_small_for_its_batch(
    tmp_path: Path, clinics: dict[str, pd.DataFrame], caplog: pytest.LogCaptureFixture
) -> None:
    workspace = rehearsal_workspace(tmp_path / "federation", written(tmp_path / "tables", clinics), "y")
    path = workspace.configs["east-clinic"]
    table = path.parent / "data" / "table.csv"
    clinics["east-clinic"].assign(y=1).to_csv(table, index=False)
    with caplog.at_level(logging.WARNING, logger="fedfair"):
        Collaborator(load_collaborator_config(path))  # checks the table against the pinned [schema]; dials nobody
    warned = [record.getMessage() for record in caplog.records if "holds only the class" in record.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("east-clinic: table.csv: label 'y' holds only the class \"1\"")

    clinics["east-clinic"].iloc[:5].to_csv(table, index=False)
    with pytest.raises(PermanentFailureError) as stopped:
        Collaborator(load_collaborator_config(path))
    assert str(stopped.value).startswith(
        "data-mismatch: this institution's data does not fit the aggregator's plan: table.csv: 4 training rows are "
        "too few for the plan's batch"
    )


@pytest.mark.parametrize(
    ("recode", "refusal"),
    [
        ("recode = 3", r"\[data\] recode must be a table of column = "),
        ("recode = { y = {} }", r"\[data.recode\] y must be a table of this table's value"),
        ("recode = { y = { yes = true } }", r"\[data.recode\] y: yes = true must give the plan's value as text"),
        ('dataset = "adult"\nindex = 0\nrecode = { y = { yes = "1" } }', r"\[data\] recode applies to csv files only"),
    ],
)
def test_a_wrong_recode_is_refused_when_the_config_is_read(recode: str, refusal: str) -> None:
    text = f'[collaborator]\nname = "east"\naggregator = "127.0.0.1:5000"\n[data]\n{recode}\n'
    if "dataset" not in recode:
        text = text.replace("[data]\n", '[data]\ncsv = "table.csv"\n')
    with pytest.raises(ConfigError, match=refusal):
        parse_collaborator_config(tomllib.loads(text), Path("collaborator.toml"))
