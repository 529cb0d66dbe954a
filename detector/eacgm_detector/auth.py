"""Bearer-token check for the detector's gRPC port, as a server interceptor.

The check runs before any handler, so an unauthenticated caller gets UNAUTHENTICATED without
its request being decoded or queued. The token is compared in constant time. Clients send the
standard OTLP header: the Collector's ``otlp`` exporter with
``headers: {authorization: "Bearer ${env:TOKEN}"}``, or gRPC metadata ``authorization``.
"""

from __future__ import annotations

import hmac
import logging

import grpc

log = logging.getLogger(__name__)

_SCHEME = "bearer "


def _deny(message: str) -> grpc.RpcMethodHandler:
    def handler(_request: bytes, context: grpc.ServicerContext) -> None:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    return grpc.unary_unary_rpc_method_handler(handler)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Lets through only calls whose ``authorization`` metadata is ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("bearer_token: empty token")
        self._token = token.encode()
        self._missing = _deny("authorization required: send metadata 'authorization: Bearer <token>'")
        self._wrong = _deny("invalid bearer token")
        self.denied = 0

    def intercept_service(self, continuation, handler_call_details):  # noqa: ANN001, ANN201 - gRPC API
        """Continue with the real handler, or answer UNAUTHENTICATED."""
        value = next((v for k, v in handler_call_details.invocation_metadata or () if k == "authorization"), None)
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        if value is None or not value.lower().startswith(_SCHEME):
            self._count()
            return self._missing
        if not hmac.compare_digest(value[len(_SCHEME):].strip().encode(), self._token):
            self._count()
            return self._wrong
        return continuation(handler_call_details)

    def _count(self) -> None:
        self.denied += 1
        if self.denied == 1:  # once; the count is in `denied`
            log.warning("refused an RPC without a valid bearer token (further refusals are counted, not logged)")
