"""A gRPC client that never reads its answers: raw HTTP/2 over a socket, for resource tests.

gRPC's own client always drains its connection and grants flow-control window to any call
that expects an answer, so it cannot play the hostile client that opens many calls and never
takes the responses. ``StuckCaller`` speaks just enough HTTP/2 by hand (RFC 9113) to do that:
it announces a stream window of 0 (``SETTINGS_INITIAL_WINDOW_SIZE``) and never sends a
WINDOW_UPDATE, so the server can send response headers but not one byte of any response
message -- everything it produces for these calls stays in its own memory. It opens unary
calls (HEADERS, then the length-prefixed request and END_STREAM), acknowledges the server's
SETTINGS and PINGs (so the connection stays up rather than being closed for silence), and
counts the streams the server refuses (RST_STREAM) or answers with trailers.

HPACK is written as "literal header field without indexing, new name" with plain strings
(RFC 7541 §6.2.2), which every decoder must accept, so no header table or Huffman code is
needed. Every socket it opens is closed by ``close``.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading

__all__ = ["StuckCaller"]

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
_END_STREAM, _ACK, _END_HEADERS = 0x1, 0x1, 0x4
_SETTINGS_ENABLE_PUSH, _SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x4


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def _hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    n, v = name.encode(), value.encode()
    return b"\x00" + _hpack_int(len(n), 7) + n + _hpack_int(len(v), 7) + v


class StuckCaller:
    """One HTTP/2 connection to ``host:port`` whose calls are never read."""

    def __init__(self, host: str, port: int, timeout_s: float = 10.0) -> None:
        self._authority = f"{host}:{port}"
        self._sock = socket.create_connection((host, port), timeout=timeout_s)
        self._send_lock = threading.Lock()
        self._next_stream = 1
        self._lock = threading.Lock()
        self.refused = 0  # streams the server reset (e.g. over its concurrent-stream cap)
        self.finished = 0  # streams the server ended with trailers (an error status, say)
        self.goaway = False
        self._closed = False
        settings = struct.pack(">HI", _SETTINGS_ENABLE_PUSH, 0) + struct.pack(
            ">HI", _SETTINGS_INITIAL_WINDOW_SIZE, 0
        )
        self._send(_PREFACE + _frame(_SETTINGS, 0, 0, settings))
        self._reader = threading.Thread(target=self._read_loop, name="stuck-caller", daemon=True)
        self._reader.start()

    def call(self, method: str, request: bytes) -> None:
        """Start the unary call ``method`` ("/pkg.Service/Method") with ``request`` (a
        serialized message), and leave it there."""
        headers = b"".join(
            _literal(n, v)
            for n, v in (
                (":method", "POST"),
                (":scheme", "http"),
                (":path", method),
                (":authority", self._authority),
                ("content-type", "application/grpc"),
                ("te", "trailers"),
            )
        )
        body = b"\x00" + struct.pack(">I", len(request)) + request
        with self._lock:
            stream = self._next_stream
            self._next_stream += 2
        self._send(
            _frame(_HEADERS, _END_HEADERS, stream, headers)
            + _frame(_DATA, _END_STREAM, stream, body)
        )

    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self._sock.sendall(data)

    def _read_loop(self) -> None:
        """Read frames (TCP is drained, HTTP/2 windows are not), answering SETTINGS and PING."""
        buf = b""
        try:
            while True:
                chunk = self._sock.recv(65536)
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= 9:
                    length = int.from_bytes(buf[:3], "big")
                    if len(buf) < 9 + length:
                        break
                    kind, flags = buf[3], buf[4]
                    payload = buf[9 : 9 + length]
                    buf = buf[9 + length :]
                    if kind == _SETTINGS and not flags & _ACK:
                        self._send(_frame(_SETTINGS, _ACK, 0))
                    elif kind == _PING and not flags & _ACK:
                        self._send(_frame(_PING, _ACK, 0, payload))
                    elif kind == _RST_STREAM:
                        with self._lock:
                            self.refused += 1
                    elif kind == _HEADERS and flags & _END_STREAM:
                        with self._lock:
                            self.finished += 1
                    elif kind == _GOAWAY:
                        self.goaway = True
        except OSError:
            return  # closed by close() or reset by the server

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._reader.join(10)
