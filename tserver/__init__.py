"""The tablet server process.

gRPC services and their bounded service pools, tablet replicas and their lifecycle, the
per-tablet SQLite row store, exactly-once result tracking and the HTTP status server. It
implements the consensus transport over long-lived gRPC channels and maps typed errors to gRPC
status once, at the service boundary. Imports ``consensus``, ``schema``, ``metrics`` and
``proto``.
"""

from raftlet import require_namespaced

require_namespaced(__name__)
