"""The one reader of TOML files and tables: every value's type and range, every key against the known ones.

The aggregator's plan, a collaborator's config, the manifest, ``fedfair init`` and the data
check read TOML here (:func:`read_toml`, :func:`parse_toml`; nothing else in fedfair
imports tomllib), and the plan's sections and the settings the aggregator shares (JSON,
read the same way) go through :class:`Table`. Standard library only. An unknown section or key is
refused with the closest known name as a suggestion; every error is one
:class:`~fedfair.core.errors.ConfigError` line naming the file, the section, the
problem and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, NoReturn, TypeGuard

from fedfair.core.errors import ConfigError

ADDRESS_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):(\d{1,5})")

SHOWN_CHARACTERS = 200
"""How much of a refused value an error shows: enough to recognise it, never a 400-digit line."""


class _Required(enum.Enum):
    """The default of a key that must be given (an enum, so that the type checker knows it)."""

    REQUIRED = enum.auto()


REQUIRED: Final = _Required.REQUIRED
Required = Literal[_Required.REQUIRED]


def positive_integer(value: object) -> bool:
    """Whether `value` is an integer above 0 (a TOML or JSON boolean is not an integer here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def finite_number(value: object) -> TypeGuard[int | float]:
    """Whether `value` is a finite int or float (never a boolean; a 400-digit integer is not, as a float)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(_as_float(value))


def json_value(value: object) -> bool:
    """Whether `value` survives the trip to JSON and back unchanged (what every party receives)."""
    if isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(json_value(item) for item in value)
    if isinstance(value, Mapping):
        return all(isinstance(key, str) and json_value(item) for key, item in value.items())
    return False


_HIDDEN_CHARACTERS = re.compile("[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
"""Characters that JSON leaves as they are but a terminal would act on or hide (controls, bidi marks)."""


def shown(value: object) -> str:
    """A value as it would be written in TOML (true, "text", [1, 2]), cut to SHOWN_CHARACTERS.

    Letters of any script stay as they are, so that a user's category label ("São Paulo") is
    shown exactly; only the characters a terminal would act on or hide are escaped.
    """
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):  # ValueError: an integer past Python's 4,300-digit limit of str()
        text = repr(value) if not isinstance(value, int) else "an integer of more than 4,300 digits"
    text = _HIDDEN_CHARACTERS.sub(lambda match: f"\\u{ord(match.group()):04x}", text)
    return text if len(text) <= SHOWN_CHARACTERS else f"{text[: SHOWN_CHARACTERS - 3]}... ({len(text)} characters)"


def _as_float(value: int | float) -> float:
    """`value` as a float; an integer too large for one (a 400-digit plan value) as infinity, not OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def closest(word: str, choices: Sequence[str]) -> str | None:
    """The choice `word` is most likely a misspelling of (difflib's closest match), or None."""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return close[0] if close else None


def suggest(word: str, choices: Sequence[str]) -> str:
    """'did you mean ...?' for the closest choice, else the list of choices."""
    close = closest(word, choices)
    return f"did you mean '{close}'?" if close is not None else f"known: {', '.join(choices)}"


def field_names(cls: type) -> tuple[str, ...]:
    """The keys of a section that is read into the dataclass `cls`."""
    return tuple(field.name for field in dataclasses.fields(cls))


def check_sections(source: str, data: Mapping[str, object], known: tuple[str, ...]) -> None:
    """Refuse a section that is not one of `known`."""
    for section in data:
        if section not in known:
            raise ConfigError(f"{source}: unknown section [{section}]; {suggest(section, list(known))}")


def parse_toml(text: str, source: Path | str) -> dict[str, Any]:
    """The content of TOML `text` read from `source`, or one line saying what to fix."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{source}: not valid TOML ({error}); fix the syntax") from None


def read_toml(path: Path | str) -> tuple[Path, dict[str, Any]]:
    """The resolved path and the content of a TOML file, or one line saying what to fix."""
    path = Path(path)
    try:
        text = path.read_bytes().decode()  # UTF-8, as TOML requires, whatever the locale
    except FileNotFoundError:
        raise ConfigError(f"{path} not found; copy the template next to it and edit it") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read it as TOML ({error}); give a TOML file") from None
    return path.resolve(), parse_toml(text, path)


def parse_json_object(text: str | bytes, source: object, fix: str) -> dict[str, Any]:
    """The JSON object in `text` (a manifest's pinned settings, the aggregator's plan).

    Raises:
        ConfigError: naming `source` and `fix`, when `text` is not JSON or not an object.
    """
    try:
        data = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError):  # ValueError: a 5,000-digit integer; Recursion: deep
        raise ConfigError(f"{source}: not valid JSON; {fix}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object; {fix}")
    return data


class Table:
    """One TOML table, read key by key; every error names the file and the section.

    Every refusal reads ``<file>: [<section>] <problem>; <fix>``, the file and the table
    first, so that a user knows where to look before what to change. A key with a default
    may be left out. An optional key without a default is read only when :meth:`given`
    says it is there, so each reader returns a plain value.
    """

    def __init__(
        self, source: str, section: str, data: object, keys: tuple[str, ...], *, entry: int | None = None
    ) -> None:
        """Check that `data` is a table whose keys are all among `keys`.

        Args:
            source: the file (or message) the table comes from, named first in every error.
            section: the table's dotted name, e.g. ``training`` or ``schema.columns``.
            data: the table as read from TOML or JSON.
            keys: the keys it may hold.
            entry: the table's position (from 1) in an array of tables (``[[schema.columns]]``).

        Raises:
            ConfigError: `data` is not a table, or holds an unknown key (named with the closest known one).
        """
        self.source, self.section = source, section
        header = f"[[{section}]]" if entry is not None else f"[{section}]"
        self.where = f"{header} #{entry}" if entry is not None else header
        """How errors name the table: ``[training]``, or ``[[schema.columns]] #2`` for an array's entry."""
        if not isinstance(data, Mapping):
            self.fail(f"{self.where} must be a table (a {header} header with key = value lines), got {shown(data)}")
        self.data: Mapping[str, object] = data
        for key in data:
            if key not in keys:
                self.fail(f"{self.where} unknown key '{key}'; {suggest(key, keys)}")

    @classmethod
    def of(cls, source: str, data: Mapping[str, object], section: str, keys: tuple[str, ...]) -> Table:
        """The table `section` of a file's `data` (empty when the file has none)."""
        return cls(source, section, data.get(section, {}), keys)

    def fail(self, message: str) -> NoReturn:
        """Raise a ConfigError: `message`, prefixed with the file it is about."""
        raise ConfigError(f"{self.source}: {message}")

    def bad(self, key: str, value: object, expected: str) -> NoReturn:
        """Refuse `key`'s `value`: what was expected, what was given, and that the value is the fix."""
        self.fail(f"{self.where} {key} must be {expected}, got {shown(value)}; fix the value")

    def given(self, key: str) -> bool:
        """Whether `key` has a value (shared settings spell an unset optional key as JSON null)."""
        return self.data.get(key) is not None

    def value(self, key: str, default: object = REQUIRED, *, expected: str) -> object:
        """`key`'s value as given, unchecked, for a reader that checks it itself; `default` if absent.

        Raises:
            ConfigError: the key is required (no `default`) and absent; the fix names `expected`.
        """
        if key not in self.data:
            if default is REQUIRED:
                self.fail(f"{self.where} missing key '{key}'; add {key} = <{expected}>")
            return default
        return self.data[key]

    def integer(
        self, key: str, default: int | Required = REQUIRED, *, low: int | None = None, high: int | None = None
    ) -> int:
        """An integer (never a boolean) within [`low`, `high`] where given; `default` if the key is absent.

        Raises:
            ConfigError: the key is required and absent, or its value is not such an integer.
        """
        expected = (
            "an integer" + (f" >= {low}" if low is not None else "") + (f" <= {high}" if high is not None else "")
        )
        value = self.value(key, default, expected=expected)
        if (
            not isinstance(value, int)
            or isinstance(value, bool)
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            self.bad(key, value, expected)
        return value

    def number(
        self,
        key: str,
        default: float | Required = REQUIRED,
        *,
        check: Callable[[float], bool] = lambda _: True,
        expected: str,
    ) -> float:
        """A finite number (an integer is taken as a float) for which `check` holds; `expected` says which.

        Raises:
            ConfigError: the key is required and absent, or its value is not such a number.
        """
        value = self.value(key, default, expected=expected)
        if not finite_number(value):
            self.bad(key, value, expected)
        number = float(value)
        if not check(number):
            self.bad(key, value, expected)
        return number

    def boolean(self, key: str, default: bool | Required = REQUIRED) -> bool:
        """A TOML boolean (never a number or a string); `default` if the key is absent."""
        value = self.value(key, default, expected="true or false")
        if not isinstance(value, bool):
            self.bad(key, value, "true or false")
        return value

    def string(
        self,
        key: str,
        default: str | Required = REQUIRED,
        *,
        choices: tuple[str, ...] = (),
        pattern: re.Pattern[str] | None = None,
        expected: str = "a non-empty string",
    ) -> str:
        """A non-empty string, one of `choices` or matching `pattern` where given.

        Raises:
            ConfigError: the key is required and absent, or its value does not fit; an unknown choice
                is answered with the nearest known one.
        """
        if choices:
            expected = "one of " + ", ".join(f'"{choice}"' for choice in choices)
        value = self.value(key, default, expected=expected)
        if (
            not isinstance(value, str)
            or not value
            or (choices and value not in choices)
            or (pattern is not None and not pattern.fullmatch(value))
        ):
            if isinstance(value, str) and choices:
                self.fail(f"{self.where} {key} = {shown(value)} is not known; {suggest(value, list(choices))}")
            self.bad(key, value, expected)
        return value

    def items(self, key: str, accept: Callable[[object], bool], expected: str) -> list[Any]:
        """A required list (empty too) whose every item `accept` takes; `expected` says which.

        Raises:
            ConfigError: the key is absent, or its value is not such a list.
        """
        value = self.value(key, expected=expected)
        if not isinstance(value, list) or not all(accept(item) for item in value):
            self.bad(key, value, expected)
        return value

    def strings(self, key: str, expected: str = "a non-empty list of strings") -> tuple[str, ...]:
        """A required, non-empty list of non-empty strings; `expected` says what they are."""
        value = self.items(key, lambda item: isinstance(item, str) and bool(item), expected)
        if not value:
            self.bad(key, value, expected)
        return tuple(value)

    def entries(self, key: str, keys: tuple[str, ...]) -> list[Table]:
        """The tables of a required, non-empty array of tables (``[[schema.columns]]``), each read like this one.

        Raises:
            ConfigError: the key is absent or not such a list, or an entry is refused by :class:`Table`.
        """
        section = f"{self.section}.{key}"
        value = self.data.get(key)
        if not isinstance(value, list) or not value:
            got = f", got {shown(value)}" if key in self.data else ""
            self.fail(f"{self.where} needs a non-empty list of {key}{got}; add [[{section}]] entries")
        return [Table(self.source, section, data, keys, entry=position) for position, data in enumerate(value, start=1)]

    def name(self, key: str, validate: Callable[[str], str], default: str | Required = REQUIRED) -> str:
        """A participant name, checked by `validate` (fedfair.pki.validate_name) and refused naming this key."""
        value = self.string(key, default, expected="a participant name like 'hospital-a'")
        try:
            return validate(value)
        except ConfigError as error:
            self.fail(f"{self.where} {key}: {error}")

    def path(self, key: str, base: Path, default: str | Required = REQUIRED) -> Path:
        """A path; a relative one is taken relative to `base` (the file's folder)."""
        value = self.string(key, default, expected="a path")
        return (base / Path(value).expanduser()).resolve()

    def json_table(self, key: str) -> dict[str, Any]:
        """A required table of JSON values (strings, numbers, booleans, lists, tables), e.g. a factory's arguments."""
        value = self.value(key, expected="a table, e.g. { hidden = 64 }")
        if not isinstance(value, Mapping) or not json_value(value):
            self.bad(key, value, "a table of strings, finite numbers, booleans, lists and tables, e.g. { hidden = 64 }")
        return dict(value)

    def address(self, key: str, default: str | Required = REQUIRED) -> str:
        """A ``host:port`` address with a port in 1..65535."""
        value = self.string(key, default, expected='host:port, e.g. "localhost:50051"')
        match = ADDRESS_RE.fullmatch(value)
        if match is None or not 1 <= int(match.group(2)) <= 65535:
            self.bad(key, value, 'host:port with a port in 1..65535, e.g. "localhost:50051"')
        return value
