"""TcpListener's port choice: a free port below the kernel's ephemeral range."""

from __future__ import annotations

from raftlet.tserver.tcp_listener import _ephemeral_low, bind_listener


def test_a_listener_on_port_0_stays_below_the_kernels_ephemeral_range() -> None:
    """Launchers reserve servers' RPC ports by asking the kernel (bind to port 0): a tcp
    listener must not be handed one of those before its owner starts."""
    socks = [bind_listener("127.0.0.1", 0) for _ in range(20)]
    try:
        ports = [s.getsockname()[1] for s in socks]
        assert len(set(ports)) == 20
        assert all(10_000 <= p < _ephemeral_low() for p in ports), ports
    finally:
        for s in socks:
            s.close()
