"""The exceptions the client raises and collects.

Every one subclasses ``RaftletError`` and renders as one line that says what failed, where,
and why. The hierarchy, and when each is raised:

- ``Timeout`` — the operation's deadline passed (retries included); raised within the
  deadline plus the cost of one short RPC. Two subclasses say *why* the retries ran out,
  named by the cause most attempts failed with (the last one gets what time is left, often
  too little to say much): ``ServerTooBusy`` (refused with RESOURCE_EXHAUSTED: a full
  service queue, write memory, or a replica's every held-scan place) and ``NotLeader`` (no
  leader found). The message counts the attempts by cause when they differ. ``except
  Timeout`` catches all three.
- ``RowError`` — one row failed (KEY_EXISTS, TYPE_MISMATCH…) while the rest of its batch was
  applied. ``row_index`` is the row's position in its *session*: the n-th ``insert``/
  ``upsert``/``update``/``delete`` call on that session, counting from 0.
- ``TabletNotFound`` — no replica serves the tablet (or the table has no such tablet).
- ``InvalidArgument`` — the request is malformed (unknown table, bad predicate, a batch the
  server refuses as a whole); retrying it unchanged fails again.
- ``ClientClosed`` — the client or session was closed.
- ``RemoteError`` — any other server failure (INTERNAL, STALE_REQUEST, PERMISSION_DENIED…).
  Its subclass ``MessageTooLarge``: a request or response was over a gRPC message limit
  (the server's ``--max_message_bytes`` or the client channel's), or a write larger than
  the server replicates (``--max_message_bytes`` too); never retried, since the same
  message fails again.

Whether a failed write may still have been applied is ``may_have_applied``: False when no
attempt can have reached a replica's log (refused at admission -- RESOURCE_EXHAUSTED,
NOT_LEADER, LEADER_NOT_READY, TABLET_NOT_FOUND, INVALID_ARGUMENT, PERMISSION_DENIED,
UNAUTHENTICATED --, never sent because no connection to any server could be made, refused
by the client before sending, and a ``RowError``'s row); True when some attempt's fate is
unknown (a deadline or a broken connection after sending, an internal server error, the
client closed while the write was out). An indeterminate write must
be assumed neither applied nor absent. The client's own retries of one call reuse its
request id, so the call applies at most once; but a new call is a new request, and an
``insert`` sent again after an indeterminate one may meet KEY_EXISTS because the first one
was applied after all. Read the row back before writing it again, or write it with
``upsert``, which leaves the same row whether the first attempt was applied or not.
``Timeout``, ``NotLeader`` and ``ServerTooBusy`` are raised at the deadline, so an earlier
attempt may have been accepted even when the last one was refused: the flag says.

Errors collected by a session (``Session.errors()``) carry the failed operation:
``row_index``, ``table`` and ``row`` are set on them (``None`` on errors raised for
operations that are not about one row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Self

__all__ = [
    "ClientClosed",
    "InvalidArgument",
    "MessageTooLarge",
    "NotLeader",
    "RaftletError",
    "RemoteError",
    "RowError",
    "ServerTooBusy",
    "TabletNotFound",
    "Timeout",
]


class RaftletError(Exception):
    """Base of every client error. ``str()`` is one line.

    ``cause`` is a short machine-readable name of what went wrong (``"TIMEOUT"``,
    ``"KEY_EXISTS"``, ``"RESOURCE_EXHAUSTED"``…) — the key under which the failure is counted
    in ``ClientStats.errors_by_cause``.
    """

    cause = "ERROR"
    # Whether the operation may have been applied although this error was raised (see the
    # module docstring); subclasses and the retry loop set it.
    may_have_applied = False

    def __init__(
        self, message: str, *, cause: str | None = None, may_have_applied: bool | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if cause is not None:
            self.cause = cause
        if may_have_applied is not None:
            self.may_have_applied = may_have_applied
        # Set when the error is about one operation of a session (see the module docstring).
        self.row_index: int | None = None
        self.table: str | None = None
        self.row: Mapping[str, object] | None = None

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else self.message

    def for_operation(self, row_index: int, table: str, row: Mapping[str, object]) -> Self:
        """A copy of this error attached to one operation of a session (a batch that failed
        as a whole is reported once per operation, so each names its row)."""
        new = self._copy()
        new.row_index = row_index
        new.table = table
        new.row = row
        return new

    def with_message(self, message: str) -> Self:
        """A copy of this error saying ``message`` instead."""
        new = self._copy()
        new.args = (message,)
        new.message = message
        return new

    def _copy(self) -> Self:
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.args = self.args
        new.__cause__ = self.__cause__
        return new


class Timeout(RaftletError):
    """The operation's deadline passed before it succeeded (retries included); ``attempts``
    is how many attempts were made (None when not counted)."""

    cause = "TIMEOUT"
    may_have_applied = True
    attempts: int | None = None


class ServerTooBusy(Timeout):
    """The deadline passed while the server kept refusing with RESOURCE_EXHAUSTED."""

    cause = "RESOURCE_EXHAUSTED"


class NotLeader(Timeout):
    """The deadline passed while no replica of the tablet would act as its leader."""

    cause = "NOT_LEADER"


class TabletNotFound(RaftletError):
    cause = "TABLET_NOT_FOUND"


class InvalidArgument(RaftletError):
    cause = "INVALID_ARGUMENT"


class ClientClosed(RaftletError):
    cause = "CLIENT_CLOSED"


class RemoteError(RaftletError):
    """A server failure the client has no specific remedy for; ``cause`` names its status
    (and ``ServerErrorPB`` code when the server sent one)."""

    cause = "REMOTE_ERROR"
    may_have_applied = True


class MessageTooLarge(RemoteError):
    """A message was larger than a gRPC message limit, or a write larger than the server
    replicates (``size`` and ``limit`` in bytes, 0 when gRPC did not say)."""

    cause = "MESSAGE_TOO_LARGE"

    def __init__(
        self, message: str, *, size: int = 0, limit: int = 0, may_have_applied: bool = True
    ) -> None:
        super().__init__(message, may_have_applied=may_have_applied)
        self.size = size
        self.limit = limit


class RowError(RaftletError):
    """One row of a write failed; the other rows of its batch were applied.

    ``row_index`` is the row's position in its session (0-based, every write call counts),
    ``code`` the ``RowErrorPB.Code`` name (``"KEY_EXISTS"``), ``message`` the reason alone
    (``str(error)`` is the whole line).
    ``tablet_id`` is empty when the row was refused by the client before it was sent.
    """

    def __init__(
        self,
        row_index: int,
        code: str,
        message: str,
        *,
        table: str | None = None,
        row: Mapping[str, object] | None = None,
        tablet_id: str = "",
    ) -> None:
        where = f" of table {table!r}" if table else ""
        on = f" on tablet {tablet_id}" if tablet_id else " (refused by the client)"
        super().__init__(f"row {row_index}{where}{on}: {code}: {message}", cause=code)
        self.row_index = row_index
        self.code = code
        # The server's (or the client's) reason alone; str(error) is the whole line.
        self.message = message
        self.table = table
        self.row = row
        self.tablet_id = tablet_id

    def __reduce__(self) -> tuple[object, ...]:
        return (
            _rebuild_row_error,
            (self.row_index, self.code, self.message, self.table, self.row, self.tablet_id),
        )


def _rebuild_row_error(
    row_index: int,
    code: str,
    reason: str,
    table: str | None,
    row: Mapping[str, object] | None,
    tablet_id: str,
) -> RowError:
    return RowError(row_index, code, reason, table=table, row=row, tablet_id=tablet_id)
