"""Connection settings and refusals: bearer token, fatal codes, channel options."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from dtq_pyworker import AsyncClient, DtqRpcError
from dtq_pyworker._channel import MAX_MESSAGE_BYTES, Connection
from tests.worker.helpers import make_worker


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


async def test_client_sends_token(fake):
    async with AsyncClient(fake.target, token="abc") as client:
        await client.enqueue("q", "t", {})
    assert fake.metadata[-1]["authorization"] == "Bearer abc"
