"""Run the real aggregator as its own OS process: ``python aggregator_process.py PLAN [--resume]``.

It does exactly what ``fedfair aggregator start --plan PLAN [--resume]`` does (log set-up,
the plan, :func:`fedfair.runtime.aggregator.start.run_aggregator`) without importing every
other command of the CLI first (DP-SGD's libraries alone take seconds), because the attack
matrix starts and kills the aggregator many times. SIGUSR1 writes every thread's stack
to the log, so a run that does not end can say where it is stuck.
"""

from __future__ import annotations

import argparse
import faulthandler
import signal
import sys
from pathlib import Path

from fedfair.runtime.aggregator.start import run_aggregator
from fedfair.runtime.observe.logs import configure_logging
from fedfair.runtime.plan.aggregator_plan import load_aggregator_plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("plan", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    configure_logging()
    run_aggregator(load_aggregator_plan(args.plan), resume=args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
