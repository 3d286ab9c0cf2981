"""What a ``raftlet tserver`` flag is: ``FlagSpec``, ``FlagError``, and the text converters
and range checks the flag table (``settings.FLAGS``) is written with.

A converter turns command-line text into a value and a check validates a value; both raise
``ValueError`` with a reason that reads well after ``--name:``, so argparse, the settings'
own validation and the runtime registry all report a bad value in the same words.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "FlagError",
    "FlagSpec",
    "at_least",
    "float_value",
    "int_in_range",
    "int_value",
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
    changed through the admin service's ``SetFlag`` while the server runs.
    """

    name: str
    group: str
    metavar: str
    help: str
    convert: Callable[[str], Any]
    check: Callable[[Any], None] = _no_check
    required: bool = False
    runtime: bool = False

    def parse(self, text: str) -> Any:
        value = self.convert(text)
        self.check(value)
        return value

    @property
    def option_strings(self) -> list[str]:
        dashed = self.name.replace("_", "-")
        return [f"--{self.name}"] + ([f"--{dashed}"] if dashed != self.name else [])


def int_value(text: str) -> int:
    try:
        return int(text.strip(), 10)
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
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {text!r}")
    return value


def at_least(lo: float, hi: float | None = None) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        if not math.isfinite(value) or value < lo or (hi is not None and value > hi):
            bound = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
            raise ValueError(f"must be {bound}, got {value}")

    return check


def positive(value: Any) -> None:
    at_least(0)(value)
    if value <= 0:
        raise ValueError(f"must be > 0, got {value}")


def int_in_range(lo: int, hi: int | None = None) -> Callable[[Any], None]:
    bounded = at_least(lo, hi)

    def check(value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        bounded(value)

    return check
