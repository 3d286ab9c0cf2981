"""Errors raised by the durable log and the consensus metadata.

Every corruption error names the file and the byte offset where the bad data starts, so an
operator can look at it (``xxd -s OFFSET FILE``) before deciding what to do: the log never
skips over damage by itself.
"""

from __future__ import annotations

__all__ = [
    "LogClosedError",
    "LogCorruptionError",
    "LogEntryCompactedError",
    "LogError",
    "LogFailedError",
    "LogNewerFormat",
    "MetadataCorruptionError",
    "MetadataNewerFormat",
    "NewerFormat",
    "newer_release",
]


class LogError(Exception):
    """Base class of every error the log raises on purpose."""


class LogCorruptionError(LogError):
    """Durable data that cannot be what the log wrote (not a torn tail)."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"{path}: offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class MetadataCorruptionError(LogCorruptionError):
    """The consensus metadata file is damaged; term and vote cannot be trusted."""


class NewerFormat(Exception):
    """Mixed into an error about a file whose format version is above what this build
    reads: written by a newer release (one rolled back from, say), not damaged. A replica
    that fails to open with it is FAILED and is not repaired by a tablet copy -- taken for
    damage, its files were replaced by a copy in this release's format, which after a
    rollback of every server would leave nothing newer to return to."""


def newer_release(version: int, known: int) -> str:
    """What a ``NewerFormat`` error says of the file."""
    return (
        f"format version {version}, written by a newer release (this one reads {known}): "
        "run that release on it again; this one leaves it as it is"
    )


class LogNewerFormat(LogCorruptionError, NewerFormat):
    """A WAL segment written by a newer release."""


class MetadataNewerFormat(MetadataCorruptionError, NewerFormat):
    """Consensus metadata written by a newer release."""


class LogFailedError(LogError):
    """An earlier write or sync failed; the log accepts nothing more.

    After a failed fdatasync the kernel may have dropped the dirty pages, so retrying could
    report durable what is not.  The replica must be shut down and the log reopened (which
    verifies what actually reached the disk).  The original error is ``__cause__``.
    """


class LogClosedError(LogError):
    """The log was closed."""


class LogEntryCompactedError(IndexError):
    """The entry was garbage-collected (it lies below the log's first index).

    An IndexError, as the Storage protocol uses for "not there", but a distinct type so a
    driver can tell "compacted: send a snapshot" from "beyond the end".
    """
