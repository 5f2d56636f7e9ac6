"""Settings: env and flags, validation with one clear line, secrets redacted."""

from __future__ import annotations

import pytest

from dtq_gateway.settings import SettingsError, load


def test_defaults_match_the_seed():
    s = load([], environ={})
    assert (s.visibility_timeout_s, s.heartbeat_interval_s) == (30.0, 10.0)
    assert s.task_retention_s == 7 * 86400 and s.result_retention_s == 3600
    assert s.result_max_bytes == 8192 and s.idem_ttl_s == 86400 and s.dlq_maxlen == 10000
    assert s.listen == "127.0.0.1:50051" and s.metrics_port == 9464
    assert s.worker_ttl_ms == 30_000


def test_flag_wins_over_env():
    s = load(["--listen", "0.0.0.0:1234"], environ={"DTQ_LISTEN": "127.0.0.1:1"})
    assert s.listen == "0.0.0.0:1234"


def test_env_is_read():
    s = load([], environ={"DTQ_VISIBILITY_TIMEOUT_S": "5", "DTQ_HEARTBEAT_INTERVAL_S": "1"})
    assert s.visibility_timeout_ms == 5000 and s.heartbeat_interval_ms == 1000


@pytest.mark.parametrize("env, needle", [
    ({"DTQ_HEARTBEAT_INTERVAL_S": "30"}, "DTQ_HEARTBEAT_INTERVAL_S"),
    ({"DTQ_VISIBILITY_TIMEOUT_S": "abc"}, "DTQ_VISIBILITY_TIMEOUT_S"),
    ({"DTQ_LISTEN": "nohost"}, "DTQ_LISTEN"),
    ({"DTQ_REDIS_URL": "http://x"}, "DTQ_REDIS_URL"),
    ({"DTQ_DLQ_MAXLEN": "0"}, "DTQ_DLQ_MAXLEN"),
    ({"DTQ_TLS_CERT": "/nonexistent.pem"}, "DTQ_TLS"),
    ({"DTQ_LOG_FORMAT": "xml"}, "DTQ_LOG_FORMAT"),
])
def test_invalid_settings_name_the_variable(env, needle):
    with pytest.raises(SettingsError) as err:
        load([], environ=env)
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_secrets_are_redacted_in_repr():
    s = load([], environ={"DTQ_REDIS_URL": "redis://:hunter2@h:6379/0"})
    assert "hunter2" not in repr(s)
    assert "***" in repr(s)


def test_cli_exits_2_with_one_line(capsys):
    from dtq_gateway.cli import main

    assert main(["--heartbeat-interval-s", "40"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "DTQ_HEARTBEAT_INTERVAL_S" in err[0]


@pytest.mark.parametrize("env, needle", [
    ({"DTQ_LISTEN": "127.0.0.1:99999"}, "DTQ_LISTEN"),
    ({"DTQ_LOG_LEVEL": "LOUD"}, "DTQ_LOG_LEVEL"),
])
def test_more_invalid_settings(env, needle):
    with pytest.raises(SettingsError) as err:
        load([], environ=env)
    assert needle in str(err.value)


def test_boolean_settings_parse_and_refuse_garbage():
    assert load([]).require_noeviction is True
    assert load([], environ={"DTQ_REQUIRE_NOEVICTION": "false"}).require_noeviction is False
    assert load(["--require-noeviction", "0"]).require_noeviction is False
    with pytest.raises(SettingsError, match="DTQ_REQUIRE_NOEVICTION: expected true or false"):
        load([], environ={"DTQ_REQUIRE_NOEVICTION": "maybe"})


@pytest.mark.parametrize("env, needle", [
    ({"DTQ_REDIS_MIN_REPLICAS_ACK": "-1"}, "DTQ_REDIS_MIN_REPLICAS_ACK must be 0..16"),
    ({"DTQ_REDIS_MIN_REPLICAS_ACK": "17"}, "DTQ_REDIS_MIN_REPLICAS_ACK must be 0..16"),
    ({"DTQ_REDIS_REPLICA_ACK_TIMEOUT_MS": "9"}, "DTQ_REDIS_REPLICA_ACK_TIMEOUT_MS must be"),
    ({"DTQ_REDIS_REPLICA_ACK_TIMEOUT_MS": "4001"}, "DTQ_REDIS_REPLICA_ACK_TIMEOUT_MS must be"),
])
def test_durable_ack_settings_are_range_checked(env, needle):
    with pytest.raises(SettingsError, match=needle):
        load([], environ=env)


def test_durable_acks_are_off_by_default_and_take_a_replica_count():
    assert load([]).redis_min_replicas_ack == 0
    s = load(["--redis-min-replicas-ack", "2", "--redis-replica-ack-timeout-ms", "250"])
    assert (s.redis_min_replicas_ack, s.redis_replica_ack_timeout_ms) == (2, 250)


def _openssl_pair(tmp_path, name: str):
    """A self-signed certificate and its unencrypted key (openssl CLI)."""
    import shutil
    import subprocess

    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={name}"],
                   check=True, capture_output=True)
    return cert, key


def test_tls_files_grpc_cannot_use_are_refused_at_load(tmp_path):
    """An empty, mismatched or non-PEM TLS file is a settings error naming the variable
    (exit 2, which also stops a --processes supervisor), not a bind failure later."""
    cert, key = _openssl_pair(tmp_path, "a")
    _, other_key = _openssl_pair(tmp_path, "b")
    empty = tmp_path / "empty.pem"
    empty.write_text("")
    ok = load(["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(cert)],
              environ={})
    assert ok.tls_cert == str(cert)
    for argv, needle in [
        (["--tls-cert", str(empty), "--tls-key", str(key)], "DTQ_TLS_CERT and DTQ_TLS_KEY"),
        (["--tls-cert", str(cert), "--tls-key", str(other_key)], "DTQ_TLS_CERT and DTQ_TLS_KEY"),
        (["--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(empty)],
         "DTQ_TLS_CLIENT_CA"),
    ]:
        with pytest.raises(SettingsError, match=needle):
            load(argv, environ={})
