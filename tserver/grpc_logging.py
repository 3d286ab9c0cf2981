"""How much gRPC's own C core logs in a tablet server.

The core writes to stderr by itself, in a format of its own ("I1206 05:35:44.769766 12295
chttp2_transport.cc:1403] ... Got goaway [11] ... ping_timeout"), at the verbosity
``GRPC_VERBOSITY`` names -- read once, when grpc is imported -- so ``--log_level``, which
governs Python's logging, did not reach it: a server run at ERROR still logged gRPC's INFO
lines.  ``raftlet tserver`` calls ``set_grpc_verbosity`` before anything imports grpc: all of
gRPC's lines at DEBUG, otherwise its errors only (its INFO lines are transport internals,
and it has no WARNING level).  A ``GRPC_VERBOSITY`` already in the environment stands: an
operator who set it meant it.

No grpc import here, nor in anything this module imports.
"""

from __future__ import annotations

import os

__all__ = ["grpc_verbosity", "set_grpc_verbosity"]


def grpc_verbosity(log_level: str) -> str:
    """The ``GRPC_VERBOSITY`` for a server's ``--log_level``."""
    return "DEBUG" if log_level.upper() == "DEBUG" else "ERROR"


def set_grpc_verbosity(log_level: str) -> None:
    """Before grpc is imported: it reads the variable once, then."""
    os.environ.setdefault("GRPC_VERBOSITY", grpc_verbosity(log_level))
