"""Connection settings and refusals: bearer token, fatal codes, channel options."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import grpc
import pytest

from dtq_pyworker import AsyncClient, DtqRpcError, Worker
from dtq_pyworker._channel import MAX_MESSAGE_BYTES, Connection
from tests.worker.fake_broker import FakeBroker, start_server
from tests.worker.helpers import make_worker, running


async def test_token_is_sent_as_bearer_metadata(fake, monkeypatch):
    monkeypatch.setenv("DTQ_TOKEN", "s3cret")
    worker = make_worker(fake)
    worker.register("t", lambda p, c: None)
    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    await fake.wait_for(lambda: fake.open_streams == 1)
    worker.stop()
    await asyncio.wait_for(task, 5)
    assert fake.metadata[0]["authorization"] == "Bearer s3cret"


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAUTHENTICATED,
                                  grpc.StatusCode.PERMISSION_DENIED,
                                  grpc.StatusCode.INVALID_ARGUMENT])
async def test_refused_lease_stops_the_worker_with_the_error(fake, code):
    fake.lease_error = (code, "REFUSED")
    worker = make_worker(fake)
    worker.register("t", lambda p, c: None)
    with pytest.raises(DtqRpcError) as info:
        await asyncio.wait_for(worker.run_async(install_signal_handlers=False), 5)
    assert (info.value.code, info.value.reason) == (code, "REFUSED")
    assert len(fake.lease_requests) == 1  # no reconnect loop


async def test_unavailable_lease_is_retried_not_fatal(fake):
    fake.lease_error = (grpc.StatusCode.UNAVAILABLE, "REDIS_UNAVAILABLE")
    worker = make_worker(fake)
    worker.register("t", lambda p, c: None)
    task = asyncio.create_task(worker.run_async(install_signal_handlers=False))
    await fake.wait_for(lambda: len(fake.lease_requests) >= 2)
    fake.lease_error = None
    await fake.wait_for(lambda: fake.open_streams == 1, timeout_s=10)
    worker.stop()
    await asyncio.wait_for(task, 5)


def test_connection_resolves_env(monkeypatch):
    monkeypatch.setenv("DTQ_GATEWAY", "gw:1234")
    monkeypatch.setenv("DTQ_TOKEN", " tok ")
    monkeypatch.setenv("DTQ_TLS_CA", "/etc/ca.pem")
    conn = Connection.resolve()
    assert (conn.target, conn.token, conn.tls, conn.tls_ca) == ("gw:1234", "tok", True,
                                                                "/etc/ca.pem")
    explicit = Connection.resolve("h:1", token="", tls=False, tls_ca="")
    assert (explicit.target, explicit.token, explicit.tls) == ("h:1", "", False)
    assert MAX_MESSAGE_BYTES > 4 * 1024 * 1024


@pytest.mark.parametrize("target", ["127.0.0.1:99999", "127.0.0.1:+88697", "127.0.0.1:0",
                                    "127.0.0.1:", "127.0.0.1:88697 ", "localhost",
                                    "127.0.0.1:0x5a99", "127.0.0.1:23161/x", "h:-1",
                                    # a bare IPv6 address: host "::", port 1
                                    "::1", "fe80::1", "2001:db8::1", "::1:50051",
                                    "dns:///::1:50051", "ipv6:::1:50051", "ipv6:[::1]",
                                    "ipv4:[::1]:1", "[gw]:1", ":50051",
                                    "http://gw:50051", "passthrough:///gw:1", "dns://gw:1",
                                    "unix:", "unix://", "unix://rel.sock", "unix-abstract:"])
def test_an_address_grpc_would_misread_is_refused(target, monkeypatch):
    """grpc wraps a port above 65535 round to another port (88697 reaches 23161), sends
    a target without port to 443, reads a bare IPv6 address as host and port, and takes
    an unknown scheme for a DNS name: refused before any channel is made."""
    with pytest.raises(ValueError, match="target"):
        Connection.resolve(target)
    with pytest.raises(ValueError, match="target"):
        AsyncClient(target)
    with pytest.raises(ValueError, match="target"):
        Worker(["q"], target)
    monkeypatch.setenv("DTQ_GATEWAY", target)
    with pytest.raises(ValueError, match="DTQ_GATEWAY"):
        Connection.resolve()


@pytest.mark.parametrize("target", ["127.0.0.1:1", "gw:65535", "[::1]:50051",
                                    "dns:///gw.internal:50051", "ipv4:10.0.0.1:50051",
                                    "unix:///run/dtq.sock", "unix-abstract:dtq",
                                    "[fe80::1%eth0]:50051", "dns:///[::1]:50051",
                                    "dns://10.0.0.53/gw:1", "ipv6:[::1]:50051",
                                    "ipv4:///10.0.0.1:1,10.0.0.2:2", "unix:rel.sock"])
def test_addresses_grpc_reads_as_meant_pass(target):
    assert Connection.resolve(target).target == target


async def test_client_sends_token(fake):
    async with AsyncClient(fake.target, token="abc") as client:
        await client.enqueue("q", "t", {})
    assert fake.metadata[-1]["authorization"] == "Bearer abc"


@pytest.fixture
def self_signed(tmp_path):
    """A self-signed certificate for localhost/127.0.0.1 made with the openssl CLI."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


async def test_worker_and_client_over_tls(self_signed):
    cert, key = self_signed
    broker = FakeBroker()
    creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    server, target = await start_server(broker, credentials=creds)
    broker.target = target
    try:
        worker = make_worker(broker, tls_ca=str(cert))
        worker.register("t", lambda p, c: "tls")
        async with running(worker):
            lease = await broker.push("t")
            await broker.wait_for(lambda: lease in broker.acked())
        async with AsyncClient(target, tls_ca=str(cert)) as client:
            await client.enqueue("q", "t", {})
        async with AsyncClient(target, tls=False, timeout_s=2) as plain:
            with pytest.raises(DtqRpcError) as info:
                await plain.enqueue("q", "t", {})
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(None)
