"""The runtime flag registry: every flag's value, for the admin service.

``FlagRegistry`` holds the flags' values for ``GetFlags`` (every flag) and ``SetFlag`` (only
those marked runtime-settable in ``settings.FLAGS``, for fault injection in tests: WAL
latency, the lock-contention trace threshold). Listeners apply a change, e.g. the server
replaces each log's ``options`` with the new ``inject_latency_ms``. The registry, not the
frozen ``ServerSettings``, is the live value of a runtime-settable flag.

Names and values come from any client, so the registry is strict about them: a value is
parsed and range-checked (``FlagSpec.parse``) before anything changes, a name or value
longer than ``MAX_NAME_TEXT`` / ``MAX_VALUE_TEXT`` is refused without being parsed or
matched against the known names, and an error message quotes at most ``_SHOWN`` characters
of what was sent (it travels back in a gRPC trailer, which has a size limit of its own, and
into the log). Flags marked ``sensitive`` (paths) can be rendered as ``REDACTED``, the hook
for GetFlags callers who are not administrators.
"""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raftlet.consensus.raft_consensus import LeaderReadMode, TermCheckMode
from raftlet.tserver.flag_spec import FlagError
from raftlet.tserver.settings import FLAGS, ServerSettings

__all__ = ["MAX_NAME_TEXT", "MAX_VALUE_TEXT", "REDACTED", "FlagRegistry", "render_flag_value"]

logger = logging.getLogger(__name__)

# Flag names are short identifiers; values of the runtime flags are numbers. Anything longer
# is refused before any work is done with it (difflib's suggestion is quadratic in length).
MAX_NAME_TEXT = 128
MAX_VALUE_TEXT = 1024
# How much of a refused name or value an error message quotes.
_SHOWN = 40
# What a sensitive flag's value is rendered as for callers not allowed to see it.
REDACTED = "<redacted>"


def _shown(text: object) -> str:
    if isinstance(text, str) and len(text) > _SHOWN:
        return f"{text[:_SHOWN]!r}... ({len(text)} characters)"
    return repr(text)


def render_flag_value(value: object) -> str:
    """A value as it would be written on the command line (what GetFlags reports)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    if isinstance(value, TermCheckMode | LeaderReadMode):
        return str(value.value)
    if value is None:
        return ""
    if isinstance(value, Mapping):  # --peer_addresses: ID=HOST:PORT,...
        return ",".join(f"{k}={v}" for k, v in value.items())
    return str(value)


Listener = Callable[[Any], None]


@dataclass(slots=True)
class _Flag:
    value: Any
    parse: Callable[[str], Any] | None  # None: read-only at runtime
    help: str
    sensitive: bool = False
    listeners: list[Listener] = field(default_factory=list)


class FlagRegistry:
    """The server's flags by name, for the admin service; a few may be set at runtime.

    Thread-safe. Reads take ``_lock`` only for the dictionary lookup. ``set`` is serialized
    by ``_set_lock`` (an RLock, held while listeners run, so listeners see changes in the
    order they were made and a listener that itself calls ``set`` does not deadlock);
    ``_lock`` is never held while a listener runs, so a listener may ``get`` freely.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set_lock = threading.RLock()
        self._flags: dict[str, _Flag] = {}

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> FlagRegistry:
        """Every flag with its resolved value; the ``runtime`` ones settable."""
        registry = cls()
        for spec in FLAGS:
            if spec.name == "config":
                value: Any = settings.config.path
            elif spec.name in ("tick_interval_ms", "election_ticks", "heartbeat_ticks"):
                value = getattr(settings.raft, spec.name)
            else:
                value = getattr(settings, spec.name)
            registry.define(
                spec.name,
                value,
                parse=spec.parse if spec.runtime else None,
                help=spec.help,
                sensitive=spec.sensitive,
            )
        return registry

    def define(
        self,
        name: str,
        value: object,
        *,
        parse: Callable[[str], Any] | None = None,
        help: str = "",
        sensitive: bool = False,
    ) -> None:
        """Register a flag. ``parse`` (text → value, ValueError if invalid) makes it settable;
        ``sensitive`` lets ``render`` hide its value."""
        with self._lock:
            if name in self._flags:
                raise FlagError(f"flag {name!r} is already defined")
            self._flags[name] = _Flag(value, parse, help, sensitive)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._flags)

    def runtime_names(self) -> list[str]:
        with self._lock:
            return sorted(n for n, f in self._flags.items() if f.parse is not None)

    def is_runtime(self, name: str) -> bool:
        return self._entry(name)[1].parse is not None

    def get(self, name: str) -> Any:
        """The current (typed) value of ``name``; FlagError if there is no such flag."""
        return self._entry(name)[1].value

    def sensitive_names(self) -> list[str]:
        with self._lock:
            return sorted(n for n, f in self._flags.items() if f.sensitive)

    def render(
        self, names: Iterable[str] = (), *, redact_sensitive: bool = False
    ) -> dict[str, str]:
        """``{name: value as on the command line}`` for ``names``, or every flag if empty
        (what GetFlags answers); FlagError naming the first unknown one. With
        ``redact_sensitive`` a sensitive flag's value is ``REDACTED`` (for a caller who may
        know the flag exists but not where the server keeps its files)."""

        def value(flag: _Flag) -> str:
            if redact_sensitive and flag.sensitive:
                return REDACTED
            return render_flag_value(flag.value)

        wanted = list(names)
        if not wanted:
            with self._lock:
                return {n: value(f) for n, f in sorted(self._flags.items())}
        out = {}
        for n in wanted:
            key, flag = self._entry(n)
            out[key] = value(flag)
        return out

    def set(self, name: str, value: str) -> str:
        """Set runtime flag ``name`` from its command-line text; returns the old value as
        text (so a test can put it back). Raises FlagError, changing nothing, for an unknown
        or read-only flag or an invalid value.

        Listeners run after the value is stored, in subscription order, all of them even if
        one fails; the first failure is then re-raised (the new value stays set: GetFlags
        shows what is in force for everything that did apply it).
        """
        with self._set_lock:
            key, flag = self._entry(name)
            if flag.parse is None:
                settable = ", ".join(self.runtime_names()) or "none"
                raise FlagError(
                    f"flag {key!r} cannot be changed at runtime (restart the server with "
                    f"--{key}=...; settable at runtime: {settable})"
                )
            if not isinstance(value, str):
                raise FlagError(f"flag {key!r}: the value must be text, got {_shown(value)}")
            if len(value) > MAX_VALUE_TEXT:
                raise FlagError(
                    f"flag {key!r}: value too long ({len(value)} characters, at most "
                    f"{MAX_VALUE_TEXT}): {_shown(value)}"
                )
            try:
                new = flag.parse(value)
            except ValueError as e:
                raise FlagError(f"flag {key!r}: {e}") from None
            with self._lock:
                old = flag.value
                flag.value = new
                listeners = list(flag.listeners)
            first_error: BaseException | None = None
            for listener in listeners:
                try:
                    listener(new)
                except Exception as e:
                    logger.exception("listener of flag %s failed for value %r", key, new)
                    first_error = first_error or e
            if first_error is not None:
                raise first_error
            # Compared and shown as parsed values, not as the text sent: "0.0" sets a flag
            # that reads 0 to what it already is.
            old_text, new_text = render_flag_value(old), render_flag_value(new)
            if new == old:
                logger.debug("flag %s set to %s, which it already was", key, new_text)
            else:
                logger.info("flag %s changed from %s to %s", key, old_text, new_text)
            return old_text

    def subscribe(self, name: str, listener: Listener) -> Callable[[], None]:
        """Call ``listener(new_value)`` after each change of ``name``; returns an
        unsubscribe function. Only runtime-settable flags ever change."""
        _, flag = self._entry(name)
        with self._lock:
            flag.listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in flag.listeners:
                    flag.listeners.remove(listener)

        return unsubscribe

    def _entry(self, name: str) -> tuple[str, _Flag]:
        if not isinstance(name, str) or len(name) > MAX_NAME_TEXT:
            raise FlagError(f"unknown flag {_shown(name)}")
        # Accept the spellings a user might type: "--log-inject-latency-ms" too.
        key = name.strip().lstrip("-").replace("-", "_")
        with self._lock:
            flag = self._flags.get(key)
            if flag is not None:
                return key, flag
            known = sorted(self._flags)
        hint = difflib.get_close_matches(key, known, n=1)
        maybe = f"; did you mean {hint[0]!r}?" if hint else ""
        raise FlagError(f"unknown flag {_shown(name)}{maybe}")
