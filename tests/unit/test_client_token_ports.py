"""A client with a bearer token and no certificate dials the servers' token ports: the
addresses it routes to come from ``token_rpc_addr``, and a cluster where a server has none
is refused up front, not discovered as a failed handshake at the first write."""

from __future__ import annotations

import pytest

from raftlet.client import InvalidArgument, TlsOptions
from raftlet.client.meta_cache import ClusterView
from raftlet.client.tls import uses_token_ports
from tests.unit.client_fakes import SERVERS, config_pb


def test_only_tls_without_a_certificate_uses_token_ports() -> None:
    assert not uses_token_ports(None)
    assert uses_token_ports(TlsOptions(b"ca"))
    assert not uses_token_ports(TlsOptions(b"ca", b"cert", b"key"))


def test_the_view_routes_to_token_ports() -> None:
    pb = config_pb()
    for i, s in enumerate(pb.servers):
        s.token_rpc_addr = f"{s.uuid}.fake:{9051 + i}"
    plain = ClusterView.from_pb(pb)
    token = ClusterView.from_pb(pb, token_ports=True)
    for i, uuid in enumerate(SERVERS):
        assert token.servers[uuid].rpc_addr == f"{uuid}.fake:{9051 + i}"
        assert plain.servers[uuid].rpc_addr == pb.servers[i].rpc_addr
    assert token.tablets == plain.tablets


def test_a_server_without_a_token_port_is_named() -> None:
    pb = config_pb()
    pb.servers[0].token_rpc_addr = "x.fake:9051"
    with pytest.raises(InvalidArgument, match=rf"{SERVERS[1]}, {SERVERS[2]} have no token port"):
        ClusterView.from_pb(pb, token_ports=True)
    ClusterView.from_pb(pb)  # a client with a certificate does not care


def test_a_missing_token_port_says_to_put_it_in_the_config() -> None:
    """Clients learn token ports from GetClusterConfig, which serves cluster.toml's: a port
    opened by the --token_rpc_addr flag alone stays unknown to them, so the advice names the
    config, not the flag."""
    with pytest.raises(InvalidArgument) as e:
        ClusterView.from_pb(config_pb(), token_ports=True)
    assert "add token_rpc_addr" in str(e.value)
    assert "[[servers]] entry of cluster.toml" in str(e.value)
    assert "or the servers --token_rpc_addr" not in str(e.value)
