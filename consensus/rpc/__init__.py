"""consensus.rpc — how a replica reaches its peers: the consensus ``Transport``, client side.

- ``codec``: core ``Message`` values to and from the ``ConsensusService`` protos, validating
  what a peer sent;
- ``tcp_transport``: ``TcpHub``, one plain TCP connection per pair of
  servers carrying every tablet's messages in frames (``frame_link``; the default,
  ``--consensus_transport=tcp``), falling back to the stream transport for a peer that
  offers no tcp port;
- ``grpc_transport``: ``GrpcTransport``, one unary RPC per message
  (``--consensus_transport=unary``);
- ``stream_transport``: ``StreamHub`` / ``StreamTransport``, one bidirectional gRPC stream
  per pair of servers carrying every tablet's messages in batched frames
  (``--consensus_transport=stream``).

The transports take their channels from the caller (the tablet server's pools in
``client.channels``) through a small protocol, so this package imports nothing beyond
``consensus`` and ``proto``.  The server side, which needs the tablet server's replicas, is
``tserver.consensus_handler``, ``tserver.consensus_stream_server`` and
``tserver.consensus_tcp_server``.
See docs/ARCHITECTURE.md, "consensus.rpc — consensus over gRPC".
"""
