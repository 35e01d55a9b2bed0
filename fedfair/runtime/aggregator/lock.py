"""One aggregator per output folder: an exclusive lock taken before anything is written.

Two aggregators over one folder would interleave checkpoints and round logs (a
``--resume`` beside a live owner resumes at an older round and overwrites the
newer one's files). The lock is ``fcntl.flock`` on ``aggregator.lock`` in the
folder, which holds the owner's PID for the refusal message. The kernel drops the
lock when its process ends, however it ends (``kill -9`` included), so a stale
file never blocks a restart; the file itself is left in place, since deleting a
lock file lets a third process lock a fresh inode beside the second.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedfair.core.errors import ConfigError
from fedfair.runtime.output_folder import LOCK_NAME


def _holder(fd: int) -> str:
    """The PID the lock file names, as text for a message ('unknown' if it holds none yet)."""
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, 64).decode("ascii", errors="replace").strip()
    return text if text.isdigit() else "unknown"


@contextmanager
def output_lock(folder: Path) -> Iterator[Path]:
    """Hold the exclusive lock on `folder` (created if missing) for the block; yield the lock file.

    Raises ConfigError at once, without waiting, if another process (or another
    aggregator in this process) holds it.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(
                f"another aggregator (PID {_holder(fd)}) is running on {folder} (lock {path}); "
                "stop it first, or give this one another output folder (--output)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        os.fsync(fd)
        yield path
    finally:
        # Closing the descriptor releases the lock.
        os.close(fd)
