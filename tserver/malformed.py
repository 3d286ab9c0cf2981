"""Answer undecodable requests with INVALID_ARGUMENT.

gRPC decodes a request before any servicer runs; bytes that are not the method's message
would otherwise surface as an UNKNOWN status from inside grpc.  This interceptor wraps
every unary-unary handler's deserializer: a request that fails to decode becomes a marker,
and the wrapped handler answers it INVALID_ARGUMENT without running the servicer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

__all__ = ["MalformedRequestInterceptor"]


class _Malformed:
    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # untyped grpc
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
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            return await behaviour(request, context)

        return grpc.unary_unary_rpc_method_handler(
            guarded,
            request_deserializer=safe_decode,
            response_serializer=handler.response_serializer,
        )
