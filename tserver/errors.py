"""Typed errors the tablet server's handlers raise.

Handlers (service threads, prepare and apply workers) raise or `fail()` a call with these;
`tserver.rpc_dispatch.status_for` is the one place that turns them — and the consensus
errors — into a gRPC status and a `ServerErrorPB`. Keeping the mapping out of the
handlers means a handler never needs to know about gRPC, and a client sees the same
status for the same situation whichever code path noticed it.
"""

from __future__ import annotations

from raftlet.schema.schema import Schema

__all__ = [
    "DeadlineExceeded",
    "DeadlineExceededInQueue",
    "FilesNotRemovable",
    "InvalidRequest",
    "LeadershipLost",
    "ReplicaBusy",
    "SchemaMismatch",
    "ServiceUnavailable",
    "StaleRequest",
    "TabletFailed",
    "UnknownTablet",
    "check_schema",
]


class ServiceUnavailable(Exception):
    """The service cannot take the call right now (e.g. the server is shutting down).

    Retriable: the client should try again later or elsewhere (UNAVAILABLE).
    """


class LeadershipLost(ServiceUnavailable):
    """The replica stopped leading while a write was in flight, before the write committed:
    UNAVAILABLE with LEADERSHIP_LOST.  Its fate is unknown (the next leader may still commit
    it); a retry with the same request id is applied at most once.  A code of its own, so
    that ``raftlet metrics`` counts it with the leader changes, not as an error, and the
    client looks for the new leader (``leader_id``, if this replica knows it) rather than
    marking a healthy server down."""

    def __init__(self, message: str, leader_id: str = "") -> None:
        super().__init__(message)
        self.leader_id = leader_id


class ReplicaBusy(Exception):
    """The replica is at a limit of its own for this kind of call (every place for a held
    scan taken): RESOURCE_EXHAUSTED, so the client waits a little and tries it again.
    UNAVAILABLE sent clients to a follower (NOT_LEADER, naming this replica) and marked this
    server down, and a healthy leader was reported as no leader at all."""


class TabletFailed(ServiceUnavailable):
    """This server's replica of the tablet is FAILED (it did not open, or its log or store
    failed while running): UNAVAILABLE with TABLET_NOT_RUNNING, so a client tries another
    replica.  The message is "tablet failed: <why>"."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"tablet failed: {reason}")
        self.reason = reason


class FilesNotRemovable(Exception):
    """A replica's files could not all be removed (an immutable file, a read-only mount):
    the replica stays listed FAILED until a rerun deletes it (FAILED_PRECONDITION -- the
    server answered, and the operator must act; a server that is down is UNAVAILABLE)."""


class DeadlineExceededInQueue(Exception):
    """The call's deadline passed while it waited in a service queue, so it was never run.

    Nothing was applied, so a retry is safe (DEADLINE_EXCEEDED).
    """

    def __init__(self, service: str, method: str, waited_s: float) -> None:
        super().__init__(
            f"{method} waited {waited_s * 1000:.1f} ms in the {service} service queue; "
            "its deadline passed before it could run"
        )
        self.service = service
        self.method = method
        self.waited_s = waited_s


class DeadlineExceeded(Exception):
    """The call ran past its deadline and stopped (a scan page: SQLite interrupted); nothing
    changed, so a retry is safe (DEADLINE_EXCEEDED)."""


class UnknownTablet(Exception):
    """No replica of `tablet_id` lives on this server (NOT_FOUND)."""

    def __init__(self, tablet_id: str, why: str = "") -> None:
        why = f" ({why})" if why else ""
        # Quote a long id only in part: the message travels in the status details and the
        # error trailer, and a client refuses metadata over 8 KiB -- a 5 KB id once turned
        # NOT_FOUND into RESOURCE_EXHAUSTED ("metadata size exceeds soft limit").
        shown = (
            repr(tablet_id)
            if len(tablet_id) <= 80
            else (f"{tablet_id[:80]!r}... ({len(tablet_id)} characters)")
        )
        super().__init__(f"tablet {shown} not found on this server{why}")
        self.tablet_id = tablet_id


class InvalidRequest(Exception):
    """The request is malformed; retrying it unchanged fails again (INVALID_ARGUMENT)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class WriteTooLarge(InvalidRequest):
    """A write larger than the server replicates (INVALID_ARGUMENT / WRITE_TOO_LARGE: the
    client's MessageTooLarge, as a write over gRPC's message limit is)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"a write of {size} bytes exceeds {limit} bytes, the largest this server "
            "replicates (--max_message_bytes); split it"
        )


class SchemaMismatch(InvalidRequest):
    """A request made for another schema of the table than the replica's
    (INVALID_ARGUMENT / SCHEMA_MISMATCH): rows packed for one schema read as other values
    under another, without an error."""

    def __init__(self, what: str, table: str, schema: Schema) -> None:
        super().__init__(
            f"{what} was made for another schema of table {table!r} than this replica's "
            f"({schema.describe()}): the client's view of the table is out of date (the "
            "cluster was made again with another schema; raftlet's clients fetch it again "
            "and use it from their next call), or the "
            "servers' cluster.toml files disagree on the table"
        )


def check_schema(fingerprint: int, what: str, table: str, schema: Schema) -> None:
    """Refuse (``SchemaMismatch``) a request whose schema fingerprint is given and is not
    ``schema``'s."""
    if fingerprint and fingerprint != schema.fingerprint:
        raise SchemaMismatch(what, table, schema)


class StaleRequest(Exception):
    """A retry of a request whose result the server has already forgotten.

    The client told us (through first_incomplete_seq_no) that it no longer waits for it, so
    answering it again could only be wrong (FAILED_PRECONDITION / STALE_REQUEST).
    """


class CopySessionNotFound(LookupError):
    """No such tablet copy session (it ended, expired, or its server restarted): the
    copying replica begins a new one."""
