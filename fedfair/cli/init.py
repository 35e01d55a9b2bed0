"""``fedfair init DIR --sites a,b,c``: a new federation folder (:mod:`fedfair.runtime.new_federation`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedfair.cli.data import add_drafting_arguments
from fedfair.runtime.new_federation import (
    README,
    check_folder,
    default_max_colluding,
    parse_sites,
    draft_federation_files,
    write_federation_folder,
)
from fedfair.core.tables import ADDRESS_RE


def _init_command(args: argparse.Namespace) -> int:
    sites = parse_sites(args.sites)
    folder: Path = args.folder
    check_folder(folder)  # before drafting a schema from a large sample, not only before writing
    files = draft_federation_files(
        folder,
        sites,
        federation_id=args.federation or folder.resolve().name,
        max_colluding=default_max_colluding(len(sites)) if args.max_colluding is None else args.max_colluding,
        aggregator=args.aggregator,
        sample=args.csv,
        label=args.label,
        features=args.features,
        learn_categories=args.learn_categories,
        auditor=args.auditor,
    )
    write_federation_folder(folder, files)
    for relative in files:
        print(f"wrote {folder / relative}")
    print(f"next: {folder / README} lists the commands, in order")
    return 0


def _address(text: str) -> str:
    match = ADDRESS_RE.fullmatch(text)
    if match is None or not 1 <= int(match.group(2)) <= 65535:
        raise argparse.ArgumentTypeError(f"must be host:port with a port in 1..65535, got {text!r}")
    return text


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def register_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`fedfair init DIR --sites a,b,c [--csv SAMPLE --label COLUMN] [--max-colluding C] [--federation ID] [--auditor N]`."""
    init = subparsers.add_parser(
        "init", help="write a federation folder: the plan, one collaborator config per site, the next commands"
    )
    init.add_argument("folder", type=Path, metavar="DIR", help="the federation folder to create (absent or empty)")
    init.add_argument("--sites", required=True, metavar="A,B,...", help="the institutions' names, comma-separated")
    init.add_argument("--csv", type=Path, metavar="SAMPLE", help="a sample table to draft the plan's [schema] from")
    init.add_argument("--label", metavar="COLUMN", help="the sample's label column (with --csv)")
    add_drafting_arguments(init)
    init.add_argument(
        "--max-colluding",
        type=_non_negative,
        metavar="C",
        help="collaborators that may collude with the aggregator (default 1, or 0 for two sites)",
    )
    init.add_argument("--federation", metavar="ID", help="the federation id (default: DIR's name)")
    init.add_argument(
        "--auditor",
        metavar="NAME",
        help="the auditor institution of the two-verifier input bound: the plan declares the mode "
        '(input_bound = "two_verifiers"), NAME/auditor.toml and the README its steps (default: no input bound)',
    )
    init.add_argument(
        "--aggregator",
        type=_address,
        default="localhost:50051",
        metavar="HOST:PORT",
        help="where the collaborators reach the aggregator (default localhost:50051)",
    )
    init.set_defaults(handler=_init_command)
