"""The ``dtq`` command line over TLS: the CA from ``--tls-ca`` or ``DTQ_TLS_CA``,
like the workers; plaintext to a TLS gateway is refused as unavailable, and TLS to a
plaintext one too, with dtq's one error line only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from dtq_cli import ExitCode, cli
from tests.support.redis_server import RedisServer
from tests.support.threaded_gateway import ThreadedGateway

ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture
def plaintext_target():
    """A plaintext gRPC server (no services: the TLS handshake fails before any call)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def test_tls_to_a_plaintext_gateway_prints_only_dtqs_error_line(plaintext_target):
    """gRPC's C core logs the failed handshake itself ("ssl_transport_security.cc ...");
    the dtq script keeps only gRPC's errors unless GRPC_VERBOSITY says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DTQ_", "GRPC_"))}
    cmd = [sys.executable, "-m", "dtq_cli", "--gateway", plaintext_target, "--tls",
           "--timeout", "5", "queues"]
    quiet = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=60, check=False)
    assert quiet.returncode == ExitCode.UNAVAILABLE, quiet.stderr
    (line,) = quiet.stderr.splitlines()
    assert line.startswith("dtq: UNAVAILABLE") and "andshake" in line
    # the user's own setting is kept: at INFO the C core's lines are back
    chatty = subprocess.run(cmd, cwd=ROOT, env={**env, "GRPC_VERBOSITY": "INFO"},
                            capture_output=True, text=True, timeout=60, check=False)
    lines = chatty.stderr.splitlines()
    assert chatty.returncode == ExitCode.UNAVAILABLE
    assert len(lines) > 1 and lines[-1].startswith("dtq: UNAVAILABLE")


@pytest.mark.parametrize("flag", ["--tls-cert", "--tls-key"])
def test_a_client_certificate_without_its_key_is_a_usage_error(tmp_path, flag):
    pem = tmp_path / "one.pem"
    pem.write_text("not read")
    res = CliRunner().invoke(cli, [flag, str(pem), "queues"],
                             env={"DTQ_GATEWAY": "127.0.0.1:1", "DTQ_TOKEN": None})
    assert res.exit_code == ExitCode.USAGE
    assert "--tls-cert and --tls-key go together" in res.output
