"""The ``dtq`` command line over TLS: the CA from ``--tls-ca`` or ``DTQ_TLS_CA``,
like the workers; plaintext to a TLS gateway is refused as unavailable."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from click.testing import CliRunner

from dtq_cli import ExitCode, cli
from tests.support.redis_server import RedisServer
from tests.support.threaded_gateway import ThreadedGateway


@pytest.fixture
def tls_gateway(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True)
    server = RedisServer(appendonly=False).start()
    gw = ThreadedGateway(server.url, tls_cert=str(cert), tls_key=str(key)).start()
    yield gw, cert
    gw.stop()
    server.cleanup()


def test_cli_over_tls_with_the_ca_from_flag_or_env(tls_gateway):
    gw, cert = tls_gateway
    runner = CliRunner()
    clean = {"DTQ_GATEWAY": gw.target, "DTQ_TOKEN": None, "DTQ_TLS": None, "DTQ_TLS_CA": None}
    by_flag = runner.invoke(cli, ["--tls-ca", str(cert), "--json", "enqueue", "q", "t", "{}"],
                            env=clean)
    assert by_flag.exit_code == 0, by_flag.output
    task_id = json.loads(by_flag.stdout)["task_id"]
    by_env = runner.invoke(cli, ["--json", "get", task_id], env={**clean, "DTQ_TLS_CA": str(cert)})
    assert by_env.exit_code == 0 and json.loads(by_env.stdout)["queue"] == "q"
    plain = runner.invoke(cli, ["--timeout", "3", "get", task_id], env=clean)
    assert plain.exit_code == ExitCode.UNAVAILABLE, plain.output
