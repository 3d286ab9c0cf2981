"""FrameLink.unsent_bytes: what a link has taken to send and the kernel has not (a peer
that does not read makes it grow), and ``on_sent`` as the writer hands it over -- what the
write port's window counts answers by (tserver/write_tcp_server.py)."""

from __future__ import annotations

import socket
import threading

from raftlet.consensus.rpc.frame_link import FrameLink, frame
from tests.waiting import wait_for


def test_unsent_bytes_grow_while_the_peer_reads_nothing_and_drain_when_it_reads() -> None:
    ours, theirs = socket.socketpair()
    sent_calls = threading.Semaphore(0)
    link = FrameLink(
        ours,
        "test",
        lambda _body: None,
        lambda _link: None,
        max_frame_bytes=1 << 20,
        send_timeout_s=60.0,
        on_sent=sent_calls.release,
    ).start()
    try:
        assert link.unsent_bytes == 0
        body = b"x" * (64 * 1024)
        frames = 64  # 4 MiB: more than the socketpair's buffers take
        for _ in range(frames):
            link.send(frame(body))
        link.send(frame(b"lazy"), lazy=True)
        total = frames * (len(body) + 4) + 8
        assert 0 < link.unsent_bytes <= total

        theirs.settimeout(20.0)
        got = 0
        while got < total:
            chunk = theirs.recv(1 << 20)
            assert chunk
            got += len(chunk)
        wait_for(lambda: link.unsent_bytes == 0, what="the backlog to drain")
        assert sent_calls.acquire(timeout=20.0)
    finally:
        link.close()
        link.join(5.0)
        theirs.close()
    assert link.unsent_bytes == 0
