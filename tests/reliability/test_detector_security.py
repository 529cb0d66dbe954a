"""The detector's gRPC port: loopback by default, TLS, and the bearer token, with real clients
(a gRPC client and the real Collector's otlp exporter)."""

from __future__ import annotations

import ast
import ipaddress
import os
import random
import shutil
import socket
import subprocess
import time
from pathlib import Path

import grpc
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub

import otlp_fuzz
from collector_proc import CollectorProcess
from detector_proc import DETECTOR, DetectorProcess
from eacgm_detector.config import BEARER_TOKEN_ENV, DetectorConfig
from eacgm_detector.service import DetectorService
from loopback import free_port, wait_port

TOKEN = "s3cret-token-for-tests"
DEFAULT_PORT = 4319


def _request():  # noqa: ANN202
    """Three plain spans (a valid request)."""
    return otlp_fuzz.traces(random.Random(1), spans=3)


def _export(channel: grpc.Channel, metadata=None) -> grpc.StatusCode:  # noqa: ANN001
    try:
        TraceServiceStub(channel).Export(_request(), timeout=5, metadata=metadata)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def _listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the TCP sockets `pid` listens on, from /proc/net/tcp{,6}."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A: LISTEN
                addr, port = f[1].split(":")
                raw = bytes.fromhex(addr)
                if family == socket.AF_INET:
                    raw = raw[::-1]
                else:
                    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                out.add((socket.inet_ntop(family, raw), int(port, 16)))
    return out


def test_default_listen_is_loopback_only(tmp_path: Path) -> None:
    assert DetectorConfig().listen == f"127.0.0.1:{DEFAULT_PORT}"
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", DEFAULT_PORT))
        except OSError:
            pytest.skip(f"port {DEFAULT_PORT} is taken on this machine: cannot start a detector on its default")
    proc = subprocess.Popen(DETECTOR, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_port(DEFAULT_PORT, 60)
        # gRPC may bind an IPv6 socket with the v4-mapped address; either way, loopback only.
        bound = {(str(ip.ipv4_mapped or ip), port) for ip, port in
                 ((ipaddress.ip_address(a), p) for a, p in _listening_addresses(proc.pid))}
        assert bound == {("127.0.0.1", DEFAULT_PORT)}
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    key, cert = d / "key.pem", d / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return key, cert


def test_tls_and_bearer_token_from_the_environment(tmp_path: Path, certificate) -> None:  # noqa: ANN001
    key, cert = certificate
    det = DetectorProcess(tmp_path, env={BEARER_TOKEN_ENV: TOKEN}, tls_cert_file=str(cert),
                          tls_key_file=str(key)).start()
    try:
        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(det.address, creds) as ch:
            assert _export(ch) is grpc.StatusCode.UNAUTHENTICATED
            assert _export(ch, [("authorization", "Bearer wrong")]) is grpc.StatusCode.UNAUTHENTICATED
            assert _export(ch, [("authorization", TOKEN)]) is grpc.StatusCode.UNAUTHENTICATED  # no scheme
            assert _export(ch, [("authorization", f"Bearer {TOKEN}")]) is grpc.StatusCode.OK
            assert _export(ch, [("authorization", f"bearer {TOKEN}")]) is grpc.StatusCode.OK  # scheme is case-blind
        with grpc.insecure_channel(det.address) as ch:  # plaintext against TLS: no handshake, no call
            assert _export(ch, [("authorization", f"Bearer {TOKEN}")]) is grpc.StatusCode.UNAVAILABLE
        assert det.alive()
    finally:
        det.stop()
    log = det.log()
    assert "TLS, bearer token required" in log
    assert TOKEN not in log  # the secret itself is never logged
    assert "Traceback" not in log


def test_bearer_token_from_the_config_key_without_tls() -> None:
    svc = DetectorService(DetectorConfig(listen="127.0.0.1:0", bearer_token=TOKEN)).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{svc.port}") as ch:
            assert _export(ch) is grpc.StatusCode.UNAUTHENTICATED
            assert _export(ch, [("authorization", f"Bearer {TOKEN}x")]) is grpc.StatusCode.UNAUTHENTICATED
            assert _export(ch, [("authorization", f"Bearer {TOKEN}")]) is grpc.StatusCode.OK
        svc.wait_idle()
        assert svc.auth is not None and svc.auth.denied == 2
        assert svc.detector.counters["spans.accepted"] == 3  # only the authenticated request reached it
    finally:
        svc.stop()


def _collector_to_detector(path: Path, detector: DetectorProcess, cert: Path, token: str) -> Path:
    config = {
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": "127.0.0.1:${env:EACGM_COLLECTOR_GRPC_PORT}"}}}},
        "exporters": {"otlp_grpc/detector": {
            "endpoint": f"localhost:{detector.port}", "tls": {"ca_file": str(cert)},
            "headers": {"authorization": f"Bearer {token}"},
            "retry_on_failure": {"initial_interval": "200ms", "max_interval": "1s"}}},
        "service": {"telemetry": {"metrics": {"level": "none"}},
                    "pipelines": {"traces": {"receivers": ["otlp"], "exporters": ["otlp_grpc/detector"]}}},
    }
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize("token,accepted", [(TOKEN, True), ("not-the-token", False)])
def test_the_real_collector_authenticates_with_a_header(tmp_path: Path, certificate, token: str, accepted: bool) -> None:  # noqa: ANN001
    key, cert = certificate
    det = DetectorProcess(tmp_path, env={BEARER_TOKEN_ENV: TOKEN}, tls_cert_file=str(cert),
                          tls_key_file=str(key)).start()
    collector = CollectorProcess(0, tmp_path / "collector.log",
                                 config=_collector_to_detector(tmp_path / "c.yaml", det, cert, token)).start()
    try:
        req = _request()
        for rs in req.resource_spans:
            rs.resource.attributes[0].value.string_value = "via-collector"
        with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as ch:
            TraceServiceStub(ch).Export(req, timeout=10)
        deadline = time.monotonic() + 15
        needle = "new entity host.name=via-collector" if accepted else "Unauthenticated"
        source = det.log if accepted else collector.log
        while needle not in source() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert needle in source(), (det.log()[-2000:], collector.log()[-2000:])
        if not accepted:
            assert "via-collector" not in det.log()
        assert collector.alive() and det.alive()
    finally:
        collector.stop()
        det.stop()


def _exit_of(cmd: list[str], env: dict[str, str] | None = None, timeout_s: float = 30) -> tuple[int, str]:
    """Exit status and stderr of `cmd`, expected to exit by itself; fails the test if it keeps running."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        proc.communicate(timeout=30)
        pytest.fail(f"{' '.join(cmd[1:])}: still running after {timeout_s} s, expected a refusal")
    return proc.returncode, err


def _counters(log: str) -> dict[str, int]:
    """The counters of the detector's last "detector stopped: {...}" line."""
    line = [x for x in log.splitlines() if "detector stopped: " in x][-1]
    return ast.literal_eval(line.split("detector stopped: ", 1)[1])


def test_a_plaintext_unauthenticated_bind_off_loopback_is_refused_unless_asked_for(tmp_path: Path) -> None:
    listen = f"0.0.0.0:{free_port()}"
    code, err = _exit_of([*DETECTOR, "--listen", listen])
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert listen in lines[0] and "insecure_listen" in lines[0] and "--insecure-listen" in lines[0], err
    assert "Traceback" not in err
    # A bearer token (or TLS) is protection enough to start; the token's clear-text warning stays.
    det = DetectorProcess(tmp_path, env={BEARER_TOKEN_ENV: TOKEN})
    det.start("--listen", f"0.0.0.0:{det.port}")
    assert det.stop() == 0
    assert "no authentication" not in det.log() and "insecure_listen" not in det.log()
    # Asked for by the flag or the setting's variable: it starts, and says so at WARNING.
    for args, env in ((["--insecure-listen"], {}), ([], {"OTEL_EACGM_DETECTOR_INSECURE_LISTEN": "true"})):
        det = DetectorProcess(tmp_path, env=env)
        det.start("--listen", f"0.0.0.0:{det.port}", *args)
        try:
            with grpc.insecure_channel(det.address) as ch:
                assert _export(ch) is grpc.StatusCode.OK
        finally:
            assert det.stop() == 0
        warning = [x for x in det.log().splitlines() if " WARNING " in x and "insecure_listen" in x]
        assert len(warning) == 1 and f"0.0.0.0:{det.port}" in warning[0], det.log()


def test_a_second_detector_on_the_same_port_fails_and_the_first_gets_all_traffic(tmp_path: Path) -> None:
    first = DetectorProcess(tmp_path).start()
    try:
        # gRPC binds with SO_REUSEPORT unless told not to: the kernel would split connections
        # between the two processes, each seeing part of every entity.
        code, err = _exit_of([*DETECTOR, "--config", str(first.config_path)])
        assert code == 2, err
        assert f"otel-eacgm detector serve: listen: cannot bind '{first.address}'" in err, err
        assert "in use" in err.lower() and "Traceback" not in err, err
        for _ in range(20):  # a new connection each time: each could have gone to another listener
            with grpc.insecure_channel(first.address) as ch:
                assert _export(ch) is grpc.StatusCode.OK
    finally:
        assert first.stop() == 0
    assert _counters(first.log())["spans.accepted"] == 20 * 3
