"""How fast the commands start, and how much a first federation prints.

Prints JSON (and writes it with --json PATH):
  {"repeats": n, "help_seconds": {COMMAND: {"wall": x, "cpu": x}}, "heavy_modules": {COMMAND: [...]},
   "load_seconds": {DATASET: {"wall": x, "cpu": x}}, "demo": {"lines": n, "seconds": x}}
`help_seconds` is the median over `--repeats` runs of `fedfair ... --help` in a fresh interpreter,
the commands interleaved so that a busy machine slows all alike; "cpu" is the child's user + system
time (what the host's other work cannot inflate), "wall" the elapsed time. `heavy_modules` lists
which of torch, opacus, grpc and pandas each command imported (none is the target).
`load_seconds` is the median over `--repeats` fresh interpreters of `load_dataset("adult")` alone (the
imports before it not counted), the bundled dataset every demo and first federation parses: target under
2 s. (A speed target, measured here rather than asserted in the test suite, where a loaded machine
would fail it.)
`demo` (left out with --quick) runs `fedfair launch --keep`, what `make demo` runs, and counts the
lines it prints (target: under 60). Targets: every `--help` under 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from published import publish

COMMANDS = (
    ("fedfair",),
    ("aggregator", "start"),
    ("collaborator", "start"),
    ("data", "check"),
    ("init",),
    ("predict",),
    ("simulate",),
    ("reference",),
    ("sweep",),
    ("reproduce",),
)
HEAVY = ("torch", "opacus", "grpc", "pandas")
PROBE = (
    "import sys; sys.argv = ['fedfair', *sys.argv[1:], '--help']\n"
    "from fedfair.cli import main\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
    f"print('HEAVY', *[m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)"
)


def timed(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, child CPU seconds, stderr) of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.stderr


def help_times(repeats: int) -> tuple[dict[str, dict[str, float]], dict[str, list[str]]]:
    runs: dict[str, list[tuple[float, float]]] = {" ".join(command): [] for command in COMMANDS}
    heavy: dict[str, list[str]] = {}
    for _ in range(repeats):
        for command in COMMANDS:
            name = " ".join(command)
            args = [] if command == ("fedfair",) else list(command)
            wall, cpu, err = timed([sys.executable, "-c", PROBE, *args])
            runs[name].append((wall, cpu))
            line = next((text for text in err.splitlines() if text.startswith("HEAVY")), "HEAVY ?")
            heavy[name] = line.split()[1:]
    medians = {
        name: {"wall": statistics.median(w for w, _ in values), "cpu": statistics.median(c for _, c in values)}
        for name, values in runs.items()
    }
    return medians, heavy


LOAD_PROBE = (
    "import sys, time\n"
    "from fedfair.datasets import load_dataset\n"
    "wall, cpu = time.perf_counter(), time.process_time()\n"
    "load_dataset(sys.argv[1])\n"
    "print('LOAD', time.perf_counter() - wall, time.process_time() - cpu)"
)
LOADED = ("adult",)
"""The datasets whose load is timed: the bundled one (the others are downloaded on first use)."""


def load_times(repeats: int) -> dict[str, dict[str, float]]:
    """The median wall and CPU seconds of loading each of LOADED in a fresh interpreter."""
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in LOADED}
    for _ in range(repeats):
        for name in LOADED:
            done = subprocess.run([sys.executable, "-c", LOAD_PROBE, name], capture_output=True, text=True, check=True)
            line = next(text for text in done.stdout.splitlines() if text.startswith("LOAD "))
            wall, cpu = (float(word) for word in line.split()[1:])
            runs[name].append((wall, cpu))
    return {
        name: {"wall": statistics.median(w for w, _ in values), "cpu": statistics.median(c for _, c in values)}
        for name, values in runs.items()
    }


def demo_lines() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "fedfair.cli", "launch", "--keep"],
            capture_output=True,
            text=True,
            check=False,
            cwd=folder,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        seconds = time.perf_counter() - started
    printed = (done.stdout + done.stderr).splitlines()
    return {"lines": len(printed), "seconds": round(seconds, 1), "exit_status": done.returncode}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="leave out the demo (about a minute)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    seconds, heavy = help_times(args.repeats)
    document: dict[str, object] = {"repeats": args.repeats, "help_seconds": seconds, "heavy_modules": heavy}
    document["load_seconds"] = load_times(args.repeats)
    if not args.quick:
        document["demo"] = demo_lines()
    publish(document, args.json, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
