"""Whether this machine has an IPv6 loopback, for tests of IPv6 addresses (skipped without)."""

from __future__ import annotations

import socket

import pytest

__all__ = ["needs_ipv6_loopback"]


def _ipv6_loopback() -> bool:
    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        return False
    return True


needs_ipv6_loopback = pytest.mark.skipif(
    not _ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)"
)
