"""The gRPC auth interceptor reads a request only once its caller is admitted (review r32a):
a unary request used to be taken in whole -- up to the 16 MiB message limit -- before the
interceptor refused it, so anonymous callers on the token port made a server hold 2.7 GB.

A grpc.aio server on a loopback port without TLS: callers have no certificate, so a bearer
token is the only way in, as on the token port.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from raftlet.cluster.identity import AccessRole, Identity
from raftlet.tserver import security
from raftlet.tserver.security import Authenticator, AuthInterceptor, caller_identity, parse_tokens

TOKEN = "writer-token-0123456789abcdef"
WRITE = "/raftlet.TabletService/Write"  # writer
CHECK = "/grpc.health.v1.Health/Check"  # open
WATCH = "/grpc.health.v1.Health/Watch"  # open, a streaming answer written with context.write
BIG = b"x" * (4 << 20)


class Server:
    """The interceptor in front of three methods that echo the request's size; counts the
    requests decoded, and who each call was."""

    def __init__(self) -> None:
        self.decoded = 0
        self.callers: list[Identity | None] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self._thread.start()
        assert started.wait(30), "the server did not start"

    def _decode(self, data: bytes) -> bytes:
        self.decoded += 1
        return data

    async def _echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.callers.append(caller_identity())
        return str(len(request)).encode()

    async def _watch(self, request: bytes, context: grpc.aio.ServicerContext) -> None:
        for n in range(3):
            await context.write(f"{len(request)}:{n}".encode())

    def _run(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve(started))

    async def _serve(self, started: threading.Event) -> None:
        this = self

        class Handlers(grpc.GenericRpcHandler):  # type: ignore[misc]
            def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
                if details.method == WATCH:
                    return grpc.unary_stream_rpc_method_handler(
                        this._watch, this._decode, lambda b: b
                    )
                if details.method in (WRITE, CHECK):
                    return grpc.unary_unary_rpc_method_handler(
                        this._echo, this._decode, lambda b: b
                    )
                return None

        auth = Authenticator(parse_tokens(f"{TOKEN} writer app"))
        server = grpc.aio.server(
            interceptors=[AuthInterceptor(auth)],
            options=[("grpc.max_receive_message_length", 17 << 20)],
        )
        server.add_generic_rpc_handlers([Handlers()])
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._stop = asyncio.Event()
        started.set()
        await self._stop.wait()
        await server.stop(None)

    def close(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


@pytest.fixture
def channel(server: Server) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(
        f"127.0.0.1:{server.port}", options=[("grpc.max_send_message_length", 17 << 20)]
    ) as ch:
        yield ch


def _unary(channel: grpc.Channel, method: str) -> Any:
    return channel.unary_unary(method, request_serializer=None, response_deserializer=None)


def test_a_refused_call_is_answered_without_its_request_being_read(
    server: Server, channel: grpc.Channel
) -> None:
    before = server.decoded
    for metadata in ((), (("authorization", "Bearer not-a-known-token-at-all"),)):
        with pytest.raises(grpc.RpcError) as info:
            _unary(channel, WRITE)(BIG, timeout=30, metadata=metadata)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    assert server.decoded == before  # neither request was taken in


def test_an_admitted_call_reads_its_one_request_and_knows_its_caller(
    server: Server, channel: grpc.Channel
) -> None:
    before = server.decoded
    answer = _unary(channel, WRITE)(
        BIG, timeout=30, metadata=(("authorization", f"Bearer {TOKEN}"),)
    )
    assert answer == str(len(BIG)).encode()
    assert server.decoded == before + 1
    assert server.callers[-1] == Identity("app", AccessRole.WRITER, via="token")


def test_open_methods_are_served_to_anyone_unary_and_streaming(
    server: Server, channel: grpc.Channel
) -> None:
    assert _unary(channel, CHECK)(b"abc", timeout=30) == b"3"
    assert server.callers[-1] is None
    watch = channel.unary_stream(WATCH, request_serializer=None, response_deserializer=None)
    assert list(watch(b"ab", timeout=30)) == [b"2:0", b"2:1", b"2:2"]


def test_an_open_call_with_a_large_request_is_refused_undecoded(
    server: Server, channel: grpc.Channel
) -> None:
    # A health check names a service: a few bytes. 4 MiB of it was held until the cyclic
    # collector ran, once the handler refused it.
    before = server.decoded
    with pytest.raises(grpc.RpcError) as info:
        _unary(channel, CHECK)(BIG, timeout=30)
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "more than 65536 bytes" in (info.value.details() or "")
    assert server.decoded == before


class _Refused(Exception):
    pass


class _Context:
    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Refused(code, details)


def test_only_a_few_open_calls_are_read_at_once() -> None:
    """Nobody to admit on an open method: it costs the server at most a few bodies at once,
    the rest refused at once, not read."""

    async def body() -> None:
        interceptor = AuthInterceptor(Authenticator(None))
        handler = grpc.unary_unary_rpc_method_handler(lambda r, c: r)

        async def continuation(details: Any) -> grpc.RpcMethodHandler:
            return handler

        class Details:
            method = CHECK
            invocation_metadata = ()

        wrapped = await interceptor.intercept_service(continuation, Details())
        assert wrapped.request_streaming
        blocked = asyncio.Event()
        started = 0
        all_reading = asyncio.Event()

        async def requests() -> Any:
            nonlocal started
            started += 1
            if started == security._OPEN_READS:
                all_reading.set()
            await blocked.wait()  # a body still on its way
            yield b"r"

        reading = [
            asyncio.ensure_future(wrapped.stream_unary(requests(), _Context()))
            for _ in range(security._OPEN_READS)
        ]
        await asyncio.wait_for(all_reading.wait(), 30)
        with pytest.raises(_Refused) as info:
            await wrapped.stream_unary(requests(), _Context())
        assert info.value.args[0] is grpc.StatusCode.RESOURCE_EXHAUSTED
        blocked.set()
        assert await asyncio.gather(*reading) == [b"r"] * security._OPEN_READS
        # Each read gave its place back.
        blocked.clear()
        blocked.set()
        assert await wrapped.stream_unary(requests(), _Context()) == b"r"
        # A body that never comes holds its place for a bounded time only: four such calls
        # from anyone made every health check RESOURCE_EXHAUSTED for good.
        security_timeout = security._OPEN_READ_TIMEOUT_S
        security._OPEN_READ_TIMEOUT_S = 0.05
        try:
            never = asyncio.Event()

            async def silent() -> Any:
                await never.wait()
                yield b"never"

            timed = await interceptor.intercept_service(continuation, Details())
            stuck = [timed.stream_unary(silent(), _Context()) for _ in range(security._OPEN_READS)]
            results = await asyncio.gather(*stuck, return_exceptions=True)
            assert all(
                isinstance(r, _Refused) and r.args[0] is grpc.StatusCode.DEADLINE_EXCEEDED
                for r in results
            ), results
            assert await timed.stream_unary(requests(), _Context()) == b"r"
        finally:
            security._OPEN_READ_TIMEOUT_S = security_timeout

    asyncio.run(body())
