"""``fedfair launch --csv``: a rehearsal on the institutions' own tables, through the files ``fedfair init`` writes.

It does on one machine each step of the README ``fedfair init`` writes: the ``[schema]`` drafted
from every table together and each table checked against it; init's files (plan and privacy as
they are), each table copied to its site's ``data/table.csv``; the PKI as separate parties run it
(a key, request and signature each), the roster and the pinned manifest every file names; the CA
key deleted. Site names come from the files' names (``north-clinic.csv`` is ``north-clinic``).

Why: docs/design.md, "The local federation".
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from fedfair.core.errors import ConfigError
from fedfair.runtime.local.workspace import Workspace, free_port

if TYPE_CHECKING:
    import pandas as pd

FEDERATION_ID = "rehearsal"
"""The id of a rehearsed federation (its plan, manifest and every config name it)."""

DRAFT_SAMPLE = "all-tables.csv"
"""Every table together, written for the schema draft and removed once it is drafted."""


def site_names(tables: Sequence[Path]) -> tuple[str, ...]:
    """One institution name per table, from its file name: lower case, runs of other characters as hyphens.

    Raises:
        ConfigError: fewer than two tables, a name that cannot be made valid, or two tables giving one name.
    """
    from fedfair import pki

    if len(tables) < 2:
        raise ConfigError("--csv needs one table per institution, at least two (e.g. --csv a.csv b.csv c.csv)")
    names = []
    for path in tables:
        stem = path.name.split(".")[0]
        name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
        try:
            names.append(pki.validate_name(name))
        except ConfigError:
            raise ConfigError(
                f"{path.name}: its name gives no valid institution name ({name!r}); rename the file to the "
                "institution's name, e.g. hospital-a.csv"
            ) from None
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(f"two tables give the institution name {repeated[0]!r}; rename one of the files")
    if "aggregator" in names:
        raise ConfigError("a table named aggregator.csv would share the aggregator's name; rename the file")
    return tuple(names)


PLAN_FIXES_ELSEWHERE = (
    "fedfair launch --csv rehearses the plan `fedfair init` drafts, unedited: to apply a fix to the plan (its "
    "batch_fraction, a [[schema.columns]] entry), run `fedfair init DIR --csv TABLE --label LABEL`, edit "
    "DIR/aggregator/plan.toml, then follow DIR/README.md; a fix to a table applies here as it is"
)
"""Said under a refusal of `launch --csv`, whose fixes may name the plan that command writes without an edit."""


def rehearsal_workspace(root: Path, tables: Sequence[Path], label: str, *, rounds: int | None = None) -> Workspace:
    """Every file of a federation of `tables` (label column `label`) under `root`, as init and its README make them.

    `rounds` replaces the plan's ``[training] rounds`` (init's default otherwise).

    Raises:
        ConfigError: a table that cannot be read, lacks `label` or does not fit the drafted schema (with the
            check's report), or names as :func:`site_names` refuses.
    """
    import pandas as pd

    from fedfair.datasets.check import check_against
    from fedfair.datasets.schema import Schema
    from fedfair.datasets.tabular import read_table
    from fedfair.runtime.collaborator.config import DEFAULT_TEST_FRACTION
    from fedfair.runtime.new_federation import default_max_colluding, draft_federation_files, write_federation_folder

    sites = site_names(tables)
    read = [read_table(path).rename(columns=str) for path in tables]
    for path, table in zip(tables, read, strict=True):
        if label not in table.columns:
            raise ConfigError(f"{path.name} has no column {label!r}; pass --label with the label column of every table")
    together = pd.concat(read, ignore_index=True, join="inner")
    agree_before_drafting(dict(zip(sites, read, strict=True)), tables, together, label)
    root.mkdir(parents=True, exist_ok=True)
    sample = root / DRAFT_SAMPLE
    together.to_csv(sample, index=False)
    address = f"127.0.0.1:{free_port()}"
    try:
        files = draft_federation_files(
            root,
            sites,
            federation_id=FEDERATION_ID,
            max_colluding=default_max_colluding(len(sites)),
            aggregator=address,
            sample=sample,
            label=label,
        )
    finally:
        sample.unlink(missing_ok=True)
    files = {relative: _rehearsed(relative, text, rounds) for relative, text in files.items()}
    write_federation_folder(root, files)

    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan

    plan_path = root / "aggregator" / "plan.toml"
    plan = load_aggregator_plan(plan_path, check_manifest=False)
    schema = plan.schema
    if not isinstance(schema, Schema):  # draft_federation_files wrote one: a rehearsal always has tables
        raise ConfigError(f"{plan_path} has no [schema]; this is a bug in fedfair launch --csv")
    checks = [
        check_against(
            schema,
            table,
            path.name,
            pinned=False,
            batch_fraction=plan.batch_fraction,
            test_fraction=DEFAULT_TEST_FRACTION,
        )
        for path, table in zip(tables, read, strict=True)
    ]
    for site, checked in zip(sites, checks, strict=True):
        if checked.problems:
            raise ConfigError(
                f"{site}'s table does not fit the drafted [schema]:\n{checked.render()}\n{PLAN_FIXES_ELSEWHERE}"
            )
    for site, checked in zip(sites, checks, strict=True):
        for warning in checked.warnings:
            print(f"fedfair launch: warning: {site} ({checked.source}): {warning}", file=sys.stderr, flush=True)
    for site, path in zip(sites, tables, strict=True):
        destination = root / site / "data" / "table.csv"
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, destination)
    _make_pki_and_pin(root, sites, plan_path)
    configs = {site: root / site / "collaborator.toml" for site in sites}
    return Workspace(root, root / "ca", plan_path, configs, root / "aggregator" / "output", address)


def agree_before_drafting(
    tables: Mapping[str, pd.DataFrame], paths: Sequence[Path], together: pd.DataFrame, label: str
) -> None:
    """Refuse tables that one [schema] would silently misread, before anything is drafted or written.

    `tables` by site (in `paths`' order), `together` their common columns stacked. A site writing the label
    (or a category, where the mapping is certain) in another coding than the others: the drafted classes
    would hold both and the federation would learn two labels
    (:func:`fedfair.datasets.agreement.disagreeing_codings`). A column of numbers with a few text cells at
    one site, or of too many text values to list: the draft would fail naming flags launch does not have,
    so the cells (or the column) are named here with what to do to the tables.

    Raises:
        ConfigError: naming each site, its file, the column and the fix.
    """
    from fedfair.datasets.agreement import disagreeing_codings
    from fedfair.datasets.schema import drafted_features
    from fedfair.datasets.suspects import offenders, text_cells
    from fedfair.datasets.tabular import MAX_CATEGORIES, is_numeric

    files = dict(zip(tables, (path.name for path in paths), strict=True))
    features, _ = drafted_features(together, label, None)
    texts = [name for name in features or together.columns if name != label and not is_numeric(together[name])]
    # Each table named by its site and its file, the file being what the fix edits.
    codings = disagreeing_codings({f"{site} ({files[site]})": table for site, table in tables.items()}, label, texts)
    if codings:
        raise ConfigError(
            "the tables write the same values in different codings, which one [schema] would read as "
            "different values (fedfair launch reads each table as it is):\n"
            + "\n".join(f"  {line}" for line in codings)
        )
    for name in texts:
        distinct = together[name].dropna().nunique()
        if distinct <= MAX_CATEGORIES:
            continue
        cells = {site: text_cells(table[name]) for site, table in tables.items()}
        found = {site: mask for site, mask in cells.items() if mask is not None}
        if found:
            where = "; ".join(
                f"{site} ({files[site]}): {offenders(tables[site][name].to_numpy(dtype=object), mask)}"
                for site, mask in found.items()
            )
            raise ConfigError(
                f"column {name!r} holds numbers but for text cells in {where}; make each a number (or leave it "
                f"empty) in those tables, or remove the column from every table"
            )
        raise ConfigError(
            f"column {name!r} holds {distinct:,} distinct text values, too many to list as categories (limit "
            f"{MAX_CATEGORIES}); remove it from every table (`fedfair init --csv ... --learn-categories` drafts a "
            "federation that learns a column's categories instead)"
        )


def _rehearsed(relative: str, text: str, rounds: int | None) -> str:
    """Init's file `relative` with the edits its README asks for by hand: the manifest named, a loopback listener.

    The plan also takes `rounds` when given.
    """
    text = text.replace('# manifest = "../manifest.toml"', 'manifest = "../manifest.toml"')
    if relative.endswith("plan.toml"):
        text = re.sub(r'(?m)^address = "0\.0\.0\.0:', 'address = "127.0.0.1:', text, count=1)
        if rounds is not None:
            text = re.sub(r"(?m)^rounds = \d+", f"rounds = {rounds}", text, count=1)
    return text


def _make_pki_and_pin(root: Path, sites: Sequence[str], plan_path: Path) -> None:
    """The CA, each party's key, request and certificate, the roster and the pinned plan, as init's README runs them."""
    from fedfair.pki import store
    from fedfair.pki.roster import Roster, pins_from_folders, write_manifest
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan
    from fedfair.runtime.plan.pinning import pin_plan

    ca = root / "ca"
    store.init_ca(ca)
    parties = [("aggregator", "aggregator"), *((site, "collaborator") for site in sites)]
    for party, role in parties:
        certs = root / party / "certs"
        _, request = store.request_certificate(certs, party, role)
        store.sign_certificate(ca, request, out=certs / f"{party}.crt")
        shutil.copyfile(ca / "ca.crt", certs / "ca.crt")
    store.ca_paths(ca)[1].unlink()  # every certificate is signed: nothing in a rehearsal signs again
    plan = load_aggregator_plan(plan_path, check_manifest=False)
    roster = root / "roster.toml"
    pins = pins_from_folders([root / party / "certs" for party, _ in parties])
    write_manifest(
        roster,
        Roster(FEDERATION_ID, tuple(pins), plan.secure_aggregation.max_colluding, plan.quorum.min_collaborators),
    )
    pin_plan(plan_path, roster, root / "manifest.toml")
