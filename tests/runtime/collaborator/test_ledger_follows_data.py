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

import pandas as pd
import pytest

from fedfair.cli import main as cli_main
from fedfair.privacy import distributed
from fedfair.privacy.ledger import Charge, Ledger, data_digest, ledger_path
from fedfair.runtime.collaborator.charges import data_identity, open_ledger
from fedfair.runtime.collaborator.config import CollaboratorConfig, DataSettings, load_collaborator_config
from fedfair.runtime.local.workspace import make_workspace
from tests.federations import adult_raw_table

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


def test_a_changed_table_starts_its_ledger_only_on_the_operators_reset(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _charge(site, 1)
    edited = _table()
    edited.loc[0, "age"] += 1
    edited.to_csv(site.parent / "table.csv", index=False)
    said = _refused(site, capsys)
    assert "for other rows than [data] names now" in said and "the table changed" in said, said
    reset = ["collaborator", "reset-ledger", "--config", str(site), "--reason", "corrected table, new records"]
    assert cli_main([*reset, "--confirm"]) == 0
    assert "no noised input charged (epsilon 0)" in _shown(site, capsys)
    _table().to_csv(site.parent / "table.csv", index=False)  # the table as it was: its own ledger, still charged
    assert "for other rows than [data] names now" in _refused(site, capsys)


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
    before and after, through real processes and the real CLI."""
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


def test_a_changed_table_is_refused_before_the_collaborator_dials_with_the_ledgers_one_fix(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`collaborator start` makes the check `collaborator ledger` makes, before it connects: one message, the table's
    fix (put it back, or reset the ledger), never the record's ("local-bindings ... restore ... from a backup"), and
    at once (its aggregator's address answers nothing: a dial would wait for it)."""
    _charge(site, 1)
    edited = _table()
    edited.loc[0, "age"] += 1
    edited.to_csv(site.parent / "table.csv", index=False)
    began = time.monotonic()
    assert cli_main(["collaborator", "start", "--config", str(site)]) == 2
    assert time.monotonic() - began < 60.0  # no wait for an aggregator: [retry] start_wait_seconds is 300
    captured = capsys.readouterr()
    (line,) = [line for line in captured.err.splitlines() if line.startswith("fedfair: error:")]
    assert "the table changed since this site last charged" in line and "reset-ledger" in line, line
    assert "local-bindings" not in captured.err and "connecting to the aggregator" not in captured.err + captured.out
