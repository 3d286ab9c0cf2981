"""How much gRPC's own C core logs in a tablet server.

The core writes to stderr by itself, in a format of its own ("I1206 05:35:44.769766 12295
chttp2_transport.cc:1403] ... Got goaway [11] ... ping_timeout"), at the verbosity
``GRPC_VERBOSITY`` names -- read once, when grpc is imported -- so ``--log_level``, which
governs Python's logging, did not reach it: a server run at ERROR still logged gRPC's INFO
lines.  ``raftlet tserver`` calls ``set_grpc_verbosity`` before anything imports grpc: all of
gRPC's lines at DEBUG, otherwise its errors only (its INFO lines are transport internals,
and it has no WARNING level).  A ``GRPC_VERBOSITY`` already in the environment stands: an
operator who set it meant it.

A client command (``raftlet scan``, ``write``, ...) has no log of its own: the core's INFO
lines -- a failed TLS handshake's "ssl_transport_security.cc:2563] Handshake failed ..." --
landed on the user's terminal above raftlet's own one-line error.  ``import_grpc_quietly``
imports grpc at ERROR for it, then takes the variable out again, so the servers that
``cluster up`` or ``chaos`` start still choose their own by ``--log_level``.

No grpc import at this module's top, nor in anything it imports.
"""

from __future__ import annotations

import os
import sys

__all__ = ["grpc_verbosity", "import_grpc_quietly", "set_grpc_verbosity"]


def grpc_verbosity(log_level: str) -> str:
    """The ``GRPC_VERBOSITY`` for a server's ``--log_level``."""
    return "DEBUG" if log_level.upper() == "DEBUG" else "ERROR"


def set_grpc_verbosity(log_level: str) -> None:
    """Before grpc is imported: it reads the variable once, then."""
    os.environ.setdefault("GRPC_VERBOSITY", grpc_verbosity(log_level))


def import_grpc_quietly() -> None:
    """For a client command: grpc imported with its core at ERROR, and the environment as
    it was (children do not inherit the setting)."""
    if "GRPC_VERBOSITY" in os.environ or "grpc" in sys.modules:
        return  # the user's choice, or too late to make one
    os.environ["GRPC_VERBOSITY"] = "ERROR"
    try:
        import grpc  # noqa: F401  (the import is the point: the core reads the variable now)
    finally:
        del os.environ["GRPC_VERBOSITY"]
