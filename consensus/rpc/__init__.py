"""consensus.rpc — the consensus ``Transport`` over gRPC, client side.

- ``codec``: core ``Message`` values to and from the ``ConsensusService`` protos, validating
  what a peer sent;
- ``grpc_transport``: ``GrpcTransport``, one unary RPC per message
  (``--consensus_transport=unary``);
- ``stream_transport``: ``StreamHub`` / ``StreamTransport``, one bidirectional stream per pair
  of servers carrying every tablet's messages in batched frames (the default).

Both transports take their channels from the caller (the tablet server's pools in
``client.channels``) through a small protocol, so this package imports nothing beyond
``consensus`` and ``proto``.  The server side, which needs the tablet server's replicas, is
``tserver.consensus_handler`` and ``tserver.consensus_stream_server``.
See docs/ARCHITECTURE.md, "consensus.rpc — consensus over gRPC".
"""
