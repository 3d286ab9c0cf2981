"""What client and server must agree on (Kudu's ``common/``).

Column types, table schemas, primary-key encoding, hash partitioning and the encoding of row
operations to and from their ``proto`` messages. Shared by ``tserver`` and ``client``; imports
only ``proto``.
"""
