"""The bearer-token interceptor on a real gRPC server on loopback: the right token reaches the
handler, a missing or wrong one is answered UNAUTHENTICATED before the handler runs."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

from eacgm_detector import auth
from eacgm_detector.auth import BearerTokenInterceptor
from eacgm_detector.config import DetectorConfig
from eacgm_detector.service import DetectorService

TOKEN = "s3cret-Token_42"


class Echo:
    """A real server with the interceptor in front of one unary bytes method."""

    def __init__(self, token: str = TOKEN) -> None:
        self.interceptor = BearerTokenInterceptor(token)
        self.handled: list[bytes] = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[self.interceptor])

        def say(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.handled.append(request)
            return b"echo:" + request

        self.server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "test.Echo", {"Say": grpc.unary_unary_rpc_method_handler(say)})])
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.say = self.channel.unary_unary("/test.Echo/Say")

    def call(self, request: bytes, authorization: str | None) -> bytes:
        metadata = None if authorization is None else [("authorization", authorization)]
        return self.say(request, metadata=metadata, timeout=10)

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0).wait()


@pytest.fixture
def echo() -> Iterator[Echo]:
    server = Echo()
    yield server
    server.close()


@pytest.mark.parametrize("authorization", [
    f"Bearer {TOKEN}",
    f"bearer {TOKEN}",        # the scheme is case-insensitive (RFC 7235)
    f"BEARER {TOKEN}",
    f"Bearer   {TOKEN}",      # extra blanks around the token are ignored
])
def test_the_right_token_reaches_the_handler(echo: Echo, authorization: str) -> None:
    assert echo.call(b"hi", authorization) == b"echo:hi"
    assert echo.handled == [b"hi"]
    assert echo.interceptor.denied == 0


def _refused(echo: Echo, authorization: str | None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        echo.call(b"payload", authorization)
    return err.value


@pytest.mark.parametrize("authorization", [None, TOKEN, f"Basic {TOKEN}", "Bearer", ""])
def test_a_missing_bearer_header_is_unauthenticated_and_says_what_to_send(echo: Echo,
                                                                        authorization: str | None) -> None:
    err = _refused(echo, authorization)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert err.details() == "authorization required: send metadata 'authorization: Bearer <token>'"
    assert echo.handled == []
    assert echo.interceptor.denied == 1


@pytest.mark.parametrize("presented", ["wrong", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), ""])
def test_a_wrong_token_is_unauthenticated_and_never_handled(echo: Echo, presented: str) -> None:
    err = _refused(echo, f"Bearer {presented}")
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert err.details() == "invalid bearer token"
    assert echo.handled == []


def test_refusals_are_counted_and_logged_once(echo: Echo, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="eacgm_detector.auth"):
        for authorization in (None, "Bearer nope", "Bearer nope", None):
            _refused(echo, authorization)
        assert echo.call(b"ok", f"Bearer {TOKEN}") == b"echo:ok"
    assert echo.interceptor.denied == 4
    assert [r.getMessage() for r in caplog.records] == [
        "refused an RPC without a valid bearer token (further refusals are counted, not logged)"
    ]


def test_the_token_is_compared_in_constant_time(echo: Echo, monkeypatch: pytest.MonkeyPatch) -> None:
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", spy)
    _refused(echo, "Bearer guess")
    echo.call(b"x", f"Bearer {TOKEN}")
    assert compared == [(b"guess", TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]


def test_metadata_given_as_bytes_is_decoded_before_the_comparison() -> None:
    # Called directly: a gRPC client sends str metadata, but the interceptor also takes bytes.
    interceptor = BearerTokenInterceptor("clé")
    continued = []

    class Details:
        invocation_metadata = (("authorization", "Bearer clé".encode()),)

    assert interceptor.intercept_service(lambda d: continued.append(d) or "real handler", Details()) == "real handler"
    assert continued and interceptor.denied == 0


def test_an_empty_token_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="bearer_token: empty token"):
        BearerTokenInterceptor("")


def test_the_detector_service_requires_the_token_on_its_otlp_port() -> None:
    svc = DetectorService(DetectorConfig(listen="127.0.0.1:0", bearer_token=TOKEN)).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as channel:
            stub = TraceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as err:
                stub.Export(ExportTraceServiceRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            stub.Export(ExportTraceServiceRequest(), metadata=[("authorization", f"Bearer {TOKEN}")], timeout=10)
        assert svc.auth is not None and svc.auth.denied == 1
    finally:
        svc.stop()
