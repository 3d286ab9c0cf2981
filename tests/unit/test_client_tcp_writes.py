"""The asyncio client's tcp write connection to one server (``client.aio_tcp_writes``),
against a stand-in for the server's write port."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from raftlet.client.aio_tcp_writes import TcpWritesTo
from raftlet.client.aio_write_stream import StreamedRpcError
from raftlet.client.retry import classify, refused_before_log
from raftlet.proto import tablet_pb2

ADDRESS = "127.0.0.1:1"  # what the stand-in says it is: the port comes from WriteEndpoint


class _Endpoint:
    """The gRPC stub's one call the connection makes: where the write port is."""

    def __init__(self, port: int) -> None:
        self.port = port

    async def WriteEndpoint(self, _request: Any, timeout: float) -> Any:
        return tablet_pb2.WriteEndpointResponse(
            port=self.port, advertised_address=ADDRESS, max_frame_bytes=1 << 20
        )


def test_a_connection_closed_before_any_answer_is_a_failed_open() -> None:
    """A server over its connection limit accepts and closes at once.  The client counted
    the connect as success and opened another for the next write, and the next, never
    falling back to the gRPC stream while the port stayed full (45 s of failed writes in
    a review): now it backs off, and ``stream()`` says "use gRPC" meanwhile."""

    async def main() -> int:
        accepted = 0

        async def refuse(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal accepted
            accepted += 1
            writer.close()

        server = await asyncio.start_server(refuse, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        tcp = TcpWritesTo(ADDRESS, _Endpoint(port), None)  # type: ignore[arg-type]
        try:
            stream = await tcp.stream()
            assert stream is not None
            with pytest.raises(StreamedRpcError):
                await stream.write(tablet_pb2.WriteRequest(tablet_id="kv-p0"), 5.0)
            for _ in range(5):  # the retries of that write, and the writes after it
                assert await tcp.stream() is None
            return accepted
        finally:
            await tcp.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(asyncio.wait_for(main(), 30)) == 1


def test_a_write_waits_for_the_port_to_open_no_longer_than_its_own_timeout() -> None:
    """A server that does not answer WriteEndpoint (stopped) held every write for the
    open's own 5 s, whatever the write's timeout: a 1 s write took 6 s, and never tried
    another replica. Now the write's wait ends with its timeout, as DEADLINE_EXCEEDED; the
    opening goes on for the writes after it, and they share its outcome."""
    answer = asyncio.Event()

    class Slow(_Endpoint):
        async def WriteEndpoint(self, request: Any, timeout: float) -> Any:
            await answer.wait()
            return tablet_pb2.WriteEndpointResponse(port=0)  # no port: use gRPC

    async def main() -> None:
        tcp = TcpWritesTo(ADDRESS, Slow(0), None)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StreamedRpcError) as timed_out:
            await tcp.stream(0.2)
        assert timed_out.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert loop.time() - started < 2.0
        # Never sent, and said so: it was reported "may have been applied".
        failure = classify(timed_out.value, "ts1", ADDRESS)
        assert failure.message.startswith("the call was never sent: the write port of")
        assert refused_before_log(failure)
        later = asyncio.ensure_future(tcp.stream(10.0))  # shares the same opening
        await asyncio.sleep(0)
        answer.set()
        assert await later is None
        await tcp.close()

    asyncio.run(asyncio.wait_for(main(), 30))
