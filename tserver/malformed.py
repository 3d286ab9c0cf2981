"""Answer undecodable requests with INVALID_ARGUMENT.

gRPC decodes a request before any servicer runs; bytes that are not the method's message
would otherwise surface as an UNKNOWN status from inside grpc.  This interceptor wraps
every unary-unary handler's deserializer: a request that fails to decode becomes a marker,
and the wrapped handler answers it INVALID_ARGUMENT without running the servicer.

Each is counted (``on_malformed``, the server's ``rpcs_failed{code="INVALID_ARGUMENT",
error="INVALID_ARGUMENT"}`` of the method) and logged at most once a minute with the
caller: a client built against other protos (a rolling upgrade gone wrong) failed every
call while the server showed no trace of it (review r34b).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from raftlet.metrics.every_interval import EveryInterval, held_back

__all__ = ["MalformedRequestInterceptor"]

logger = logging.getLogger(__name__)


class _Malformed:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # untyped grpc
    def __init__(self, on_malformed: Callable[[str], None] | None = None) -> None:
        """``on_malformed(method)``: a request of ``method`` (its full gRPC name) did not
        decode."""
        self._on_malformed = on_malformed
        self._log = EveryInterval(60.0)

    def _refused(self, method: str, reason: str, peer: str) -> None:
        if self._on_malformed is not None:
            self._on_malformed(method)
        said = self._log.due()
        if said is not None:
            more = held_back(said)
            logger.warning(
                "refused a request from %s that does not decode: %s -- a client of another "
                "raftlet version's protos, or not a raftlet client; said at most once a "
                "minute%s",
                peer,
                reason,
                more,
            )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        behaviour = handler.unary_unary
        method = handler_call_details.method

        def safe_decode(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception as e:  # DecodeError, or anything a bad payload provokes
                return _Malformed(f"{method}: request does not decode ({type(e).__name__})")

        async def guarded(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Malformed):
                self._refused(method, request.reason, context.peer())
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            return await behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=safe_decode,
            response_serializer=handler.response_serializer,
        )
