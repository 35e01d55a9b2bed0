"""``python -m fedfair.cli``: the `fedfair` command."""

import sys

from fedfair.cli import main

sys.exit(main())
