"""Secure aggregation demo: n parties, dropouts before and after masking, exact recovery.

Run ``.venv/bin/python examples/secagg_demo.py --help`` (or ``.venv/bin/fedfair secagg-demo``)
for the options, after ``make setup``.
"""

import sys

try:
    from fedfair.secagg.demo import main
except ImportError as error:
    # A plain `python3` has neither fedfair nor its dependencies: say how to run it, not a traceback.
    sys.exit(
        f"secagg_demo: error: this Python cannot import fedfair ({error}); run `make setup`, then "
        "`.venv/bin/python examples/secagg_demo.py` (or `.venv/bin/fedfair secagg-demo`)"
    )

if __name__ == "__main__":
    sys.exit(main())
