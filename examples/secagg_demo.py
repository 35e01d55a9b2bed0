"""Secure aggregation demo: n parties, dropouts before and after masking, exact recovery.

Run ``python examples/secagg_demo.py --help`` (or ``fedfair secagg-demo``) for the options.
"""

import sys

from fedfair.secagg.demo import main

if __name__ == "__main__":
    sys.exit(main())
