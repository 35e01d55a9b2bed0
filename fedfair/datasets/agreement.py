"""Whether the sites' tables agree before round 1: one coding of each value, and tables a federation can use.

A plan's ``[schema]`` lists the label's classes and each categorical column's categories; a site
whose table writes the same facts another way (``yes``/``no`` where the plan says ``1``/``0``,
``M``/``F`` for ``Male``/``Female``) would otherwise train as if its rows meant something else.
This module finds such a coding, proposes the mapping (:func:`proposed_mapping`) and writes it as
the line a site puts in its ``collaborator.toml`` (:func:`recode_line`, applied by :func:`recoded`).

It also holds the checks that need the whole site's table rather than its cells
(:func:`site_problems`, :func:`site_warnings`, :func:`batch_shortfall`), and, for a rehearsal
that sees every table, :func:`disagreeing_codings`. Why each is a refusal or a warning:
docs/usage.md, "Sites agree before round 1".
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Collection, Mapping, Sequence

import pandas as pd

from fedfair.core.errors import ConfigError
from fedfair.datasets.schema import Schema, toml_value
from fedfair.datasets.suspects import holds_two_codings, polarity
from fedfair.datasets.tabular import as_text

logger = logging.getLogger("fedfair.datasets")

Recode = Mapping[str, Mapping[str, str]]
"""A site's ``[data.recode]``: column -> {the site's value -> the plan's value}, compared as cell text."""

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def proposed_mapping(site: Sequence[str], plan: Sequence[str]) -> tuple[dict[str, str], bool] | None:
    """A mapping of every value in `site` onto one in `plan`, and whether it is certain; None when none is seen.

    Certain: the values differ only in case and surrounding spaces; or every value on both sides is
    a yes/no spelling (``no`` -> ``0``, ``True`` -> ``yes``), at most one of each meaning per side; or each
    site value is an abbreviation (a case-folded prefix) of exactly one plan value, or the reverse
    (``M`` -> ``Male``). Uncertain: two values on each side, paired in sorted order, which the reader must
    check (``died``/``survived`` onto ``0``/``1`` happens to pair right; a reversed coding would not).
    """
    site, plan = sorted(set(site)), sorted(set(plan))
    if not site or not plan:
        return None
    folded = {value.strip().casefold(): value for value in plan}
    if len(folded) == len(plan) and all(value.strip().casefold() in folded for value in site):
        return {value: folded[value.strip().casefold()] for value in site}, True
    meanings = {value: polarity(value) for value in plan}
    if None not in meanings.values() and len(set(meanings.values())) == len(plan):
        by_meaning = {meaning: value for value, meaning in meanings.items()}
        if all(polarity(value) in by_meaning for value in site):
            return {value: by_meaning[polarity(value)] for value in site}, True
    abbreviated = {value: _abbreviates(value, plan) for value in site}
    matched = [match for match in abbreviated.values() if match is not None]
    if len(matched) == len(site) and len(set(matched)) == len(matched):
        return {value: match for value, match in abbreviated.items() if match is not None}, True
    if len(site) == len(plan) == 2:
        return dict(zip(site, plan, strict=True)), False
    return None


def _abbreviates(value: str, plan: Sequence[str]) -> str | None:
    """The one value of `plan` that `value` abbreviates or is abbreviated by (case-folded prefix), else None."""
    short = value.strip().casefold()
    if not short:
        return None
    matches = [
        listed
        for listed in plan
        if listed.strip().casefold().startswith(short) or short.startswith(listed.strip().casefold() or "\0")
    ]
    return matches[0] if len(matches) == 1 else None


def _key(name: str) -> str:
    """A TOML key: bare where TOML allows it, quoted otherwise."""
    return name if _BARE_KEY.fullmatch(name) else toml_value(name)


def recode_line(column: str, mapping: Mapping[str, str]) -> str:
    """The ``[data.recode]`` line that maps `column`'s values, e.g. ``[data.recode] y = { no = "0", yes = "1" }``."""
    pairs = ", ".join(f"{_key(site)} = {toml_value(plan)}" for site, plan in mapping.items())
    return f"[data.recode] {_key(column)} = {{ {pairs} }}"


def _listed(values: Collection[str]) -> str:
    return ", ".join(map(toml_value, sorted(values)))


def coding_advice(column: str, site: Sequence[str], plan: Sequence[str], *, certain_only: bool) -> str | None:
    """The ``[data.recode]`` line that maps `site`'s values onto `plan`'s, to put in a site's collaborator.toml.

    None when no mapping is seen, or (with `certain_only`) when the one seen is not certain
    (:func:`proposed_mapping`): a category column whose values all differ from the plan's may be a
    new place rather than a new spelling, so only a certain mapping is offered for one.
    """
    proposal = proposed_mapping(site, plan)
    if proposal is None or (certain_only and not proposal[1]):
        return None
    mapping, certain = proposal
    line = recode_line(column, mapping)
    return f"map them in this institution's collaborator.toml, {line}{_unless(mapping, certain)}, or recode the cells"


def _unless(mapping: Mapping[str, str], certain: bool) -> str:
    """For a mapping paired in sorted order only: the pairs to check ("" for a certain one)."""
    if certain:
        return ""
    pairs = " and ".join(f"{toml_value(ours)} means {toml_value(theirs)}" for ours, theirs in mapping.items())
    return f" (paired in sorted order: check that {pairs}, and swap them if not)"


def recoded(table: pd.DataFrame, recode: Recode, source: str) -> pd.DataFrame:
    """`table` with each ``[data.recode]`` column's cells mapped (compared as text; unmapped cells kept).

    A recoded column holds text afterwards (numeric columns convert it back when they are read).
    A mapping none of whose values occurs in its column changes nothing and is logged, since it is
    most often written the wrong way round (the plan's value on the left).

    Raises:
        ConfigError: a recoded column the table lacks, naming the table's columns.
    """
    if not recode:
        return table
    table = table.rename(columns=str)
    for column, mapping in recode.items():
        if column not in table.columns:
            raise ConfigError(
                f"[data.recode] maps column {column!r}, which {source} lacks; fix the column name "
                f"(table columns: {', '.join(list(table.columns)[:30])})"
            )
        text = as_text(table[column])
        if not any(value in mapping for value in text if value is not None):
            logger.warning(
                "[data.recode] %s: none of %s occurs in %s, so nothing is mapped; the left side is this table's "
                "value, the right the plan's",
                column,
                _listed(list(mapping)),
                source,
            )
        mapped = [mapping.get(value, value) if value is not None else None for value in text]
        table[column] = pd.Series(mapped, index=table.index, dtype=object)
    return table


# ---------------------------------------------------------------------------------------------------------------------
# The whole table: what a site's cells cannot show one by one


def site_problems(schema: Schema, table: pd.DataFrame) -> list[str]:
    """Refusals about the table as a whole: a feature column empty in every row. One line each, no table name.

    A column this site never filled would, under ``missing = "impute"``, take the federation's mean in
    every row: the model would use, here, a value nobody measured. It is most often an export that
    lost the column; the fix is the table, or the column out of the [schema] for every site.
    """
    table = table.rename(columns=str)
    if len(table) == 0:
        return []
    problems = []
    for column in schema.columns:
        if column.name in table.columns and bool(table[column.name].isna().all()):
            problems.append(
                f"column {column.name!r} is empty in all {len(table):,} rows: the model would read the "
                "federation's average in its place for every row here; fill the column from this institution's "
                "records, or remove its [[schema.columns]] entry from the plan (every site then drops it)"
            )
    return problems


def site_warnings(schema: Schema, table: pd.DataFrame) -> list[str]:
    """What the table legitimately holds but the operator should know: a label of one class only.

    A site may well see one outcome only (a clinic whose patients all recovered); it still trains
    the shared model, but its held-out rows measure the model on that class alone.
    """
    table = table.rename(columns=str)
    if schema.label not in table.columns:
        return []
    present = sorted({value for value in as_text(table[schema.label]) if value is not None})
    if len(present) != 1:
        return []
    others = [value for value in schema.classes if value != present[0]]
    return [
        f"label {schema.label!r} holds only the class {toml_value(present[0])} ({len(table):,} rows): this site "
        f"still trains the shared model, but its local steps see no {_listed(others)} and its held-out rows "
        "measure the model on one class only; check that this is the site's truth, not a filtered export"
    ]


def fewest_training_rows(batch_fraction: float) -> int:
    """The fewest training rows n with round(batch_fraction * n) >= 1: the smallest site a batch fits."""
    rows = max(math.ceil(0.5 / batch_fraction), 1)
    while round(batch_fraction * rows) < 1:  # round() halves to even: 0.5 rounds to 0
        rows += 1
    return rows


def training_rows(rows: int, test_fraction: float) -> int:
    """The training rows a table of `rows` keeps with `test_fraction` held out, as split_rows cuts one group."""
    return rows - min(round(test_fraction * rows), rows - 1)


def batch_shortfall(train_rows: int, batch_fraction: float, test_fraction: float) -> str | None:
    """The refusal of a site too small for the plan's batch, or None when round(batch_fraction * rows) >= 1.

    b_k = round(batch_fraction * n_k) is the site's mini-batch (and, under declared weights, its weight).
    Below the fewest rows it rounds to 0 and is raised to 1, so the site would take steps of a size the
    plan never gave it, on a handful of rows, and its held-out part would be a row or two.
    """
    if round(batch_fraction * train_rows) >= 1:
        return None
    fewest = fewest_training_rows(batch_fraction)
    total = next(rows for rows in range(fewest, 100 * fewest + 2) if training_rows(rows, test_fraction) >= fewest)
    return (
        f"{train_rows:,} training rows are too few for the plan's batch: [training] batch_fraction = "
        f"{batch_fraction:g} gives round({batch_fraction:g} x {train_rows}) = 0 rows a step; a site needs at "
        f"least {fewest:,} training rows ({total:,} rows with {test_fraction:g} held out): merge this table with "
        f"another institution's, or raise the plan's batch_fraction above 0.5 / {train_rows} = {0.5 / train_rows:.3g}"
    )


# ---------------------------------------------------------------------------------------------------------------------
# Every site's table at once (a rehearsal's operator sees them all)


def disagreeing_codings(tables: Mapping[str, pd.DataFrame], label: str, columns: Sequence[str]) -> list[str]:
    """Each site whose `label` (or text column of `columns`) is written in another coding than the others'.

    One line each: the site, the column, both codings and the mapping. A site's label values that
    share none with every other site's are another coding (always named, with the mapping in sorted
    order where none is certain); a category column's only with a certain mapping (a site's places may
    simply be its own). When every site disagrees (two sites), the first table's coding is the reference.
    The label's values across all tables forming two codings of one yes/no fact (``0``, ``1``, ``no``,
    ``yes``) are named too.
    """
    lines = []
    for column in [label, *(name for name in columns if name != label)]:
        values = {
            site: {value for value in as_text(table.rename(columns=str)[column]) if value is not None}
            for site, table in tables.items()
            if column in table.rename(columns=str).columns
        }
        found = _disjoint_sites(values, column, certain_only=column != label)
        if not found and column == label:
            found = _two_codings(values, column)
        lines += found
    return lines


def _disjoint_sites(values: Mapping[str, set[str]], column: str, *, certain_only: bool) -> list[str]:
    sites = [site for site, held in values.items() if held]
    disjoint = [
        site for site in sites if values[site].isdisjoint(set().union(*(values[o] for o in sites if o != site)))
    ]
    if len(sites) < 2 or not disjoint:
        return []
    if len(disjoint) == len(sites):
        disjoint = disjoint[1:]  # nobody agrees: the first table's coding is the one the others map to
    lines = []
    for site in disjoint:
        others = [o for o in sites if o != site and o not in disjoint]
        reference = set().union(*(values[o] for o in others))
        proposal = proposed_mapping(sorted(values[site]), sorted(reference))
        if proposal is None or (certain_only and not proposal[1]):
            continue
        mapping, certain = proposal
        arrows = ", ".join(f"{toml_value(ours)} -> {toml_value(theirs)}" for ours, theirs in mapping.items())
        lines.append(
            f"{site} writes {column!r} as {_listed(values[site])} where {', '.join(others)} write "
            f"{_listed(reference)}: recode the cells of {site}, {arrows}{_unless(mapping, certain)} (or, in a real "
            f"federation, its collaborator.toml maps them: {recode_line(column, mapping)})"
        )
    return lines


def _two_codings(values: Mapping[str, set[str]], column: str) -> list[str]:
    """The label's values across sites as two yes/no codings (e.g. 0/1 and no/yes), one line naming who holds which."""
    if not holds_two_codings(sorted(set().union(*values.values()))):
        return []
    holders = "; ".join(f"{site}: {_listed(held)}" for site, held in values.items() if held)
    return [
        f"{column!r} holds two codings of one yes/no label across the tables ({holders}); write it one way in "
        f"every table (each site of a real federation can map its own with a [data.recode] {_key(column)} line "
        "in its collaborator.toml)"
    ]
