"""Speaking a server's tcp ports by hand, as a hostile or broken caller would: a frame is a
4-byte big-endian length and that many bytes (``consensus.rpc.frame_link``)."""

from __future__ import annotations

import socket
import ssl
import struct

__all__ = ["closed_by_server", "read_frame", "send_frame"]


def send_frame(sock: socket.socket, body: bytes) -> None:
    sock.sendall(struct.pack(">I", len(body)) + body)


def read_frame(sock: socket.socket) -> bytes:
    """The next frame's body; fails the test if the server closes first."""

    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "the server closed the connection"
            buf += chunk
        return buf

    (length,) = struct.unpack(">I", exactly(4))
    return exactly(length)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server ends the connection (EOF, a reset, or a TLS alert)."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
