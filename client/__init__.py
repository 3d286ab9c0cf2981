"""The Python client library.

Sessions that batch rows per tablet, the meta cache of tablet leaders, retries with backoff,
and scanners. It speaks only the wire protocol: it imports ``schema`` and ``proto``, ``cluster``
to read a ``cluster.toml`` (``Client.from_config``), and may use ``metrics`` for its own latency
figures; never ``tserver`` or ``consensus``.

::

    from raftlet.client import Client, FlushMode

    with Client(["127.0.0.1:7051"]) as c:
        with c.new_session(FlushMode.AUTO_FLUSH_BACKGROUND) as s:
            for i in range(1000):
                s.insert("kv", {"key": i, "value": str(i)})
        assert not s.errors()
        rows = list(c.scan("kv"))

Modules: ``client`` (Client), ``session`` (flush modes), ``batch_pipeline`` (a session's
batches in flight per tablet, in key order), ``scanner``, ``meta_cache``
(tables → tablets → replicas → leaders), ``rpc`` (routing one tablet RPC with retries),
``retry`` (error classification and backoff policies), ``request_tracker`` (exactly-once
request ids), ``channels`` (one gRPC channel per server; also the tablet server's and the
CLI's), ``stats``, ``errors``, ``write_batch`` (a Write RPC's pure parts), ``health`` (the
ksck-style cluster check behind ``raftlet cluster status``), ``tls`` (``TlsOptions`` and
tokens for a TLS cluster).

The asyncio client is ``raftlet.client.aio.AsyncClient`` (``aio``, ``aio_channels``,
``aio_meta``, ``aio_rpc``, ``aio_write_stream``; what both clients share without I/O is
``client_base``): the same meta cache, routing, retries, request ids and errors
over ``grpc.aio``, for many writes in flight from one event loop::

    async with AsyncClient.connect(["127.0.0.1:7051"]) as c:
        await asyncio.gather(*(c.insert("kv", {"key": i}) for i in range(64)))
"""

from raftlet.client.client import Client
from raftlet.client.errors import (
    ClientClosed,
    InvalidArgument,
    MessageTooLarge,
    NotLeader,
    RaftletError,
    RemoteError,
    RowError,
    ServerTooBusy,
    TabletNotFound,
    Timeout,
)
from raftlet.client.meta_cache import ServerInfo
from raftlet.client.predicates import Predicate
from raftlet.client.retry import DEFAULT_POLICIES, Cause
from raftlet.client.scanner import ReadMode, Row, RowFormat, Scanner
from raftlet.client.session import FlushMode, Operation, Session
from raftlet.client.stats import ClientStats
from raftlet.client.tls import TlsOptions
from raftlet.client.write_batch import WriteResult
from raftlet.schema.rows import OpType

__all__ = [
    "DEFAULT_POLICIES",
    "Cause",
    "Client",
    "ClientClosed",
    "ClientStats",
    "FlushMode",
    "InvalidArgument",
    "MessageTooLarge",
    "NotLeader",
    "OpType",
    "Operation",
    "Predicate",
    "RaftletError",
    "ReadMode",
    "RemoteError",
    "Row",
    "RowError",
    "RowFormat",
    "Scanner",
    "ServerInfo",
    "ServerTooBusy",
    "Session",
    "TabletNotFound",
    "Timeout",
    "TlsOptions",
    "WriteResult",
]

# Last, so the re-exports above stay at the top; see raftlet/__init__.py.
from raftlet import require_namespaced

require_namespaced(__name__)
