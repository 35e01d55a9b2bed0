"""Writing files so that a crash leaves the old version or the whole new one, never half.

Reading JSON state back within bounds, so a damaged or hostile file is one clear error, never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from fedfair.core.errors import ConfigError


def atomic_write(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write `path` through `write(handle)`: temporary file, fsync, rename, fsync of the folder.

    Raises:
        OSError: as the system raised it, naming `path` where the system named no file (a ``write`` that
            fails on a full disk names none), with the temporary file removed and `path` as it was.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError) and error.errno is not None and error.filename is None:
            # Whoever reads the error must learn which disk filled (or failed), not only that one did.
            raise type(error)(error.errno, error.strerror, str(path)) from error
        raise
    # The rename itself must reach the disk, or a power cut could bring the old name back.
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


SECRET_BYTES = 32
"""The size of a secret :func:`kept_secret` keeps."""


def kept_secret(path: Path, fix: str) -> bytes:
    """The secret kept at `path`: drawn once from the OS's CSPRNG and written there (0600, atomically) when absent.

    Raises:
        ConfigError: the file is not a :data:`SECRET_BYTES`-byte secret, naming it and `fix`.
    """
    if not path.exists():
        atomic_write(path, lambda stream: stream.write(os.urandom(SECRET_BYTES)))
    secret = path.read_bytes()
    if len(secret) != SECRET_BYTES:
        raise ConfigError(f"{path}: not a {SECRET_BYTES}-byte secret; {fix}")
    return secret


MAX_STATE_BYTES = 16 << 20
"""The largest state file :func:`read_json` reads: far above any fedfair writes (a few KiB to a few
MiB), far below what would hurt a process that reads it whole."""

MAX_JSON_DEPTH = 32
"""The deepest nesting :func:`read_json` admits: fedfair's state files nest three or four levels,
and Python's parser recurses once per level (100,000 levels end in RecursionError)."""

MAX_JSON_INTEGER = 2**53
"""The largest integer magnitude :func:`read_json` admits: every integer up to it is exact as a
float64 too, and no count, round or step number fedfair keeps comes near it."""

_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


class _OutOfRange:
    """A number that parsed but may not be kept (not finite, or an integer too large).

    The walk after parsing names the field that holds it.
    """

    def __init__(self, text: str) -> None:
        self.text = text


def _number(text: str, parse: Callable[[str], int | float]) -> int | float | _OutOfRange:
    if len(text) > 40:  # no admissible number is this long, and int() of 10,000 digits is slow
        return _OutOfRange(text[:20] + "...")
    value = parse(text)
    if not math.isfinite(value) or (isinstance(value, int) and abs(value) > MAX_JSON_INTEGER):
        return _OutOfRange(text)
    return value


def _constant(text: str) -> _OutOfRange:
    return _OutOfRange(text)  # NaN, Infinity, -Infinity: not JSON, and never a value fedfair writes


def parse_json(
    payload: bytes, source: str, fix: str, *, max_bytes: int = MAX_STATE_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """`payload` as JSON, bounded.

    At most `max_bytes` long and `max_depth` deep, every number finite and every integer within
    +-MAX_JSON_INTEGER.

    Raises:
        ConfigError: for anything else, naming `source`, the field (``history[0][2]``) where one can be
            named, the problem and `fix`; never a RecursionError, an OverflowError or a traceback.
    """
    if len(payload) > max_bytes:
        raise ConfigError(f"{source}: {len(payload)} bytes, above the {max_bytes}-byte limit of such a file; {fix}")
    depth = deepest = 0
    for bracket in _BRACKET.finditer(_STRING.sub(b'""', payload)):
        depth += 1 if bracket.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    if deepest > max_depth:
        raise ConfigError(f"{source}: nested {deepest} levels deep, above the limit of {max_depth}; {fix}")
    try:
        value = json.loads(
            payload,
            parse_int=lambda text: _number(text, int),
            parse_float=lambda text: _number(text, float),
            parse_constant=_constant,
        )
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ConfigError(f"{source}: not valid JSON ({error}); {fix}") from None
    _check_numbers(value, "", source, fix)
    return value


def _check_numbers(value: Any, where: str, source: str, fix: str) -> None:
    """Raise for the first out-of-range number in `value` (depth is bounded, so recursion is safe)."""
    if isinstance(value, _OutOfRange):
        raise ConfigError(
            f"{source}: field {where or '(the whole file)'} = {value.text} is out of range (a finite number, "
            f"integers within +-2^53); {fix}"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _check_numbers(item, f"{where}.{key}" if where else str(key), source, fix)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_numbers(item, f"{where}[{index}]", source, fix)


def read_json(path: Path, fix: str, *, max_bytes: int = MAX_STATE_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON state file at `path`, read with :func:`parse_json`'s bounds (the size checked before a byte is read).

    Raises:
        ConfigError: naming `path` and `fix`, when the file cannot be read or breaks the bounds.
    """
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ConfigError(f"{path}: {size} bytes, above the {max_bytes}-byte limit of such a file; {fix}")
        payload = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"{path}: unreadable ({error.strerror or error}); {fix}") from None
    return parse_json(payload, str(path), fix, max_bytes=max_bytes, max_depth=max_depth)
