"""A privacy-ledger folder of the attack matrix's own, so its runs neither read nor spend anyone else's budget.

A ledger follows an institution's data, outside its site's folder (:mod:`fedfair.privacy.ledger_home`), and the
matrix's federations reuse site names and tables: without a folder of their own, a run's sites would charge, and
its rows would read, the releases of every earlier run with the same data on this machine (the user's state
folder), and would spend a real institution's budget.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from fedfair.privacy.ledger_home import LEDGER_DIR_VARIABLE
from fedfair.runtime.local.workspace import Workspace


@contextmanager
def own_ledgers(folder: Path) -> Iterator[Path]:
    """Within this block, every site charges its privacy ledger in `folder`, whatever ``$FEDFAIR_LEDGER_DIR`` says.

    Processes started within the block inherit it; the variable is as it was after the block.
    """
    before = os.environ.get(LEDGER_DIR_VARIABLE)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ[LEDGER_DIR_VARIABLE] = str(folder)
    try:
        yield folder
    finally:
        if before is None:
            del os.environ[LEDGER_DIR_VARIABLE]
        else:
            os.environ[LEDGER_DIR_VARIABLE] = before


def federation_ledgers(workspace: Workspace) -> AbstractContextManager[Path]:
    """:func:`own_ledgers` in `workspace`'s folder: the ledgers of this federation's sites alone.

    A row that runs several federations on the same sites' data (a forged run, then a curious one) reads in each
    only what that federation charged.
    """
    return own_ledgers(workspace.root / "ledgers")
