"""`fedfair launch --csv`: a rehearsal on the institutions' own tables, set up as `fedfair init` and its README would.

The tables are real rows: Adult's raw table cut into three institutions of 1,500, 900 and 400 rows.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fedfair.core.errors import ConfigError
from fedfair.pki.store import ca_paths
from fedfair.runtime.local.console import MOST_LINES
from fedfair.runtime.local.rehearsal import rehearsal_workspace, site_names
from fedfair.runtime.manifest import load_manifest
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
from fedfair.runtime.plan.template_base import Federation
from fedfair.runtime.plan.templates import render_plan
from tests.federations import adult_raw_table

ROOT = Path(__file__).resolve().parents[3]
SIZES = {"north-clinic": 1500, "south-clinic": 900, "east-clinic": 400}


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three hospitals' CSVs of disjoint Adult rows."""
    table = adult_raw_table().sample(frac=1.0, random_state=5)
    folder = tmp_path_factory.mktemp("tables")
    paths, start = [], 0
    for name, rows in SIZES.items():
        path = folder / f"{name}.csv"
        table.iloc[start : start + rows].to_csv(path, index=False)
        paths.append(path)
        start += rows
    return paths


def test_site_names_come_from_the_file_names(tmp_path: Path) -> None:
    assert site_names([Path("North Clinic.csv"), Path("b/south_2.csv.gz")]) == ("north-clinic", "south-2")
    with pytest.raises(ConfigError, match="at least two"):
        site_names([Path("a.csv")])
    with pytest.raises(ConfigError, match="two tables give the institution name 'a'"):
        site_names([Path("x/a.csv"), Path("y/A.csv")])
    with pytest.raises(ConfigError, match="rename the file"):
        site_names([Path("___.csv"), Path("b.csv")])


def test_the_workspace_is_inits_with_the_readmes_steps_done(tmp_path: Path, tables: list[Path]) -> None:
    root = tmp_path / "federation"
    workspace = rehearsal_workspace(root, tables, "income", rounds=4)
    assert list(workspace.configs) == list(SIZES)
    plan = load_aggregator_plan(workspace.plan)
    assert plan.training.rounds == 4 and plan.schema is not None and plan.schema.label == "income"
    # Init's privacy, untouched: the rehearsal runs what the deployment would.
    drafted = tomllib.loads(render_plan(Federation("rehearsal", tuple(SIZES))))
    assert tomllib.loads(workspace.plan.read_text())["privacy"] == drafted["privacy"]
    manifest = load_manifest(root / "manifest.toml")
    assert plan.manifest == manifest and manifest.plan is not None
    assert sorted(pin.name for pin in manifest.collaborators) == sorted(SIZES) and manifest.max_colluding == 1
    for site, config in workspace.configs.items():
        text = config.read_text()
        assert 'manifest = "../manifest.toml"' in text and '# manifest = "../manifest.toml"' not in text
        assert (root / site / "data" / "table.csv").read_bytes() == next(
            path for path in tables if path.stem == site
        ).read_bytes()
        assert (root / site / "certs" / f"{site}.key").stat().st_mode & 0o077 == 0
    assert not ca_paths(root / "ca")[1].exists(), "the CA key is deleted once every certificate is signed"
    assert 'address = "127.0.0.1:' in workspace.plan.read_text()


def test_a_table_without_the_label_is_refused_before_anything_is_written(tmp_path: Path, tables: list[Path]) -> None:
    with pytest.raises(ConfigError, match="has no column 'readmitted'; pass --label"):
        rehearsal_workspace(tmp_path / "federation", tables, "readmitted")
    assert not (tmp_path / "federation").exists()


@pytest.mark.slow
def test_launch_on_three_tables_finishes_and_prints_the_worst_group_risk(tmp_path: Path, tables: list[Path]) -> None:
    command = [sys.executable, "-m", "fedfair.cli", "launch", "--csv", *map(str, tables), "--label", "income",
               "--rounds", "3", "--workdir", str(tmp_path / "federation")]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fedfair launch: 3 institutions holding their own tables under init's plan, 3 rounds" in result.stdout
    # The same comparison as the demo's: both models exact on the tables' held-out rows, then the private estimate.
    lines = result.stdout.splitlines()
    closing = lines[next(index for index, line in enumerate(lines) if line.startswith("Worst-off 30%'s risk")) :]
    assert [line.split()[0] for line in closing[3:7]] == ["FedSRCVaR", "FedAvg", "uniform", "base"]
    assert len(closing) <= MOST_LINES
    assert "What the federation saw, its private estimate from noised secure sums" in result.stdout
    assert (tmp_path / "federation" / "aggregator" / "output" / "report.html").is_file()
