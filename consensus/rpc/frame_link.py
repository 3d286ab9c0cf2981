"""One TCP connection carrying length-prefixed frames both ways, driven by plain threads.

Why not ``grpc.aio`` here: a message on a ``grpc.aio`` stream crosses gRPC's event-engine
thread, its poller thread and the event loop before Python code sees it, and a write takes
the same hops back.  On this project's 2-core test machine a ping-pong of 150 bytes costs
266 µs and 146 µs of client CPU per round trip on a ``grpc.aio`` stream, against 7 µs and
4 µs on a plain socket (docs/benchmarks.md, "Peer transport").  A consensus message is
small and frequent, so the tcp transport (``consensus.rpc.tcp_transport``) uses this.

A frame is a 4-byte big-endian length and that many bytes.  ``FrameLink``:
- reads on a thread of its own (a blocking ``recv`` releases the GIL) and hands each
  complete frame to ``on_frame`` on that thread, in order, then calls ``on_burst_end``
  once all the frames one read brought in are handled (answers made meanwhile can leave
  together);
- sends from the caller's thread without ever blocking it: a frame goes out with one
  non-blocking ``send`` when nothing is queued before it (the usual case: no thread is
  woken); whatever the kernel does not take at once is queued for the link's writer
  thread, which waits for the socket to drain (started by the first frame queued, a lazy
  one included, so a link that never queues one costs one thread, its reader).  So ``send`` is safe
  under a lock, as
  ``consensus.transport.Transport.send`` must be.  A peer that takes nothing for
  ``send_timeout_s`` (stopped, or behind a partition) breaks the link;
- ``send(lazy=True)`` lets a frame wait up to ``LAZY_DELAY_S`` for others to join it, so
  a burst (every tablet's heartbeat to one peer) costs one write and one wake-up of the
  peer's reader, not one per frame; the next ordinary send takes waiting frames along;
- counts the bytes it has taken to send and not yet handed to the kernel
  (``unsent_bytes``) -- what a peer that does not read makes the server hold -- and calls
  ``on_sent`` from the writer thread whenever it has written some of them;
- refuses a frame longer than ``max_frame_bytes`` either way: the reader closes the link
  (a peer that sends one is broken or hostile), ``send`` raises ``ValueError``;
- with ``receive_limits`` (the links a server accepts), closes a link whose frame does not
  arrive whole within its deadline, and lets a large frame in only once the port's byte
  budget has room for it (``consensus.rpc.receive_limits``);
- once closed (either side, an error, ``close()``), hands no more frames to ``on_frame``
  (not even those the last read brought in) and calls ``on_close`` exactly once, from the
  reader thread.

Over TLS (an ``ssl.SSLSocket``, already handshaken): an OpenSSL connection must not be used
by two threads at once, and the reader and the senders would.  So every SSL call on the
link is made under the link's lock, and no thread holds the lock while it waits: the socket
is non-blocking, the reader ``poll``s for input outside the lock and then reads all that is
there under it (``SSLWantReadError`` ends a read), and the writer thread polls for room
outside the lock too.  A send still costs one non-blocking ``send`` under the lock.  A plain
socket keeps the blocking ``recv`` and ``MSG_DONTWAIT`` sends: nothing of this costs it.
"""

from __future__ import annotations

import contextlib
import logging
import select
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Callable

from raftlet.consensus.rpc.receive_limits import ReceiveLimits
from raftlet.metrics.every_interval import EveryInterval, held_back

__all__ = ["FrameLink", "LinkClosed", "frame"]

logger = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
# Links closed for a frame over the limit: anyone who reaches a plaintext port can open them
# at will, so the line is said at most once a minute for all of them (review r34b).
_OVERSIZED_LOG = EveryInterval(60.0)
# How long a lazy frame may wait for others to join it (a burst of heartbeats, one per
# tablet, leaves as one write instead of one each).
LAZY_DELAY_S = 0.005
_RECV_BYTES = 256 * 1024
# A TLS reader lets go of the lock after this much, so senders are not held up for long.
_TLS_READ_BURST_BYTES = 1024 * 1024
# A TLS write that needs the peer's bytes first (a key update) looks again this often.
_TLS_WANT_READ_POLL_MS = 10


class LinkClosed(ConnectionError):
    """The link is closed: nothing sent on it now goes anywhere."""


class _FrameTooSlow(Exception):
    """The frame that began to arrive did not finish within the port's deadline."""


def frame(body: bytes) -> bytes:
    """``body`` with its length prefix, as ``FrameLink.send`` takes it."""
    return _HEADER.pack(len(body)) + body


class FrameLink:
    def __init__(
        self,
        sock: socket.socket,
        name: str,
        on_frame: Callable[[bytes], None],
        on_close: Callable[[FrameLink], None],
        *,
        max_frame_bytes: int,
        send_timeout_s: float,
        on_burst_end: Callable[[], None] | None = None,
        receive_limits: ReceiveLimits | None = None,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        self._tls = isinstance(sock, ssl.SSLSocket)
        if self._tls:
            sock.setblocking(False)  # every SSL call is under the lock: none may wait there
        else:
            sock.settimeout(None)  # blocking: the reader waits in recv, sends pass MSG_DONTWAIT
        with contextlib.suppress(OSError):  # not TCP (a socketpair in tests)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.name = name
        self._sock = sock
        self._on_frame = on_frame
        self._on_burst_end = on_burst_end
        self._on_close = on_close
        self._on_sent = on_sent
        self._max_frame_bytes = max_frame_bytes
        self._receive_limits = receive_limits
        self._send_timeout_s = send_timeout_s
        # The send side (_backlog, _writing, _closed), and over TLS every SSL call.
        self._lock = threading.Lock()
        self._backlog: deque[memoryview] = deque()
        self._writing = False  # the writer thread owns the socket's send side
        self._wake_writer = threading.Condition(self._lock)
        # Frames that may wait a moment (send(lazy=True)): the writer sends them together
        # LAZY_DELAY_S after the first, or the next ordinary send takes them along.
        self._lazy: list[bytes] = []
        self._lazy_due = False
        # Bytes in _lazy and _backlog, and the chunk the writer is sending: only the slow
        # paths touch it, so a send the kernel takes at once pays nothing for it.
        self._unsent = 0
        self._closed = False
        self._shut = False  # the socket was shut down
        self._threads_left = 1  # the reader; the writer once it starts
        self._reader = threading.Thread(target=self._read, name=f"link-read:{name}", daemon=True)
        # Started by the first send that needs it: most links never queue a byte, and a
        # thousand idle client connections held a thousand idle writers (review r32a).
        self._writer = threading.Thread(target=self._write, name=f"link-write:{name}", daemon=True)
        self._writer_started = False

    def start(self) -> FrameLink:
        self._reader.start()
        return self

    def _wake_writer_unlocked(self) -> bool:
        """Tell the writer thread there is work, starting it the first time (caller holds
        ``_lock``, and the link is not closed). False: it could not be started (no thread
        to be had), and the link is closed -- the caller raises ``LinkClosed``."""
        if self._writer_started:
            self._wake_writer.notify()
            return True
        try:
            # Once per link: it waits for the lock, then sees the work.
            self._writer.start()
        except RuntimeError as e:  # can't start new thread
            logger.warning("link %s: no writer thread (%s): closing it", self.name, e)
            self._closed = True
            return False
        self._writer_started = True
        self._threads_left += 1
        return True

    @property
    def closed(self) -> bool:
        return self._closed

    # Calls, not attribute reads, after a wait: a type checker narrowing the attributes
    # across the wait would call what follows unreachable.
    def _is_closed(self) -> bool:
        return self._closed

    @property
    def unsent_bytes(self) -> int:
        """Bytes sent on the link that the kernel has not taken yet (read without the
        lock: a moment stale at worst)."""
        return self._unsent

    def _is_writing(self) -> bool:
        return self._writing

    # --- sending, any thread -------------------------------------------------------------

    def send(self, data: bytes, *, lazy: bool = False) -> None:
        """Send ``data``: one or more whole frames (``frame(body)`` each).  Never blocks;
        raises ``LinkClosed`` if the link is closed, ``ValueError`` for a frame over the
        limit (checked on the first frame only: callers send one frame per call or frames
        they built under the limit)."""
        (length,) = _HEADER.unpack_from(data)
        if length > self._max_frame_bytes:
            raise ValueError(
                f"a frame of {length} bytes exceeds the link's limit of {self._max_frame_bytes}"
            )
        with self._lock:
            if self._closed:
                raise LinkClosed(f"link {self.name} is closed")
            error = self._send_locked(data, lazy)
        if error is None:
            return
        logger.debug("link %s: send failed: %s", self.name, error)
        self._shutdown()
        raise LinkClosed(f"link {self.name}: {error}")

    def _send_locked(self, data: bytes, lazy: bool) -> OSError | None:
        """``send`` under ``_lock``, on an open link; the error that closed it, if one did."""
        if lazy:
            self._lazy.append(data)
            self._unsent += len(data)
            if not self._lazy_due:
                self._lazy_due = True
                if not self._wake_writer_unlocked():
                    return OSError("no writer thread")
            return None
        counted = 0  # of data's bytes, already in _unsent (lazy frames taken along)
        if self._lazy:  # what waits goes first, in this same send
            new = len(data)
            data = b"".join(self._lazy) + data
            self._lazy.clear()
            counted = len(data) - new
        if self._writing:  # the writer has bytes queued: these go after them
            self._backlog.append(memoryview(data))
            self._unsent += len(data) - counted
            return None
        try:
            if self._tls:  # non-blocking; flags are refused on an SSLSocket
                sent = self._sock.send(data)
            else:
                sent = self._sock.send(data, socket.MSG_DONTWAIT)
        except (
            BlockingIOError,
            InterruptedError,
            ssl.SSLWantWriteError,
            ssl.SSLWantReadError,
        ):
            # The kernel took nothing now (over TLS the writer must also retry with the
            # same bytes, OpenSSL's rule for a write that wanted to wait): all of it is
            # queued for the writer.
            sent = 0
        except OSError as exc:
            self._closed = True
            return exc
        if sent == len(data):
            self._unsent -= counted
            return None
        self._backlog.append(memoryview(data)[sent:])
        self._unsent += len(data) - sent - counted
        self._writing = True
        if self._wake_writer_unlocked():
            return None
        return OSError("no writer thread")

    def _write(self) -> None:
        """Writer thread: drain the backlog whenever a send could not go out at once."""
        try:
            self._write_backlog()
        finally:
            self._thread_done()

    def _write_backlog(self) -> None:
        while True:
            with self._lock:
                self._wake_writer.wait_for(lambda: self._writing or self._closed or self._lazy_due)
                if self._closed:
                    return
                if not self._writing:
                    # Woken for lazy frames: let the rest of their burst join them.
                    self._wake_writer.wait_for(lambda: self._writing or self._closed, LAZY_DELAY_S)
                    if self._is_closed():
                        return
                    if not self._is_writing():
                        self._lazy_due = False
                        if not self._lazy:  # an ordinary send took them along
                            continue
                        self._backlog.append(memoryview(b"".join(self._lazy)))
                        self._lazy.clear()
                        self._writing = True
                chunk = self._backlog.popleft()
            try:
                self._send_all(chunk)
            except TimeoutError as exc:
                # A peer (or a client of the write port) that reads nothing: worth saying
                # why its connection ends, unlike a reset of one that went away.
                logger.warning("link %s: %s: closing it", self.name, exc)
                self._shutdown()
                return
            except OSError as exc:
                logger.debug("link %s: %s", self.name, exc)
                self._shutdown()
                return
            with self._lock:
                if not self._closed:  # closing cleared the count
                    self._unsent -= len(chunk)
                if not self._backlog:
                    self._writing = False
                    # Lazy frames that came while the backlog drained: their turn next.
                    self._lazy_due = bool(self._lazy)
            if self._on_sent is not None:
                self._on_sent()

    def _send_all(self, chunk: memoryview) -> None:
        if self._tls:
            self._send_all_tls(chunk)
            return
        poller = select.poll()
        poller.register(self._sock, select.POLLOUT)
        while chunk:
            if not poller.poll(self._send_timeout_s * 1000):
                raise TimeoutError(f"the peer took nothing for {self._send_timeout_s:g} s")
            try:
                sent = self._sock.send(chunk, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                continue
            chunk = chunk[sent:]

    def _send_all_tls(self, chunk: memoryview) -> None:
        """Wait outside the lock, write under it; a write that could not finish is made
        again with the same bytes, as OpenSSL requires."""
        poller = select.poll()
        poller.register(self._sock, select.POLLOUT)
        wait_ms = self._send_timeout_s * 1000
        while chunk:
            if not poller.poll(wait_ms):
                raise TimeoutError(f"the peer took nothing for {self._send_timeout_s:g} s")
            with self._lock:
                if self._closed:
                    raise LinkClosed(f"link {self.name} is closed")
                try:
                    sent = self._sock.send(chunk)
                except (ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
                    continue
                except ssl.SSLWantReadError:
                    sent = 0
                    want_read = True
                else:
                    want_read = False
            if want_read:
                # The peer's bytes first (a key update), which the reader takes in: look
                # again once some arrive, or shortly.
                readable = select.poll()
                readable.register(self._sock, select.POLLIN)
                readable.poll(_TLS_WANT_READ_POLL_MS)
                continue
            chunk = chunk[sent:]

    # --- receiving, the reader thread ------------------------------------------------------

    def _read(self) -> None:
        buf = bytearray()
        limits = self._receive_limits
        reserved = 0  # of limits.budget, for the frame at the start of buf
        begun = 0.0  # when the frame at the start of buf began to arrive
        framed = False  # a frame came whole: the peer speaks raftlet's framing
        receive = self._receive_tls if self._tls else self._receive_plain
        try:
            while True:
                wait_s = None
                if buf and limits is not None:
                    wait_s = begun + limits.frame_deadline_s - time.monotonic()
                data = receive(wait_s)
                if not data:
                    return
                fresh = not buf  # what this read brought begins a frame
                buf += data
                start = 0
                while len(buf) - start >= _HEADER.size:
                    (length,) = _HEADER.unpack_from(buf, start)
                    if length > self._max_frame_bytes:
                        self._refuse_oversized(buf, start, length, first=not framed)
                        return
                    end = start + _HEADER.size + length
                    if len(buf) < end:
                        break
                    body = bytes(buf[start + _HEADER.size : end])
                    start = end
                    if reserved:
                        assert limits is not None
                        limits.budget.release(reserved)
                        reserved = 0
                    if self._closed:  # closed by a frame before it: the rest is not handled
                        return
                    self._on_frame(body)
                    framed = True
                if start:
                    del buf[:start]
                    if self._on_burst_end is not None:
                        self._on_burst_end()
                if buf and limits is not None and (start or fresh):  # a frame has begun
                    begun = time.monotonic()
                if limits is not None and not reserved and len(buf) >= _HEADER.size:
                    reserved = self._reserve(limits, buf)
                    if reserved < 0:
                        reserved = 0
                        return
                    if reserved:  # its deadline counts from when it had room
                        begun = time.monotonic()
        except _FrameTooSlow as exc:
            logger.warning("link %s: %s: closing", self.name, exc)
        except OSError as exc:
            logger.debug("link %s: %s", self.name, exc)
        except Exception:  # a bug in on_frame must close the link, not leave it half alive
            logger.exception("link %s: handling a frame failed", self.name)
        finally:
            if reserved:
                assert limits is not None
                limits.budget.release(reserved)
            self._shutdown()
            try:
                self._on_close(self)
            except Exception:
                logger.exception("link %s: on_close failed", self.name)
            self._thread_done()

    def _refuse_oversized(self, buf: bytearray, start: int, length: int, first: bool) -> None:
        """Say, at most once a minute for all links, why a link closes on a frame over the
        limit. As the first bytes of a connection, text (an HTTP request, a port scanner's
        probe) reads as a length of a gigabyte: said as what it is, not as a frame."""
        said = _OVERSIZED_LOG.due()
        if said is None:
            return
        head = bytes(buf[start : start + 8])
        more = held_back(said, "such link(s) closed")
        if first and all(32 <= b < 127 or b in b"\r\n\t" for b in head):
            logger.warning(
                "link %s: what it sent is not raftlet's framing (it begins %r, as text or an "
                "HTTP request would): closing; said at most once a minute%s",
                self.name,
                head,
                more,
            )
            return
        logger.warning(
            "link %s: a frame of %d bytes exceeds the limit of %d: closing; said at most once "
            "a minute%s",
            self.name,
            length,
            self._max_frame_bytes,
            more,
        )

    def _reserve(self, limits: ReceiveLimits, buf: bytearray) -> int:
        """Room in the port's budget for the frame at the start of ``buf``: the bytes
        reserved (0 for a small frame), or -1 when none came within its deadline."""
        length: int = _HEADER.unpack_from(buf)[0]
        if length <= limits.reserve_above_bytes:
            return 0
        if limits.budget.reserve(length, limits.frame_deadline_s, self._is_closed):
            return length
        if self._is_closed():
            return -1
        logger.warning(
            "link %s: no room for a frame of %d bytes within %g s (%d of the port's %d"
            " bytes held by frames arriving): closing",
            self.name,
            length,
            limits.frame_deadline_s,
            limits.budget.held(),
            limits.budget.limit_bytes,
        )
        return -1

    def _receive_plain(self, wait_s: float | None) -> bytes:
        if wait_s is not None:  # a frame has begun: the rest must come in time
            self._wait_readable(select.POLLIN, wait_s)
        return self._sock.recv(_RECV_BYTES)

    def _wait_readable(self, events: int, wait_s: float) -> None:
        poller = select.poll()
        poller.register(self._sock, events)
        if wait_s <= 0 or not poller.poll(wait_s * 1000):
            raise _FrameTooSlow("a frame did not arrive whole within its deadline")

    def _receive_tls(self, wait_s: float | None) -> bytes:
        """What has arrived (b"": the peer closed), waiting for it outside the lock."""
        poller = select.poll()
        deadline = None if wait_s is None else time.monotonic() + wait_s
        while True:
            data, more, want = self._read_tls_burst()
            if data:
                return data
            if not more:
                return b""
            # Nothing decrypted yet: wait for the socket to be readable (or writable, when
            # OpenSSL must send before it can read), never holding the lock.
            if deadline is not None:
                self._wait_readable(want, deadline - time.monotonic())
                continue
            poller.register(self._sock, want)
            poller.poll()
            poller.unregister(self._sock)

    def _read_tls_burst(self) -> tuple[bytes, bool, int]:
        """Under the lock: read until OpenSSL has no more (or a burst's worth). Returns the
        bytes, whether the link is still open, and what to poll for before the next read."""
        parts: list[bytes] = []
        size = 0
        with self._lock:
            if self._shut:
                return b"", False, 0
            while size < _TLS_READ_BURST_BYTES:
                try:
                    part = self._sock.recv(_RECV_BYTES)
                except ssl.SSLWantReadError:
                    return b"".join(parts), True, select.POLLIN
                except ssl.SSLWantWriteError:
                    return b"".join(parts), True, select.POLLOUT
                if not part:  # the peer closed
                    return b"".join(parts), bool(parts), select.POLLIN
                parts.append(part)
                size += len(part)
        # A burst's worth: more may be waiting in OpenSSL, where poll cannot see it, so the
        # caller reads again at once (it polls only after a read that found nothing).
        return b"".join(parts), True, 0

    # --- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the link (idempotent); the reader then calls ``on_close``, once."""
        self._shutdown()

    def join(self, timeout: float) -> None:
        """Wait for the link's threads to end (after ``close``)."""
        for thread in (self._reader, self._writer):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout)

    def _shutdown(self) -> None:
        with self._lock:
            if self._closed and self._shut:
                return
            self._closed = self._shut = True
            self._backlog.clear()
            self._lazy.clear()
            self._unsent = 0
            self._wake_writer.notify_all()
        # Wakes the reader out of recv and the writer out of poll; the fd itself is closed
        # by whichever of them ends last, so no thread ever uses a number the kernel reused.
        with contextlib.suppress(OSError):
            # The plain socket's shutdown, even under TLS: SSLSocket.shutdown drops its SSL
            # object, which the other threads may be using this very moment.
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def _thread_done(self) -> None:
        with self._lock:
            self._threads_left -= 1
            last = self._threads_left == 0
        if last:
            self._sock.close()
