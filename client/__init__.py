"""The Python client library.

Sessions that batch rows per tablet, the meta cache of tablet leaders, retries with backoff,
and scanners. It speaks only the wire protocol: it imports ``schema`` and ``proto`` (and may use
``metrics`` for its own latency figures), never ``tserver`` or ``consensus``.
"""
