"""Measure again every result the benchmarks page shows, each with the command that measured it.

Each ``benchmarks/results/NAME.json`` records the command that wrote it (:mod:`published`), flags
included: ``--quick`` runs, the 16-bit and 10^8-parameter variants, a 51-site federation. This
script runs each of those commands again from the repository root, with ``--json`` pointed at the
file itself, so ``make bench`` regenerates exactly the figures ``docs/benchmarks.md`` is made from
and no result on the page is a one-off that no target reproduces. Add a benchmark's run to the page
by running it once with ``--json benchmarks/results/NAME.json``; from then on this keeps it fresh.

``--list`` prints the commands without running them; ``--only NAME [NAME ...]`` reruns some.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent


@dataclass(frozen=True)
class Rerun:
    """One result file and the command that measures it again, as argv from the repository root."""

    name: str
    argv: tuple[str, ...]


def rerun_of(path: Path, python: str = sys.executable) -> Rerun:
    """The command recorded in `path`, run by `python`, writing its JSON to `path` itself.

    Raises:
        ValueError: the file records no command, or one that is not a benchmark script writing JSON.
    """
    document = json.loads(path.read_text())
    recorded = (document.get("provenance") or {}).get("command")
    if not isinstance(recorded, str):
        raise ValueError(f"{path.name} records no command; run its benchmark once with --json {path}")
    words = shlex.split(recorded)
    if len(words) < 2 or words[0] != "python" or not words[1].startswith("benchmarks/") or "--json" not in words:
        raise ValueError(f"{path.name} records {recorded!r}, not `python benchmarks/SCRIPT ... --json PATH`")
    script = ROOT / words[1]
    if not script.is_file():
        raise ValueError(f"{path.name} was written by {words[1]}, which no longer exists")
    at = words.index("--json")
    arguments = [*words[2:at], "--json", str(path.relative_to(ROOT)), *words[at + 2 :]]
    return Rerun(path.stem, (python, words[1], *arguments))


def reruns(names: Sequence[str] = ()) -> list[Rerun]:
    """Every result file's rerun in name order, or only those named."""
    paths = sorted(RESULTS.glob("*.json"))
    known = {path.stem for path in paths}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ValueError(f"no result file named {', '.join(unknown)} in {RESULTS}; known: {', '.join(sorted(known))}")
    return [rerun_of(path) for path in paths if not names or path.stem in names]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print each command; run nothing")
    parser.add_argument("--only", nargs="+", default=(), metavar="NAME", help="rerun only these result files")
    args = parser.parse_args(argv)
    try:
        planned = reruns(args.only)
    except ValueError as error:
        print(f"rerun: {error}", file=sys.stderr)
        return 2
    for rerun in planned:
        print(shlex.join(rerun.argv), flush=True)
        if not args.list and subprocess.run(rerun.argv, cwd=ROOT, stdout=subprocess.DEVNULL).returncode != 0:
            print(f"rerun: {rerun.name} failed; the other result files are as they were", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
