"""The checks a ``ScanRequest`` passes before any work is done for it.

Everything here is about the request alone: enum values this server knows, the bounds of
``schema.scan_bounds``, a Raft index that fits the log's 64-bit signed indexes. What needs
the schema (columns, value types, the resume key) is checked where it is used, with the same
outcome: ``InvalidRequest``, INVALID_ARGUMENT with what is wrong -- never a failure deeper
down that reaches the client as INTERNAL.
"""

from __future__ import annotations

from raftlet.proto import tablet_pb2
from raftlet.schema.scan_bounds import scan_bounds_error
from raftlet.tserver.errors import InvalidRequest

__all__ = ["MAX_INDEX", "check_scan_request"]

MAX_INDEX = 2**63 - 1
_READ_MODES = frozenset(tablet_pb2.ReadMode.values())
_ROW_FORMATS = frozenset(tablet_pb2.RowFormat.values())
_READ_MODE_NAMES = ", ".join(f"{n}={v}" for n, v in tablet_pb2.ReadMode.items())
_ROW_FORMAT_NAMES = ", ".join(f"{n}={v}" for n, v in tablet_pb2.RowFormat.items())


def check_scan_request(request: tablet_pb2.ScanRequest) -> None:
    """Raise ``InvalidRequest`` for a field no scan may have."""
    if request.read_mode not in _READ_MODES:
        raise InvalidRequest(f"unknown read mode {request.read_mode} (known: {_READ_MODE_NAMES})")
    if request.row_format not in _ROW_FORMATS:
        raise InvalidRequest(
            f"unknown row format {request.row_format} (known: {_ROW_FORMAT_NAMES})"
        )
    if request.min_applied_index > MAX_INDEX:
        raise InvalidRequest(
            f"min_applied_index {request.min_applied_index} is beyond any Raft index "
            f"(at most {MAX_INDEX})"
        )
    problem = scan_bounds_error(request.predicates, request.limit)
    if problem is not None:
        raise InvalidRequest(problem)
