"""The tablet server process.

gRPC services and their bounded service pools, tablet replicas and their lifecycle, the
per-tablet SQLite row store, exactly-once result tracking and the HTTP status server. It
serves the consensus RPCs (the transports that call them are ``consensus.rpc``, on the
client library's channel pools) and maps typed errors to gRPC status once, at the service
boundary. Imports ``consensus``, ``client`` (its channel pools), ``schema``, ``metrics`` and
``proto``.
"""

from raftlet import require_namespaced

require_namespaced(__name__)
