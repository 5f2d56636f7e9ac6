"""ConnectConfig and TLSConfig: how they resolve, the deprecated keywords they replace,
TLS with a server name, and the example of docs/client.md ("Connection")."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import grpc
import pytest

from dtq_pyworker import (
    AdminClient,
    AsyncClient,
    Client,
    ConnectConfig,
    DtqRpcError,
    TLSConfig,
    Worker,
)
from dtq_pyworker._channel import Connection
from tests.worker.fake_broker import FakeBroker, start_server
from tests.worker.helpers import running

DOCS = Path(__file__).resolve().parents[2] / "docs" / "client.md"


@pytest.fixture(autouse=True)
def _no_connection_env(monkeypatch):
    for name in ("DTQ_GATEWAY", "DTQ_TOKEN", "DTQ_TLS", "DTQ_TLS_CA"):
        monkeypatch.delenv(name, raising=False)


def test_a_config_resolves_as_given():
    config = ConnectConfig("gw:443", token="t", tls=TLSConfig(
        ca_path="/ca.pem", cert_path="/c.pem", key_path="/k.pem", server_name="gw.internal"))
    conn = Connection.of(config)
    assert conn == Connection(target="gw:443", token="t", tls=True, tls_ca="/ca.pem",
                              tls_cert="/c.pem", tls_key="/k.pem", server_name="gw.internal")


def test_unset_values_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("DTQ_GATEWAY", "env:1")
    monkeypatch.setenv("DTQ_TOKEN", "env-token")
    monkeypatch.setenv("DTQ_TLS_CA", "/env-ca.pem")
    conn = Connection.of(ConnectConfig())
    assert (conn.target, conn.token, conn.tls, conn.tls_ca) == (
        "env:1", "env-token", True, "/env-ca.pem")
    # a TLSConfig without ca_path uses DTQ_TLS_CA; token "" sends none
    conn = Connection.of(ConnectConfig("gw:1", tls=TLSConfig(), token=""))
    assert (conn.tls, conn.tls_ca, conn.token) == (True, "/env-ca.pem", "")


def test_tls_true_false_and_none(monkeypatch):
    assert Connection.of(ConnectConfig("gw:1", tls=True)).tls is True
    assert Connection.of(ConnectConfig("gw:1")).tls is False
    monkeypatch.setenv("DTQ_TLS", "yes")
    assert Connection.of(ConnectConfig("gw:1")).tls is True
    assert Connection.of(ConnectConfig("gw:1", tls=False)).tls is False


def test_a_certificate_needs_its_key():
    with pytest.raises(ValueError, match="cert_path and key_path"):
        TLSConfig(cert_path="/c.pem")
    with pytest.raises(ValueError, match="cert_path and key_path"):
        TLSConfig(key_path="/k.pem")


def test_the_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        ConnectConfig("gw:1").token = "x"  # type: ignore[misc]


@pytest.mark.parametrize(("keywords", "config"), [
    ({"token": "t"}, ConnectConfig("gw:1", token="t")),
    ({"tls": True}, ConnectConfig("gw:1", tls=TLSConfig())),
    ({"tls": False, "tls_ca": "/ca.pem"}, ConnectConfig("gw:1", tls=False)),
    ({"tls_ca": "/ca.pem"}, ConnectConfig("gw:1", tls=TLSConfig(ca_path="/ca.pem"))),
    ({"tls_cert": "/c.pem", "tls_key": "/k.pem"},
     ConnectConfig("gw:1", tls=TLSConfig(cert_path="/c.pem", key_path="/k.pem"))),
])
def test_the_deprecated_keywords_mean_what_they_did(keywords, config):
    assert ConnectConfig.from_keywords("gw:1", **keywords) == config
    assert Connection.resolve("gw:1", **keywords) == Connection.of(config)


@pytest.mark.parametrize("cls", [Client, AdminClient])
def test_a_deprecated_keyword_warns_and_still_works(cls):
    with pytest.warns(DeprecationWarning, match=r"token=\) is deprecated.*ConnectConfig"):
        client = cls("127.0.0.1:1", token="t")
    try:
        assert client.connection == Connection.of(ConnectConfig("127.0.0.1:1", token="t"))
    finally:
        client.close()


def test_the_worker_takes_a_config_and_warns_on_old_keywords():
    config = ConnectConfig("127.0.0.1:1", tls=TLSConfig(ca_path="/ca.pem"), token="t")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        worker = Worker(["q"], config)
    assert worker.target == "127.0.0.1:1" and worker.connect_config == config
    with pytest.warns(DeprecationWarning, match=r"Worker\(token=, tls_ca=\) is deprecated"):
        old = Worker(["q"], "127.0.0.1:1", tls_ca="/ca.pem", token="t")
    assert Connection.of(old.connect_config) == Connection.of(config)


@pytest.mark.parametrize("cls", [Client, Worker])
def test_a_config_with_old_keywords_is_refused(cls):
    args = (["q"],) if cls is Worker else ()
    with pytest.raises(TypeError, match="token inside the ConnectConfig"):
        cls(*args, ConnectConfig("127.0.0.1:1"), token="t")


def _openssl_cert(tmp_path: Path, name: str) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}"],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
async def tls_broker(tmp_path):
    """A FakeBroker over TLS whose certificate names only ``gateway.internal`` (so a
    client dialling 127.0.0.1 must be told the name); yields (broker, CA path)."""
    cert, key = _openssl_cert(tmp_path, "gateway.internal")
    broker = FakeBroker()
    creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    server, broker.target = await start_server(broker, credentials=creds)
    yield broker, str(cert)
    await server.stop(None)


async def test_server_name_checks_the_certificate_against_that_name(tls_broker):
    broker, ca = tls_broker
    named = ConnectConfig(broker.target, tls=TLSConfig(ca_path=ca,
                                                        server_name="gateway.internal"))
    async with AsyncClient(named) as client:
        await client.enqueue("q", "t", {})
    unnamed = ConnectConfig(broker.target, tls=TLSConfig(ca_path=ca))
    async with AsyncClient(unnamed, timeout_s=2) as client:
        with pytest.raises(DtqRpcError) as info:
            await client.enqueue("q", "t", {})
    assert info.value.code == grpc.StatusCode.UNAVAILABLE  # the name does not match


async def test_a_worker_leases_over_tls_with_a_config(tls_broker):
    broker, ca = tls_broker
    config = ConnectConfig(broker.target, tls=TLSConfig(ca_path=ca,
                                                         server_name="gateway.internal"))
    worker = Worker(["q"], config, worker_id="w-tls", drain_grace_s=5.0)
    worker.register("t", lambda p, c: "over tls")
    async with running(worker):
        lease = await broker.push("t")
        await broker.wait_for(lambda: lease in broker.acked())


def _docs_example() -> str:
    text = DOCS.read_text()
    section = text[text.index("### Connection"):]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


async def test_the_docs_example_connects(tls_broker, tmp_path, capsys):
    broker, ca = tls_broker
    code = _docs_example()
    assert "ConnectConfig(" in code and "TLSConfig(" in code
    # the example's host is not resolvable here: dial the test gateway under its name
    code = (code.replace('"gateway.example.com:443"', repr(broker.target))
            .replace('ca_path="/etc/dtq/ca.pem"',
                     f'ca_path={ca!r}, server_name="gateway.internal"'))
    await asyncio.to_thread(exec, compile(code, str(DOCS), "exec"), {})
    assert broker.metadata[-1]["authorization"] == "Bearer s3cret"
    assert capsys.readouterr().out.strip()  # the task id
