"""``deploy.local.reserved_ports``: ports held for a block, so nothing else gets them."""

from __future__ import annotations

import errno
import socket

import pytest

from raftlet.deploy.local import free_ports, reserved_ports


def _bind(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))


def test_ports_are_held_for_the_block_and_free_after_it() -> None:
    with reserved_ports(3) as ports:
        assert len(set(ports)) == 3
        for port in ports:
            with pytest.raises(OSError, match="in use") as raised:
                _bind(port)
            assert raised.value.errno == errno.EADDRINUSE
    for port in ports:
        _bind(port)


def test_free_ports_are_distinct() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
