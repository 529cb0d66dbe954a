"""What an OTLP endpoint speaks, and what to change when the exporter speaks something else.

A scheme-less gRPC endpoint (``127.0.0.1:4317``) means TLS under the OpenTelemetry
specification (``insecure`` defaults to false), while most collectors listen in plaintext: the
export then fails with nothing but gRPC's ``WRONG_VERSION_NUMBER`` and, later, dropped spans.
Likewise HTTP/1.1 sent to a gRPC port (4317) or gRPC sent to an OTLP/HTTP port (4318). After a
failed export the agent connects to the endpoint once, finds out what listens there (nothing,
TLS, plaintext HTTP/1.1 or plaintext HTTP/2, which is gRPC's), and names the fix in one
WARNING. `otel-eacgm doctor --endpoint` runs the same check after a real export.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import socket
import ssl
import threading
import urllib.parse

from otel_eacgm import environment_variables as env_vars

log = logging.getLogger(__name__)

GRPC_PORT, HTTP_PORT = 4317, 4318
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + empty SETTINGS
_SETTINGS = 4


class Listener(str, enum.Enum):
    """What answers at an address."""

    NOTHING = "nothing accepts connections"
    TLS = "TLS"
    HTTP1 = "plaintext HTTP/1.1 (OTLP/HTTP)"
    H2C = "plaintext HTTP/2 only (OTLP/gRPC)"
    UNKNOWN = "a plaintext service that is neither HTTP/1.1 nor HTTP/2"


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how the SDK's exporter sends, as it resolves its settings."""

    protocol: str
    host: str
    port: int
    tls: bool
    endpoint: str  # as given (or the default the SDK takes)


def resolve(protocol: str, endpoint: str | None, insecure: bool | None, environ: dict[str, str] | None = None) -> Target:
    """The exporter's destination and whether it uses TLS, by the OpenTelemetry SDK's rules:
    an endpoint from the setting, else OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4317/4318
    over http://; for gRPC, https:// means TLS, and otherwise ``insecure`` (else
    OTEL_EXPORTER_OTLP_INSECURE, else an http:// scheme) says plaintext; over HTTP the scheme
    decides."""
    env = os.environ if environ is None else environ
    grpc = protocol == "grpc"
    given = endpoint or env.get(env_vars.OTEL_EXPORTER_OTLP_ENDPOINT) or \
        f"http://localhost:{GRPC_PORT if grpc else HTTP_PORT}"
    has_scheme = "://" in given
    url = urllib.parse.urlsplit(given if has_scheme else f"//{given}")
    scheme = url.scheme if has_scheme else ""
    if grpc:
        if scheme == "https":
            tls = True
        elif insecure is not None:
            tls = not insecure
        elif env.get(env_vars.OTEL_EXPORTER_OTLP_INSECURE):
            tls = env[env_vars.OTEL_EXPORTER_OTLP_INSECURE].strip().lower() != "true"
        else:
            tls = scheme != "http"
    else:
        tls = scheme == "https"
    default_port = GRPC_PORT if grpc else HTTP_PORT
    try:
        port = url.port or default_port
    except ValueError:
        port = default_port
    return Target(protocol, url.hostname or "localhost", port, tls, given)


def probe(host: str, port: int, timeout_s: float = 3.0) -> Listener:
    """Find out what listens at host:port: a TLS handshake, else an HTTP/1.1 request, else the
    HTTP/2 connection preface (a gRPC server answers that with a SETTINGS frame)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            try:
                with ctx.wrap_socket(raw, server_hostname=host):
                    return Listener.TLS
            except (ssl.SSLError, OSError):
                pass
        reply = _exchange(host, port, f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode(), timeout_s)
        if reply.startswith(b"HTTP/"):
            return Listener.HTTP1
        reply = _exchange(host, port, _H2_PREFACE, timeout_s)
        if len(reply) >= 9 and reply[3] == _SETTINGS:
            return Listener.H2C
        return Listener.UNKNOWN
    except OSError:
        return Listener.NOTHING


def _exchange(host: str, port: int, data: bytes, timeout_s: float) -> bytes:
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(data)
        try:
            return s.recv(64)
        except OSError:  # reset or timeout: the server would not answer that
            return b""


def advice(target: Target, listener: Listener) -> str | None:
    """What to change so the exporter and the listener agree; None when they already do (the
    failure is elsewhere: the collector refused the data, or was busy)."""
    where = f"{target.host}:{target.port}"
    grpc = target.protocol == "grpc"
    if listener is Listener.NOTHING:
        return (f"nothing accepts connections at {where}: start the collector there or fix the address "
                f"(OTLP listens on {GRPC_PORT} for gRPC, {HTTP_PORT} for HTTP)")
    if target.tls and listener in (Listener.H2C, Listener.HTTP1):
        if grpc and listener is Listener.H2C:
            return (f"{where} speaks plaintext gRPC but the exporter uses TLS (the endpoint {target.endpoint!r} "
                    f"has no http:// scheme, and insecure is unset): give the endpoint as http://{where}, or set "
                    f"insecure (--insecure, insecure: true, OTEL_EXPORTER_OTLP_INSECURE=true)")
        if not grpc and listener is Listener.HTTP1:
            return f"{where} speaks plaintext HTTP but the endpoint says https://: give it as http://{where}"
    if not target.tls and listener is Listener.TLS:
        return (f"{where} speaks TLS but the exporter sends plaintext: give the endpoint as https://{where}"
                + (" and drop insecure" if grpc else ""))
    if grpc and listener is Listener.HTTP1:
        return (f"{where} is an OTLP/HTTP port (HTTP/1.1) and the exporter speaks gRPC: use port {GRPC_PORT} "
                f"for gRPC, or --protocol http/protobuf for this port")
    if not grpc and listener is Listener.H2C:
        return (f"{where} is an OTLP/gRPC port (HTTP/2 only) and the exporter speaks http/protobuf: use port "
                f"{HTTP_PORT} for HTTP, or --protocol grpc for this port")
    if listener is Listener.UNKNOWN:
        return f"{where} answers neither TLS, HTTP/1.1 nor HTTP/2: is it an OTLP receiver? (gRPC {GRPC_PORT}, HTTP {HTTP_PORT})"
    return None


class ExportDiagnosis:
    """Checks the endpoint after the first failed export and warns once with the fix."""

    def __init__(self, protocol: str, endpoint: str | None, insecure: bool | None) -> None:
        self._target = resolve(protocol, endpoint, insecure)
        self._done = threading.Event()

    def failed(self) -> str | None:
        """An export failed: the first time, check the endpoint and log the fix (WARNING);
        returns it (None when none is known, or after the first time)."""
        if self._done.is_set():
            return None
        self._done.set()
        t = self._target
        fix = advice(t, probe(t.host, t.port))
        if fix:
            log.warning("export to %s (%s, %s) failed: %s", t.endpoint, t.protocol, "TLS" if t.tls else "plaintext", fix)
        return fix
