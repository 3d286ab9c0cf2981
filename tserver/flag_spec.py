"""What a ``raftlet tserver`` flag is: ``FlagSpec``, ``FlagError``, and the text converters
and range checks the flag table (``settings.FLAGS``) is written with.

A converter turns command-line text into a value and a check validates a value; both raise
``ValueError`` with a reason that reads well after ``--name:``, so argparse, the settings'
own validation and the runtime registry all report a bad value in the same words.

Numbers are read strictly: ASCII digits only (Python's ``int``/``float`` would also take
``1_000`` and digits of other scripts, e.g. Arabic-Indic), at most ``MAX_NUMBER_TEXT``
characters, finite. A runtime flag arrives from any client through ``SetFlag``, so what it
accepts must be exactly what the help text documents.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_NUMBER_TEXT",
    "FlagError",
    "FlagSpec",
    "at_least",
    "float_value",
    "int_in_range",
    "int_value",
    "off_or_in_range",
    "positive",
]


class FlagError(ValueError):
    """A flag is unknown, read-only at runtime, or its value is invalid. One line."""


def _no_check(value: object) -> None:
    pass


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One flag: how to parse it from text, its range, and what to tell the user.

    ``convert`` turns the text into a value and ``check`` validates a value; both raise
    ValueError with a reason that reads well after ``--name:``. ``runtime`` flags may be
    changed through the admin service's ``SetFlag`` while the server runs; every one of them
    has a bounded ``check`` (anyone who reaches the admin service can set it). ``sensitive``
    flags (paths on the server's disk) are what ``GetFlags`` may hide from callers who are
    not administrators (``FlagRegistry.render(redact_sensitive=True)``).
    """

    name: str
    group: str
    metavar: str
    help: str
    convert: Callable[[str], Any]
    check: Callable[[Any], None] = _no_check
    required: bool = False
    runtime: bool = False
    sensitive: bool = False

    def parse(self, text: str) -> Any:
        value = self.convert(text)
        self.check(value)
        return value

    @property
    def option_strings(self) -> list[str]:
        dashed = self.name.replace("_", "-")
        return [f"--{self.name}"] + ([f"--{dashed}"] if dashed != self.name else [])


# No number this table takes needs more characters (2**63 has 19 digits; a float's repr, 24).
MAX_NUMBER_TEXT = 64
_INT_CHARS = frozenset("0123456789+-")
_FLOAT_CHARS = frozenset("0123456789+-.eE")


def _number_text(text: str, chars: frozenset[str], what: str) -> str:
    """``text`` stripped, if it is plausibly a number of that kind; ValueError otherwise.
    The message quotes at most the first 40 characters, so a megabyte of junk in a SetFlag
    does not come back in the error (nor go to the log)."""
    if not isinstance(text, str):
        raise ValueError(f"expected {what}, got {type(text).__name__}")
    word = text.strip()
    if not word or len(word) > MAX_NUMBER_TEXT or not set(word) <= chars:
        shown = repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"
        raise ValueError(f"expected {what}, got {shown}")
    return word


def int_value(text: str) -> int:
    word = _number_text(text, _INT_CHARS, "an integer")
    try:
        return int(word, 10)
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def bool_value(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"expected true or false, got {text!r}")


def is_bool(value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")


def float_value(text: str) -> float:
    # "nan" and "inf" are refused by name, before the character check would call them junk.
    if isinstance(text, str) and text.strip().lower().lstrip("+-") in ("nan", "inf", "infinity"):
        raise ValueError(f"expected a finite number, got {text!r}")
    word = _number_text(text, _FLOAT_CHARS, "a number")
    try:
        value = float(word)
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):  # 1e999 parses as inf
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def at_least(lo: float, hi: float | None = None) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            bound = f"in {_num(lo)}..{_num(hi)}" if hi is not None else f">= {_num(lo)}"
            raise ValueError(f"must be {bound}, got {value}")

    return check


def _num(x: float) -> str:
    """A bound as a person writes it: 10000, not 10000.0 or 1e+04."""
    return str(int(x)) if float(x).is_integer() else repr(x)


def positive(value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    # One message for 0 and for negatives: "must be >= 0" for -1 read as if 0 were fine.
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"must be > 0, got {value}")


def off_or_in_range(lo: float, hi: float) -> Callable[[Any], None]:
    """0 (off) or ``lo..hi``: for an interval whose thread cannot usefully run more often
    than ``lo`` (a smaller value would only run its passes back to back)."""
    bounded = at_least(lo, hi)

    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        if value == 0:
            return
        try:
            bounded(value)
        except ValueError:
            raise ValueError(f"must be 0 (off) or in {_num(lo)}..{_num(hi)}, got {value}") from None

    return check


def int_in_range(lo: int, hi: int | None = None) -> Callable[[Any], None]:
    bounded = at_least(lo, hi)

    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        bounded(value)

    return check
