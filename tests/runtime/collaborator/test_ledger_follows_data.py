"""The ledger belongs to the institution's data, not to a path (issue 77): through `fedfair collaborator ledger`.

A site's folder moved, renamed or copied, or its table re-exported, continues the same spend; a copy of the ledger
that charges on its own is refused; a new ledger for the same folder starts only on the operator's reset.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedfair.cli import main as cli_main
from fedfair.core.errors import PermanentFailureError, PrivacyBudgetError
from fedfair.privacy import distributed
from fedfair.privacy.ledger import Charge, Ledger, data_digest, ledger_path
from fedfair.runtime.collaborator.charges import data_identity, open_ledger, open_record
from fedfair.runtime.collaborator.config import CollaboratorConfig, DataSettings, load_collaborator_config
from fedfair.runtime.collaborator.preparation import join
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, shared_settings
from fedfair.runtime.local.workspace import make_workspace
from tests.federations import adult_raw_table
from tests.runtime.test_auditor_consent import Aggregator, Once

RELEASE = distributed.Release("skellam", 2e6, 40.0, 10.0, 0.05)
DELTA = 1e-5
ONE = distributed.epsilon([RELEASE], DELTA)
TWO = distributed.epsilon([dataclasses.replace(RELEASE, steps=2)], DELTA)
THREE = distributed.epsilon([dataclasses.replace(RELEASE, steps=3)], DELTA)


def _table() -> pd.DataFrame:
    return adult_raw_table().iloc[:300].reset_index(drop=True)


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """site-a's folder, its table (table.csv, named relative to its config) in it; returns its config."""
    workspace = make_workspace(
        tmp_path / "w", ["site-a", "site-b"], data={"site-a": {"csv": "table.csv", "label": "income"}}
    )
    config = workspace.configs["site-a"]
    _table().to_csv(config.parent / "table.csv", index=False)
    return config


def _charge(config: Path, round_number: int) -> CollaboratorConfig:
    loaded = load_collaborator_config(config)
    open_ledger(loaded).charge("fed-one", Charge("evaluate", round_number, f"m{round_number}", RELEASE, DELTA), 1e9)
    return loaded


def _shown(config: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(["collaborator", "ledger", "--config", str(config)]) == 0
    return capsys.readouterr().out


def _refused(config: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(["collaborator", "ledger", "--config", str(config)]) == 2
    return capsys.readouterr().err


def test_a_table_is_its_rows_not_its_file(tmp_path: Path) -> None:
    """Same rows, any file: reordered rows and columns, another number format, Parquet, another path. A changed
    cell, a row more or a column renamed is other data; the columns read and the rows held out do not count."""
    table = _table()
    table.to_csv(tmp_path / "a.csv", index=False)
    shuffled = table.sample(frac=1.0, random_state=3)[list(reversed(table.columns))]
    shuffled.to_csv(tmp_path / "b.tsv", index=False, sep="\t", float_format="%.3f")
    table.to_parquet(tmp_path / "c.parquet")
    same = {str(data_identity(DataSettings(csv=tmp_path / name, label="income")).values())
            for name in ("a.csv", "b.tsv", "c.parquet")}  # fmt: skip
    assert len(same) == 1
    first = DataSettings(csv=tmp_path / "a.csv", label="income")
    assert data_identity(dataclasses.replace(first, label="sex", test_fraction=0.5)) == data_identity(first)
    edited = table.copy()
    edited.loc[7, "age"] += 1
    edited.to_csv(tmp_path / "d.csv", index=False)
    pd.concat([table, table.iloc[:1]]).to_csv(tmp_path / "e.csv", index=False)
    table.rename(columns={"age": "years"}).to_csv(tmp_path / "f.csv", index=False)
    others = [data_identity(dataclasses.replace(first, csv=tmp_path / name)) for name in ("d.csv", "e.csv", "f.csv")]
    assert len({str(other) for other in others} | same) == 4
    part = DataSettings(dataset="adult", partition="race", index=1)
    assert data_identity(part) != data_identity(dataclasses.replace(part, index=2))


def test_the_row_index_pandas_writes_by_default_is_not_part_of_the_table(tmp_path: Path) -> None:
    """Red team 2's note: `to_csv` without index=False, the most common accidental re-export, writes the row numbers
    as an unnamed first column, which made another table whose spend started at 0. An unnamed first column of the
    integers 0..n-1 (in any order: shuffled rows carry their numbers) is now ignored; a named one, or numbers that
    are not the rows', is data."""
    table = _table()
    table.to_csv(tmp_path / "a.csv", index=False)
    table.to_csv(tmp_path / "indexed.csv")
    table.sample(frac=1.0, random_state=3).to_csv(tmp_path / "shuffled.csv")
    kept = [
        data_identity(DataSettings(csv=tmp_path / name, label="income"))
        for name in ("a.csv", "indexed.csv", "shuffled.csv")
    ]
    assert kept[0] == kept[1] == kept[2]
    table.rename_axis("id").to_csv(tmp_path / "named.csv")
    table.iloc[1:].to_csv(tmp_path / "a_row_less.csv")  # numbers 1..n-1: not this table's row numbers
    table.iloc[1:].to_csv(tmp_path / "a_row_less_plain.csv", index=False)
    named, gapped, plain = (
        data_identity(DataSettings(csv=tmp_path / name, label="income"))
        for name in ("named.csv", "a_row_less.csv", "a_row_less_plain.csv")
    )
    assert named != kept[0] and gapped != plain


def test_the_ledger_continues_after_mv_cp_and_a_re_export(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _charge(site, 1)
    before = _shown(site, capsys)
    assert f"epsilon {ONE:.4g} spent" in before
    moved = site.parent.parent / "elsewhere" / "site-a-renamed"
    moved.parent.mkdir()
    shutil.move(site.parent, moved)
    config = moved / "collaborator.toml"
    assert f"epsilon {ONE:.4g} spent" in _shown(config, capsys)
    copied = moved.parent / "copy"
    shutil.copytree(moved, copied, symlinks=True)  # cp -a: the copy shares the one ledger, it does not fork it
    _charge(copied / "collaborator.toml", 2)
    assert f"epsilon {TWO:.4g} spent" in _shown(config, capsys)
    assert f"epsilon {TWO:.4g} spent" in _shown(copied / "collaborator.toml", capsys)
    _charge(config, 3)  # the first folder's link is behind the copy's charge, and continues it
    table = _table()
    table.sample(frac=1.0, random_state=5).to_parquet(moved / "export.parquet")  # the same rows, re-exported
    text = config.read_text().replace('csv = "table.csv"', 'csv = "export.parquet"')
    assert text != config.read_text()
    config.write_text(text)
    assert f"epsilon {THREE:.4g} spent" in _shown(config, capsys)


def test_a_copied_ledger_that_charges_on_its_own_is_refused(site: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of the ledger file beside its original is refused; a copy that replaced it after charging on its
    own elsewhere (same lineage, a generation this folder never wrote) is refused by the folder's link."""
    loaded = _charge(site, 1)
    ledger = open_ledger(loaded)
    copy = site.parent.parent / "copied-ledgers" / ledger.path.name
    copy.parent.mkdir()
    shutil.copy2(ledger.path, copy)
    with pytest.raises(Exception, match=r"is a copy of the ledger at .*each copy could spend the budget on its own"):
        Ledger(copy, "site-a", ledger.identity)
    # The copy, moved away from its original, charges on its own (e.g. on another machine), while this folder
    # charges the original; then the copy is put in the original's place.
    original = ledger.path.read_bytes()
    ledger.path.rename(ledger.path.with_name("away"))
    forked = Ledger(copy, "site-a", ledger.identity)  # its home is gone: taken as moved
    forked.charge("fed-two", Charge("evaluate", 1, "m9", RELEASE, DELTA), 1e9)
    ledger.path.with_name("away").rename(ledger.path)
    assert ledger.path.read_bytes() == original
    _charge(site, 2)
    shutil.copy2(copy, ledger.path)  # while the copy is still where it charged, it is told from its home
    assert "is a copy of the ledger at" in _refused(site, capsys)
    shutil.move(copy, ledger.path)  # moved back over the original: this folder never wrote its generation 2
    said = _refused(site, capsys)
    assert "holds other entries at that generation" in said and "a copy that charged on its own" in said, said
    assert "reset-ledger" in said


def test_a_lost_or_rolled_back_ledger_is_refused_and_only_a_reset_starts_again(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loaded = _charge(site, 1)
    ledger = open_ledger(loaded)
    backup = ledger.path.read_bytes()
    _charge(site, 2)
    ledger.path.write_bytes(backup)
    assert "holds fewer (1 entries)" in _refused(site, capsys)
    ledger.path.unlink()
    said = _refused(site, capsys)
    assert f"but there is none at {ledger.path}" in said and "FEDFAIR_LEDGER_DIR" in said, said
    reset = ["collaborator", "reset-ledger", "--config", str(site), "--reason", "ledger lost in a disk failure"]
    assert cli_main([*reset, "--confirm"]) == 0
    shown = _shown(site, capsys)
    assert "no noised input charged (epsilon 0)" in shown and "reset 1 time(s) by its operator" in shown


def test_a_changed_table_continues_and_only_the_operators_reset_starts_new_people(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrected cell is another table of the same people: it continues the spend in the same folder. A table
    that shares no row with the one charged is refused until the operator says it is new people, with a reason."""
    _charge(site, 1)
    edited = _table()
    edited.loc[0, "age"] += 1
    edited.to_csv(site.parent / "table.csv", index=False)
    shown = _shown(site, capsys)
    assert f"epsilon {ONE:.4g} spent" in shown and "299 of its rows are in site-a." in shown, shown
    _charge(site, 2)  # charged to the corrected table's own ledger, counted with the first one's
    assert f"epsilon {TWO:.4g} spent" in _shown(site, capsys)
    _table().to_csv(site.parent / "table.csv", index=False)  # the table as it was: the same people again
    assert f"epsilon {TWO:.4g} spent" in _shown(site, capsys)
    adult_raw_table().iloc[300:600].to_csv(site.parent / "table.csv", index=False)  # no row in common
    said = _refused(site, capsys)
    assert "for a table that shares no row with the one [data] names now" in said and "reset-ledger" in said, said
    reset = ["collaborator", "reset-ledger", "--config", str(site), "--reason", "new cohort, other patients"]
    assert cli_main([*reset, "--confirm"]) == 0
    shown = _shown(site, capsys)
    assert "no noised input charged (epsilon 0)" in shown and "new cohort, other patients" in shown, shown


def _export(root: Path, site: str, table: pd.DataFrame) -> Path:
    """`site`'s fresh folder of a new federation (no link, no record), holding `table`; returns its config."""
    workspace = make_workspace(root, [site, "site-z"], data={site: {"csv": "table.csv", "label": "income"}})
    config = workspace.configs[site]
    table.to_csv(config.parent / "table.csv", index=False)
    return config


def test_a_re_export_of_the_same_people_into_a_fresh_folder_continues_the_spend(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 93's acceptance: re-exported into a fresh folder with one patient added, one removed, one duplicated
    or one corrected, or the same rows under another site name, the ledger shows the epsilon spent so far."""
    _charge(site, 1)
    table, newcomer = _table(), adult_raw_table().iloc[[5000]]
    corrected = table.copy()
    corrected.loc[3, "hours-per-week"] = 99
    exports = {
        "added": ("site-a", pd.concat([table, newcomer])),
        "removed": ("site-a", table.drop(index=17)),
        "duplicated": ("site-a", pd.concat([table, table.iloc[[9]]])),
        "corrected": ("site-a", corrected),
        "renamed": ("clinic-9", table.sample(frac=1.0, random_state=1)),
    }
    for name, (site_name, rows) in exports.items():
        config = _export(tmp_path / name, site_name, rows)
        assert f"epsilon {ONE:.4g} spent" in _shown(config, capsys), name
    # The budget is checked over the people's spend: a budget below two releases refuses the re-export's first.
    again = _export(tmp_path / "again", "site-a", pd.concat([table, newcomer]))
    with pytest.raises(PrivacyBudgetError, match=r"and 1 releases of other ledgers of the same people"):
        open_ledger(load_collaborator_config(again)).charge(
            "fed-two", Charge("evaluate", 1, "m", RELEASE, DELTA), TWO * 0.99
        )
    # A charge of the re-export counts for the people it shares: the first folder now shows both.
    _charge(again, 1)
    assert f"epsilon {TWO:.4g} spent" in _shown(site, capsys)


def test_a_re_export_with_a_column_renamed_or_a_categorys_case_changed_continues_the_spend(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team of issue 93: the same 300 people re-exported into a fresh folder with "sex" renamed "gender" (which
    moves the column in name order, so every row read differently) or with "sex" upper-cased showed epsilon 0; a
    rename that kept the order already continued. Each now shows the spend so far."""
    _charge(site, 1)
    table = _table()
    upper = table.assign(sex=table["sex"].str.upper())
    both = upper.rename(columns={"sex": "gender"})
    exports = {
        "renamed, moved": table.rename(columns={"sex": "gender"}),
        "renamed, in place": table.rename(columns={"age": "age_years"}),
        "upper-cased": upper,
        "both, columns reversed": both[list(reversed(both.columns))],
    }
    for name, rows in exports.items():
        config = _export(tmp_path / name.replace(", ", "-"), "site-a", rows)
        assert f"epsilon {ONE:.4g} spent" in _shown(config, capsys), name


def test_a_rows_file_of_one_spelling_still_matches_and_gains_the_second_when_its_table_is_opened(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rows file kept before rows had two spellings holds the first alone: a re-export with a patient added still
    continues through it, and once its own table is opened again it holds both, so a renamed column continues too."""
    from fedfair.privacy.ledger_people import KEY_FILE, read_rows, row_digests, rows_path, write_rows
    from fedfair.runtime.collaborator.table_fingerprint import table_rows

    ledger = _charge_and_open(site)
    key = (ledger.path.parent / KEY_FILE).read_bytes()
    kept = rows_path(ledger.path)
    first = [row[:1] for row in table_rows(site.parent / "table.csv")]
    write_rows(kept, row_digests(first, key), key)
    assert read_rows(kept, key).size == 300
    table = _table()
    added = _export(tmp_path / "added", "site-a", pd.concat([table, adult_raw_table().iloc[[5000]]]))
    assert f"epsilon {ONE:.4g} spent" in _shown(added, capsys)
    assert f"epsilon {ONE:.4g} spent" in _shown(site, capsys)  # its own table opened: both spellings kept now
    assert read_rows(kept, key).size == 600
    renamed = _export(tmp_path / "renamed", "site-a", table.rename(columns={"sex": "gender"}))
    assert f"epsilon {ONE:.4g} spent" in _shown(renamed, capsys)


def test_a_table_with_dates_converted_to_parquet_continues_the_spend(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Red team of issue 93: a table with a date column, charged as CSV, then written to Parquet with its dates
    parsed (as pandas and Arrow write them), read every date as "2020-01-03 00:00:00": no row matched, and the
    fresh folder showed epsilon 0 although docs/security.md says a CSV/Parquet conversion is the same data."""
    table = _table().assign(admitted=[f"20{10 + i % 10}-0{1 + i % 9}-1{i % 10}" for i in range(300)])
    charged = _export(tmp_path / "csv", "site-a", table)
    _charge(charged, 1)
    converted = _export(tmp_path / "parquet", "site-a", table)
    (converted.parent / "table.csv").unlink()
    table.assign(admitted=pd.to_datetime(table["admitted"])).to_parquet(converted.parent / "table.parquet")
    text = converted.read_text()
    converted.write_text(text.replace('"table.csv"', '"table.parquet"'))
    assert "table.parquet" in converted.read_text()
    assert f"epsilon {ONE:.4g} spent" in _shown(converted, capsys)


def test_each_row_is_charged_the_composition_over_the_ledgers_it_belongs_to(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two disjoint tables, charged once and twice, merged: its most charged rows have spent two releases, not
    three (a row is in one of them); a ledger that matches nothing is epsilon 0; the operator's reset of the merged
    table ends what both charged so far, and what they charge later counts again."""
    _charge(site, 1)
    other = _export(tmp_path / "other", "site-b", adult_raw_table().iloc[300:600])
    _charge(other, 1)
    _charge(other, 2)
    merged = _export(tmp_path / "merged", "site-c", adult_raw_table().iloc[:600])
    shown = _shown(merged, capsys)
    assert f"epsilon {TWO:.4g} spent" in shown and "300 of its rows are in site-a." in shown, shown
    assert "300 of its rows are in site-b." in shown
    assert "no noised input charged (epsilon 0)" in _shown(
        _export(tmp_path / "new", "site-d", adult_raw_table().iloc[900:1000]), capsys
    )
    reset = ["collaborator", "reset-ledger", "--config", str(merged), "--reason", "a new extract, new people"]
    assert cli_main([*reset, "--confirm"]) == 0
    assert "no noised input charged (epsilon 0)" in _shown(merged, capsys)
    _charge(site, 2)
    assert f"epsilon {ONE:.4g} spent" in _shown(merged, capsys)


def test_a_charged_ledger_whose_rows_file_is_gone_counts_for_every_table_of_the_folder(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting a charged ledger's rows file must not reset its people's spend (before: a re-export with one
    patient added showed epsilon 0): it is counted as holding every row, an over-count that opening its table
    again ends (its rows are kept again) or the operator's reset ends (these are other people)."""
    from fedfair.privacy.ledger_people import rows_path

    ledger = _charge_and_open(site)
    rows_path(ledger.path).unlink()
    export = _export(tmp_path / "x", "site-a", pd.concat([_table(), adult_raw_table().iloc[[5000]]]))
    shown = _shown(export, capsys)
    assert f"epsilon {ONE:.4g} spent" in shown and f"{ledger.path.name} has no rows file" in shown, shown
    strangers = _export(tmp_path / "y", "site-b", adult_raw_table().iloc[900:1000])
    assert f"epsilon {ONE:.4g} spent" in _shown(strangers, capsys)  # unknown rows: never under-counted
    _shown(site, capsys)  # the charged table opened again keeps its rows: strangers are told apart again
    assert rows_path(ledger.path).exists()
    assert "no noised input charged (epsilon 0)" in _shown(strangers, capsys)
    assert f"epsilon {ONE:.4g} spent" in _shown(export, capsys)


def test_dp_sgd_steps_whose_rows_file_is_gone_still_count_for_a_re_export(site: Path, tmp_path: Path) -> None:
    """The same for a table that only took DP-SGD steps (no ledger entry): its rows file deleted, a re-export with
    one patient added showed epsilon 0 after 100 steps (sigma 1, q 0.01); it now shows the first folder's figure."""
    from fedfair.privacy.ledger_people import rows_path
    from fedfair.runtime.collaborator.charges import open_site_accountant

    accountant, _ = open_site_accountant(load_collaborator_config(site), "fed-one")
    accountant.spend(1.0, 0.01, 100)
    first = open_ledger(load_collaborator_config(site))
    spent = first.spent(DELTA)
    assert spent == pytest.approx(1.22, abs=0.01)  # 100 sampled Gaussian steps by RDP, as the docs state
    rows_path(first.path).unlink()
    export = _export(tmp_path / "x", "site-a", pd.concat([_table(), adult_raw_table().iloc[[5000]]]))
    assert open_ledger(load_collaborator_config(export)).spent(DELTA) == pytest.approx(spent, rel=1e-9)


def test_row_digests_are_keyed_and_kept_beside_the_ledger_not_the_rows(site: Path) -> None:
    """The ledger folder keeps 8-byte keyed digests of the distinct rows, under a 32-byte key of its own: no cell of
    the table is in it, and another folder's key gives other digests for the same rows."""
    from fedfair.privacy.ledger_home import ledger_folder
    from fedfair.privacy.ledger_people import KEY_FILE, read_rows, row_digests, rows_path
    from fedfair.runtime.collaborator.table_fingerprint import table_rows

    ledger = _charge_and_open(site)
    folder = ledger_folder()
    key = (folder / KEY_FILE).read_bytes()
    assert len(key) == 32 and (folder / KEY_FILE).stat().st_mode & 0o077 == 0
    rows = table_rows(site.parent / "table.csv")
    kept = read_rows(rows_path(ledger.path), key)
    # Two spellings of each of the 300 distinct rows (as read, and its cells alone), no two alike.
    assert len(set(rows)) == 300 and kept.size == 600 and (kept == np.unique(row_digests(rows, key))).all()
    assert not set(kept.tolist()) & set(row_digests(rows, bytes(32)).ravel().tolist())
    raw = rows_path(ledger.path).read_bytes()
    assert b"State-gov" not in raw and b"Bachelors" not in raw


def _charge_and_open(config: Path) -> Ledger:
    _charge(config, 1)
    return open_ledger(load_collaborator_config(config))


def test_a_ledger_kept_by_the_tables_path_is_taken_over_after_a_move(
    site: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A version 1 ledger (beside the config, keyed by the table's absolute path) found after the folder moved
    continues in the ledger of the table's rows, once, and the federation's record still accepts it."""
    old_identity = {"csv": str((site.parent / "table.csv").resolve())}
    old_path = ledger_path(site.parent, "site-a", old_identity)
    legacy = Ledger.__new__(Ledger)  # a version 1 file, written as fedfair wrote it before
    genesis = {"format": "fedfair-ledger", "site": "site-a", "data": old_identity}
    entry = {"kind": "evaluate", "federation": "fed-old", "round": 1, "model": "m", "mechanism": "skellam",
             "mu": RELEASE.mu, "l1": RELEASE.l1, "l2": RELEASE.l2, "sampling_rate": RELEASE.sampling_rate,
             "addon": 0.0, "delta": DELTA}  # fmt: skip
    from fedfair.pki.roster import canonical_json
    from fedfair.privacy.ledger import entry_hash
    import hashlib

    entry["prev"] = hashlib.sha256(canonical_json(genesis)).hexdigest()
    document = {"format": "fedfair-ledger", "version": 1, "site": "site-a", "data": old_identity, "count": 1,
                "head": entry_hash(entry), "entries": [entry]}  # fmt: skip
    old_path.write_text(json.dumps(document))
    del legacy
    moved = site.parent.parent / "moved-site"
    shutil.move(site.parent, moved)
    shown = _shown(moved / "collaborator.toml", capsys)
    assert f"epsilon {ONE:.4g} spent" in shown and f"continues {old_path.name}" in shown
    assert "was kept by the table's path; its 1 releases now continue in" in caplog.text
    assert (moved / f"{old_path.name}.taken-over").exists() and not (moved / old_path.name).exists()
    assert f"epsilon {ONE:.4g} spent" in _shown(moved / "collaborator.toml", capsys)  # taken over once
    ledger = open_ledger(load_collaborator_config(moved / "collaborator.toml"))
    assert old_path.name in ledger.names and ledger.identity == {
        "table_rows_sha256": ledger.identity["table_rows_sha256"]
    }
    assert data_digest(ledger.identity) != data_digest(old_identity)
    # The federation's record of before names the old file: it still accepts the ledger that continues it.
    from fedfair.runtime.collaborator.input_record import InputRecord

    record = {"format": "fedfair-bindings", "version": 3, "latest": 1, "inputs": {}, "kept": {}, "trainings": 0,
              "thresholds": {}, "charged": 1, "resets": 0, "ledger": old_path.name}  # fmt: skip
    (moved / "site-a.fed-old.bindings.json").write_text(json.dumps(record))
    InputRecord(moved / "site-a.fed-old.bindings.json", "fed-old", ledger=ledger)
    record["ledger"] = "site-a.0123456789abcdef.ledger.json"
    (moved / "site-a.fed-old.bindings.json").write_text(json.dumps(record))
    with pytest.raises(Exception, match=r"its data changed within a federation"):
        InputRecord(moved / "site-a.fed-old.bindings.json", "fed-old", ledger=ledger)


@pytest.mark.slow
def test_a_launched_federations_ledger_survives_mv_of_its_workspace(tmp_path: Path) -> None:
    """The issue's own steps: `launch --csv ... --workdir W` (kept), then `mv W`: the ledger's epsilon is the same
    before and after, through real processes and the real CLI; and (issue 93) the same from a fresh folder whose
    table is north's with one patient added, or one removed."""
    table = adult_raw_table().iloc[:1200]
    for index, name in enumerate(["north", "south"]):
        table.iloc[index * 600 : (index + 1) * 600].to_csv(tmp_path / f"{name}.csv", index=False)
    workdir = tmp_path / "w"
    flags = ["--csv", str(tmp_path / "north.csv"), str(tmp_path / "south.csv"), "--label", "income"]
    command = [sys.executable, "-m", "fedfair.cli"]
    done = subprocess.run(
        [*command, "launch", *flags, "--rounds", "1", "--workdir", str(workdir), "--no-fedavg"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def ledger_of(root: Path) -> str:
        shown = subprocess.run(
            [*command, "collaborator", "ledger", "--config", str(root / "north" / "collaborator.toml")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shown.returncode == 0, shown.stderr[-3000:]
        found = re.search(r"epsilon (\S+) spent at delta", shown.stdout)
        assert found is not None, shown.stdout
        return found.group(1)

    before = ledger_of(workdir)
    assert float(before) > 0
    moved = tmp_path / "moved"
    shutil.move(workdir, moved)
    assert ledger_of(moved) == before
    # Issue 93: north's table re-exported into a fresh folder with one patient added, or one removed.
    north = table.iloc[:600]
    newcomer = adult_raw_table().iloc[[5000]]  # in neither site's table
    for name, rows in (("added", pd.concat([north, newcomer])), ("removed", north.iloc[1:])):
        assert ledger_of(_export(tmp_path / name, "north", rows).parent.parent) == before, name


def test_a_dp_sgd_accountant_kept_by_the_tables_path_is_taken_over_after_a_move(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A site's local DP-SGD accountant keyed by the table's path continues under the rows' key, not from 0."""
    from fedfair.privacy.accounting import PrivacyAccountant, compute_epsilon, privacy_state_path

    old_identity = {"csv": str((site.parent / "table.csv").resolve())}
    PrivacyAccountant(privacy_state_path(site.parent, "site-a", old_identity), federation="f", data=old_identity).spend(
        1.1, 0.01, 20
    )
    moved = site.parent.parent / "moved-site"
    shutil.move(site.parent, moved)
    shown = _shown(moved / "collaborator.toml", capsys)
    delta = load_collaborator_config(moved / "collaborator.toml").privacy.delta
    epsilon = compute_epsilon(1.1, 0.01, 20, delta)
    assert f"DP-SGD on this data (local), epsilon {epsilon:.4g} at delta {delta:g} over 20 steps" in shown, shown
    assert len(list(moved.glob("site-a.*.privacy.json.taken-over"))) == 1


def test_dp_sgd_steps_follow_the_people_into_a_fresh_folder(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 93: after 100 DP-SGD steps (sigma 1, q 0.01) the same rows opened from a new config folder, or with
    one patient added or removed, show the epsilon spent (0.728 at delta 1e-5), not 0; steps taken there count
    back for the first folder's people."""
    from fedfair.privacy.accounting import compute_epsilon
    from fedfair.runtime.collaborator.charges import open_site_accountant

    accountant, _ = open_site_accountant(load_collaborator_config(site), "fed-one")
    for _ in range(10):
        accountant.spend(1.0, 0.01, 10)  # 10 rounds of 10 steps
    delta = load_collaborator_config(site).privacy.delta
    spent = compute_epsilon(1.0, 0.01, 100, delta)
    assert delta == 1e-5 and spent == pytest.approx(0.728, abs=5e-4)
    table = _table()
    same = _export(tmp_path / "same", "site-a", table.sample(frac=1.0, random_state=2))
    assert f"epsilon {spent:.4g} at delta {delta:g} over 100 steps, composed by PRV" in _shown(same, capsys)
    added = _export(tmp_path / "added", "site-a", pd.concat([table, adult_raw_table().iloc[[5000]]]))
    elsewhere = f"epsilon {spent:.4g} at delta {delta:g} over 0 steps and 100 steps on other tables of the same people"
    assert elsewhere in _shown(added, capsys)
    removed = _export(tmp_path / "removed", "site-a", table.drop(index=0))
    assert elsewhere in _shown(removed, capsys)
    there, _ = open_site_accountant(load_collaborator_config(added), "fed-two")
    there.spend(1.0, 0.01, 100)
    both = compute_epsilon(1.0, 0.01, 200, delta)
    assert f"epsilon {both:.4g} at delta {delta:g} over 100 steps and 100 steps on other" in _shown(site, capsys)


def test_fingerprinting_adults_rows_stays_under_the_issues_1_8_seconds(tmp_path: Path) -> None:
    """Opening the ledger of Adult's 32,561 rows (read, fingerprint, keyed row digests, matched against a ledger of
    the same people) took 1.8 s before the people were matched; it stays under that (best of three, fresh each).

    CPU seconds of this process (every thread's), not wall seconds: the work is the product's, the wait for a core
    is the machine's. At a load average of 4.4 on 2 cores one opening took 0.54 to 0.71 s of wall time for 0.27 s of
    CPU; under `make test` (three jobs beside two workers) the wall time of the best of three could pass 1.8 s with
    no change to the code."""
    import time

    from fedfair.runtime.collaborator import table_fingerprint

    table = adult_raw_table()
    assert len(table) == 32_561
    first = _export(tmp_path / "first", "site-a", table)
    _charge(first, 1)
    config = load_collaborator_config(_export(tmp_path / "second", "site-a", table.iloc[1:]))
    took = []
    for _ in range(3):
        table_fingerprint._SEEN.clear()
        started = time.process_time()
        ledger = open_ledger(config)
        assert ledger.spent(DELTA) == pytest.approx(ONE)
        took.append(time.process_time() - started)
    assert min(took) < 1.8, took


def test_the_ledger_is_one_figure_for_every_mechanism(
    site: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One ledger per institution's people for every mechanism (issue 93): a site's own DP-SGD steps and its noised
    secure-sum inputs compose by RDP into the ledger's epsilon, in its folder and in a fresh folder of the same
    people with a row added; an answer that fits the budget without the DP-SGD steps is refused, naming them."""
    from fedfair.runtime.collaborator.charges import open_site_accountant

    accountant, _ = open_site_accountant(load_collaborator_config(site), "fed-one")
    accountant.spend(1.0, 0.01, 100)
    answer = distributed.Release("skellam", 1000.0, 40.0, 10.0)  # epsilon 0.90 alone
    loaded = load_collaborator_config(site)
    open_ledger(loaded).charge("fed-one", Charge("evaluate", 1, "m", answer, DELTA), 1e9)
    steps = distributed.gaussian_release(1.0, 0.01, 100)  # 1.22 alone
    joint = distributed.epsilon([answer, steps], DELTA)
    assert joint == pytest.approx(1.45, abs=0.01)
    shown = _shown(site, capsys)
    assert f"epsilon {joint:.4g} spent at delta 1e-05" in shown and "and the DP-SGD steps on them" in shown, shown
    added = _export(tmp_path / "added", "site-a", pd.concat([_table(), adult_raw_table().iloc[[5000]]]))
    assert f"epsilon {joint:.4g} spent at delta 1e-05" in _shown(added, capsys)
    two = distributed.epsilon([dataclasses.replace(answer, steps=2)], DELTA)  # 1.31: fits a budget of 1.4
    with pytest.raises(PrivacyBudgetError, match=r"and 100 DP-SGD steps on these people"):
        open_ledger(load_collaborator_config(added)).charge("fed-two", Charge("evaluate", 1, "m", answer, DELTA), 1.4)
    assert two < 1.4


def test_a_dp_sgd_accountant_beside_the_config_moves_beside_the_ledger(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An accountant kept by the rows beside the config (as fedfair kept it before issue 93) continues in the
    ledger folder, once: the file beside the config is set aside, and a new folder of the same rows sees it."""
    from fedfair.privacy.accounting import PrivacyAccountant, compute_epsilon, privacy_state_path
    from fedfair.privacy.ledger_home import ledger_folder

    identity = data_identity(load_collaborator_config(site).data)
    beside = privacy_state_path(site.parent, "site-a", identity)
    PrivacyAccountant(beside, federation="f", data=identity).spend(1.1, 0.01, 20)
    epsilon = compute_epsilon(1.1, 0.01, 20, DELTA)
    assert f"epsilon {epsilon:.4g} at delta 1e-05 over 20 steps" in _shown(site, capsys)
    assert not beside.exists() and beside.with_name(f"{beside.name}.taken-over").exists()
    assert privacy_state_path(ledger_folder(), "site-a", identity).exists()
    assert f"epsilon {epsilon:.4g} at delta 1e-05 over 20 steps" in _shown(site, capsys)  # taken over once


def test_sites_drawing_the_folders_key_at_once_share_one(tmp_path: Path) -> None:
    """Collaborators of one machine open the ledger folder at once (threads of one process too, as a launch or the
    attack matrix runs them): one key is drawn and kept, never rewritten, so every rows file matches it. The
    first version wrote a per-process temporary file, which two threads truncated in turn: the key changed under
    a rows file already made with it."""
    from concurrent.futures import ThreadPoolExecutor

    from fedfair.privacy.ledger_people import KEY_FILE, people_key

    folders = [tmp_path / f"ledgers-{attempt}" for attempt in range(100)]
    with ThreadPoolExecutor(8) as pool:
        for folder in folders:
            keys = list(pool.map(people_key, [folder] * 8))
            assert len(set(keys)) == 1 and keys[0] == (folder / KEY_FILE).read_bytes()
            assert [path.name for path in folder.iterdir()] == [KEY_FILE]  # no temporary file left


def test_a_table_of_other_people_is_refused_before_the_collaborator_dials_with_the_ledgers_one_fix(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collaborator start` makes the check `collaborator ledger` makes, before it connects: one message, named
    `local-ledger` wherever the ledger is opened (before the dial, at the join, by `collaborator ledger`), with the
    table's fix (put it back, or reset the ledger), never the record's ("local-bindings ... restore ... from a
    backup"), and at once (its aggregator's address answers nothing: a dial would wait for it)."""
    _charge(site, 1)
    adult_raw_table().iloc[300:600].to_csv(site.parent / "table.csv", index=False)  # no row in common: other people
    began = time.monotonic()
    assert cli_main(["collaborator", "start", "--config", str(site)]) == 2
    assert time.monotonic() - began < 60.0  # no wait for an aggregator: [retry] start_wait_seconds is 45
    captured = capsys.readouterr()
    (line,) = [line for line in captured.err.splitlines() if line.startswith("fedfair: error:")]
    assert line.startswith("fedfair: error: local-ledger: this site's privacy ledger does not go with its table"), line
    assert "shares no row with the one [data] names now" in line and "reset-ledger" in line, line
    assert f"Fix: the one the reason names; `fedfair collaborator ledger --config {site}` makes the same check" in line
    assert "local-bindings" not in captured.err and "connecting to the aggregator" not in captured.err + captured.out
    (same,) = [line for line in _refused(site, capsys).splitlines() if line.startswith("fedfair: error:")]
    assert same == line  # `collaborator ledger` says it in the same words
    # And so does the join, where the ledger is opened again (it said `local-bindings`, restore the record).
    plan_path = site.parent.parent / "aggregator" / "plan.toml"
    aggregator = Aggregator(shared_settings(load_aggregator_plan(plan_path)))
    with pytest.raises(PermanentFailureError) as caught:
        join(aggregator, load_collaborator_config(site), Once(), None, None)  # type: ignore[arg-type]
    assert aggregator.calls == 1 and f"fedfair: error: {caught.value}" == line


def test_two_tables_of_the_same_people_charged_at_once_stay_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sites of one machine, one table and its re-export with one patient added, each charge one release at
    once under a budget that fits one (between ONE and TWO): one is refused. Before, each checked the budget under
    its own ledger's lock, and both passed (8 of 8 tries), spending TWO."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    budget = (ONE + TWO) / 2
    for attempt in range(3):
        monkeypatch.setenv("FEDFAIR_LEDGER_DIR", str(tmp_path / f"ledgers-{attempt}"))  # each attempt's own people
        first = _export(tmp_path / f"a{attempt}", "site-a", _table())
        second = _export(tmp_path / f"b{attempt}", "site-b", pd.concat([_table(), adult_raw_table()[-1:]]))
        ledgers = [open_ledger(load_collaborator_config(config)) for config in (first, second)]
        together = threading.Barrier(2)

        def charge(ledger: Ledger) -> str:
            together.wait()
            try:
                ledger.charge(ledger.site, Charge("evaluate", 1, ledger.site, RELEASE, DELTA), budget)
            except PrivacyBudgetError:
                return "refused"
            return "charged"

        with ThreadPoolExecutor(2) as pool:
            assert sorted(pool.map(charge, ledgers)) == ["charged", "refused"], attempt
        assert ledgers[0].spent(DELTA) == pytest.approx(ONE, rel=1e-9)


def test_a_table_changed_since_the_site_joined_is_named_before_it_dials(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 98 (the operator red team's finding 3): the same table exported again with 30 of its 300 rows fewer, the
    usual re-export, shares most rows, so the ledger takes it as the same people; the federation's record, which bound
    the table it joined with, refuses it with `table-changed`, the table and the fix, before any dial (nobody serves
    the aggregator's address: a dial would wait) and never as `local-bindings` (restore the record from a backup)."""
    loaded = load_collaborator_config(site)
    assert loaded.federation is not None
    record = open_record(loaded, loaded.federation, open_ledger(loaded))
    record.charge(Charge("evaluate", 1, "m1", RELEASE, DELTA), 1e9)  # its first write binds the table
    _table().iloc[30:].to_csv(site.parent / "table.csv", index=False)
    began = time.monotonic()
    assert cli_main(["collaborator", "start", "--config", str(site)]) == 2
    assert time.monotonic() - began < 60.0
    captured = capsys.readouterr()
    (line,) = [line for line in captured.err.splitlines() if line.startswith("fedfair: error:")]
    assert line.startswith("fedfair: error: table-changed: the table at ") and "table.csv changed since" in line, line
    assert f"joined federation {loaded.federation} " in line and "restore the table it joined with" in line, line
    assert "local-bindings" not in captured.err and "connecting to the aggregator" not in captured.err + captured.out
