"""The record of a chaos run: every operation's call and return, as the clients saw them.

An ``Op`` is one client operation on one key, with the monotonic times (ns) of its call and
its return and what came of it:

- ``OK``: the operation took effect (a write was acknowledged, a read returned ``value``);
- ``FAIL``: it certainly did not take effect (refused before it reached any log);
- ``INFO``: nobody knows (a timeout, a lost connection, a leader change mid-write): it may
  take effect at any moment after its call, or never. Its return time is meaningless.

Kinds: ``write`` (``value`` is what was written), ``read`` (``value`` is what was read, None
for a key with no row), ``cas`` (``value`` is ``(expected, new)``), ``insert`` (a unique key,
``value`` is the row's payload). Values are ints or None, so a history is plain JSON.

A saved history is JSON lines: first any header records, objects with a ``"record"`` field
(a chaos run writes one ``"run"`` record, with its wall-clock start, then one ``"fault"``
record per fault), then one operation per line. ``History.load`` reads the operations and
skips the header; ``History.load_header`` reads the header. Files without a header (saved
before there was one) load the same way.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

__all__ = ["History", "Op", "OpKind", "Outcome"]


class OpKind(StrEnum):
    WRITE = "write"
    READ = "read"
    CAS = "cas"
    INSERT = "insert"


class Outcome(StrEnum):
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(frozen=True)
class Op:
    """One completed (or abandoned) operation of ``process`` on ``key``."""

    id: int
    process: int
    kind: OpKind
    key: int
    value: Any
    call_ns: int
    return_ns: int
    outcome: Outcome
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "process": self.process,
            "kind": self.kind.value,
            "key": self.key,
            "value": list(self.value) if isinstance(self.value, tuple) else self.value,
            "call_ns": self.call_ns,
            "return_ns": self.return_ns,
            "outcome": self.outcome.value,
            "error": self.error,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Op:
        value = raw["value"]
        return cls(
            id=int(raw["id"]),
            process=int(raw["process"]),
            kind=OpKind(raw["kind"]),
            key=int(raw["key"]),
            value=tuple(value) if isinstance(value, list) else value,
            call_ns=int(raw["call_ns"]),
            return_ns=int(raw["return_ns"]),
            outcome=Outcome(raw["outcome"]),
            error=str(raw.get("error", "")),
        )

    def describe(self) -> str:
        """One line for a counter-example: who did what, when (ms from ``call_ns`` 0)."""
        end = "…" if self.outcome is Outcome.INFO else f"{self.return_ns / 1e6:.1f}"
        return (
            f"#{self.id} p{self.process} {self.kind.value}({self.key}) {self.value!r} "
            f"{self.outcome.value} [{self.call_ns / 1e6:.1f}, {end}] ms"
        )


@dataclass
class History:
    """Thread-safe recorder: ``call`` when an operation starts, ``done`` when it returns."""

    ops: list[Op] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _ids: Iterator[int] = field(default_factory=itertools.count, repr=False)

    def call(self) -> tuple[int, int]:
        """An id and the call time for an operation about to start."""
        return next(self._ids), time.monotonic_ns()

    def done(
        self,
        started: tuple[int, int],
        process: int,
        kind: OpKind,
        key: int,
        value: Any,
        outcome: Outcome,
        error: str = "",
    ) -> Op:
        op_id, call_ns = started
        op = Op(op_id, process, kind, key, value, call_ns, time.monotonic_ns(), outcome, error)
        with self._lock:
            self.ops.append(op)
        return op

    def snapshot(self) -> list[Op]:
        with self._lock:
            return sorted(self.ops, key=lambda op: op.id)

    def save(self, path: Path, header: Sequence[Mapping[str, Any]] = ()) -> int:
        """The ``header`` records (each with a ``"record"`` field), then one JSON object per
        operation, in call order; returns how many operations were written."""
        for record in header:
            if "record" not in record:
                raise ValueError(f"a header record needs a 'record' field: {record!r}")
        ops = self.snapshot()
        with path.open("w", encoding="utf-8") as f:
            for record in header:
                f.write(json.dumps(record) + "\n")
            for op in ops:
                f.write(json.dumps(op.to_json()) + "\n")
        return len(ops)

    @staticmethod
    def load(path: Path) -> list[Op]:
        """The operations of a saved history (the header, if any, skipped)."""
        return [Op.from_json(raw) for raw in _records(path) if "record" not in raw]

    @staticmethod
    def load_header(path: Path) -> list[dict[str, Any]]:
        """The header records of a saved history (none in a file saved without one)."""
        return [raw for raw in _records(path) if "record" in raw]

    @staticmethod
    def by_key(ops: Iterable[Op]) -> dict[int, list[Op]]:
        out: dict[int, list[Op]] = {}
        for op in ops:
            out.setdefault(op.key, []).append(op)
        return out


def _records(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
