"""Gateway settings: one frozen dataclass built from ``DTQ_*`` env vars and flags.

Every field has an environment variable (``DTQ_<FIELD>`` upper-cased) and a
command-line flag (``--<field-with-dashes>``); a flag wins over the environment.
Nothing is read at import time: call :func:`load`. Validation errors raise
:class:`SettingsError` with one line naming the variable, which the CLI prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import re
import socket
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

#: A queue name (dtq_gateway.store.keys.QUEUE_RE; settings import nothing of the store).
_QUEUE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")


class SettingsError(ValueError):
    """A setting is missing, malformed or inconsistent (message names it)."""


def _meta(help_: str, *, secret: bool = False) -> dict[str, Any]:
    return {"help": help_, "secret": secret}


@dataclass(frozen=True)
class Settings:
    """Validated gateway configuration. Units are in the field names."""

    redis_url: str = field(default="", metadata=_meta(
        "Redis URL (redis://, rediss:// or unix://). Empty = start an embedded "
        "redis-server. In cluster mode any node of the cluster; in sentinel mode a "
        "sentinel, or a comma list of them (redis://s1:26379,s2:26379).", secret=True))
    redis_mode: str = field(default="standalone", metadata=_meta(
        "standalone (one Redis), cluster (Redis Cluster: DTQ_REDIS_URL names any node) or "
        "sentinel (DTQ_REDIS_URL names the sentinels, DTQ_REDIS_SENTINEL_MASTER the "
        "service)."))
    redis_sentinel_master: str = field(default="", metadata=_meta(
        "Sentinel service name of the dtq primary (sentinel mode only)."))
    redis_sentinel_password: str = field(default="", metadata=_meta(
        "Password of the sentinels themselves (sentinel mode; empty = none).", secret=True))
    redis_min_replicas_ack: int = field(default=0, metadata=_meta(
        "Durable acknowledgements (0..16; 0 = off): Enqueue, EnqueueBatch, Ack and Fail "
        "send Redis WAIT after their write and answer OK only once this many replicas "
        "have it; fewer within DTQ_REDIS_REPLICA_ACK_TIMEOUT_MS answers UNAVAILABLE (the "
        "write may have been applied: resend). Needs that many replicas per primary."))
    redis_replica_ack_timeout_ms: int = field(default=1000, metadata=_meta(
        "Longest wait for DTQ_REDIS_MIN_REPLICAS_ACK replicas per write (ms, 10..4000: "
        "below the 5 s Redis socket timeout)."))
    listen: str = field(default="127.0.0.1:50051", metadata=_meta("gRPC listen address host:port."))
    gateway_processes: int = field(default=1, metadata=_meta(
        "Gateway processes sharing DTQ_LISTEN (also --processes; 0..256): 1 = this process "
        "serves; "
        "N > 1 = a supervisor starts N gateway processes on the one address (SO_REUSEPORT), "
        "restarts one that dies and drains all on SIGTERM; 0 = one per CPU core. Process i "
        "is <DTQ_GATEWAY_ID>-i, serves metrics on DTQ_METRICS_PORT + i, and only process 0 "
        "serves the dashboard (docs/operations.md)."))
    listen_reuseport: bool = field(default=False, metadata=_meta(
        "Bind DTQ_LISTEN with SO_REUSEPORT, sharing it with other gateway processes of this "
        "user that set it too (the kernel spreads new connections over them); the "
        "supervisor of DTQ_GATEWAY_PROCESSES sets it for its processes. Off, a taken port "
        "fails the start."))
    metrics_port: int = field(default=9464, metadata=_meta(
        "Prometheus HTTP port; 0 disables. /metrics has no authentication: bind it where "
        "only the scraper reaches it (DTQ_METRICS_HOST)."))
    metrics_host: str = field(default="", metadata=_meta(
        "Address the /metrics endpoint binds to (e.g. 127.0.0.1, or an internal "
        "interface); empty = the host of DTQ_LISTEN."))
    dashboard_port: int = field(default=0, metadata=_meta(
        "Web dashboard HTTP port; 0 disables it (docs/dashboard.md)."))
    dashboard_host: str = field(default="127.0.0.1", metadata=_meta(
        "Address the web dashboard listens on (loopback only by default). With "
        "DTQ_AUTH_TOKENS set, every dashboard API call needs an admin token."))
    metrics_max_queues: int = field(default=200, metadata=_meta(
        "Most queues with per-queue gauges (the deepest busy queues win; "
        "dtq_metrics_queues_omitted counts the rest)."))
    max_queues: int = field(default=10000, metadata=_meta(
        "Most queue names in the registry (dtq:queues); Enqueue or Lease naming a new queue "
        "beyond it answers RESOURCE_EXHAUSTED (TOO_MANY_QUEUES). Replicas check it "
        "independently, so a burst of new names may pass it by a few."))
    max_schedules: int = field(default=10000, metadata=_meta(
        "Most periodic schedules (all queues together); CreateSchedule of a new name "
        "beyond it answers RESOURCE_EXHAUSTED (TOO_MANY_SCHEDULES). Replicas check it "
        "independently, so concurrent creates may pass it by a few."))
    max_rate_limits: int = field(default=10000, metadata=_meta(
        "Most rate limits (queue-wide and per task type, all queues together); "
        "SetRateLimit of a new limit beyond it answers RESOURCE_EXHAUSTED "
        "(TOO_MANY_RATE_LIMITS); changing an existing one is always accepted."))
    queue_idle_delete_s: float = field(default=86400.0, metadata=_meta(
        "A drained queue nothing has written, read or listened on for this long is deleted "
        "(its ten empty streams and registry entry), between one and two such periods "
        "after its last use; a paused queue is kept. 0 = never (s)."))
    max_streams_per_peer: int = field(default=10000, metadata=_meta(
        "Most calls (Lease and Subscribe streams included) one client IP address may have "
        "open on this gateway at once; more answer RESOURCE_EXHAUSTED (TOO_MANY_CALLS)."))
    grpc_max_connections: int = field(default=10000, metadata=_meta(
        "Most client connections this gateway accepts at once (all peers together); "
        "keep it below the process's open-file limit."))
    grpc_max_concurrent_streams: int = field(default=1000, metadata=_meta(
        "Most calls open at once on one client connection (HTTP/2 "
        "SETTINGS_MAX_CONCURRENT_STREAMS); grpc clients queue further calls until one ends "
        "(checked with grpc Python and grpc-js). Raise it, or open more connections, for "
        "more calls in flight from one client."))
    grpc_max_pending_calls: int = field(default=10000, metadata=_meta(
        "Most calls that have arrived (all connections together) but that the gateway has "
        "not started handling yet; beyond it grpc cancels new calls at once: the client "
        "sees CANCELLED, the call never reached a handler, and it is safe to retry."))
    grpc_max_connection_idle_ms: int = field(default=300000, metadata=_meta(
        "A connection with no open call for this long is closed (ms); clients reconnect "
        "on their next call. 0 = never."))
    lease_buffer_max_bytes: int = field(default=8 << 20, metadata=_meta(
        "Most payload bytes delivered to one Lease stream and not yet written to it; leases "
        "beyond it are released at once (back to their queue, no attempt spent), so a "
        "stream that does not read pins at most this much memory (bytes)."))
    visibility_timeout_s: float = field(default=30.0, metadata=_meta(
        "Lease visibility timeout: an entry idle this long may be reclaimed (s)."))
    heartbeat_interval_s: float = field(default=10.0, metadata=_meta(
        "Worker heartbeat interval (s); must be below the visibility timeout."))
    lease_stall_heartbeats: int = field(default=2, metadata=_meta(
        "A Lease stream whose written leases get no receipt (a heartbeat, Ack or Fail "
        "naming one) for this many heartbeat intervals, at most half the visibility "
        "timeout, while its worker's heartbeats arrive, has stopped reading: it is ended "
        "(UNAVAILABLE, reason NOT_READING) and its unread leases go back to their queue "
        "with no attempt spent (docs/protocol.md 3.3). 0 = never."))
    lease_grace_ms: int = field(default=5000, metadata=_meta(
        "Leases stop being extended after started_at + timeout_ms + this grace (ms)."))
    task_retention_s: int = field(default=7 * 86400, metadata=_meta(
        "TTL of task hashes, refreshed on every update (s)."))
    result_retention_s: int = field(default=3600, metadata=_meta("TTL of results (s)."))
    result_max_bytes: int = field(default=8192, metadata=_meta(
        "Results longer than this are truncated (bytes)."))
    idem_ttl_s: int = field(default=86400, metadata=_meta(
        "How long an idempotency key dedupes, counted from the enqueue (s); a key whose "
        "task is still live (scheduled, queued, active, retrying) dedupes until it ends."))
    dlq_maxlen: int = field(default=10000, metadata=_meta(
        "Approximate MAXLEN of the dead-letter stream (entries)."))
    audit_maxlen: int = field(default=10000, metadata=_meta(
        "Approximate MAXLEN of the audit stream (entries)."))
    recent_max: int = field(default=10000, metadata=_meta(
        "Size of the recent-tasks index (entries)."))
    history_interval_s: float = field(default=60.0, metadata=_meta(
        "The scheduler leader stores one history sample of each busy queue this often "
        "(the dashboard's charts; s)."))
    history_points: int = field(default=120, metadata=_meta(
        "History samples kept per queue and for all queues together (each list is "
        "trimmed to this many and expires after points x interval)."))
    keep_finished: int = field(default=0, metadata=_meta(
        "Most succeeded or cancelled task records kept per queue, besides their TTL "
        "(DTQ_TASK_RETENTION_S): past it the oldest are deleted with their results by "
        "the acks and cancels themselves. 0 = no count limit."))
    keep_finished_queues: str = field(default="", metadata=_meta(
        "Per-queue DTQ_KEEP_FINISHED: 'queue=N,queue2=M' (N >= 0; 0 = no count limit for "
        "that queue); queues not named use DTQ_KEEP_FINISHED."))
    max_queue_depth: int = field(default=0, metadata=_meta(
        "Per-queue depth gate: Enqueue answers RESOURCE_EXHAUSTED above it; 0 = none."))
    max_payload_bytes: int = field(default=1 << 20, metadata=_meta("Largest payload (bytes)."))
    default_max_attempts: int = field(default=3, metadata=_meta(
        "Attempts when Enqueue leaves max_attempts 0."))
    default_timeout_ms: int = field(default=60000, metadata=_meta(
        "Handler timeout when Enqueue leaves timeout_ms 0 (ms)."))
    backoff_base_ms: int = field(default=1000, metadata=_meta("Retry backoff base (ms)."))
    backoff_cap_ms: int = field(default=300000, metadata=_meta("Retry backoff cap (ms)."))
    max_in_flight_cap: int = field(default=10000, metadata=_meta(
        "Largest max_in_flight granted to one Lease session."))
    scheduler_interval_ms: int = field(default=250, metadata=_meta(
        "Period of the scheduler leader's moves of due tasks (ms)."))
    redis_max_connections: int = field(default=16, metadata=_meta(
        "Redis calls in flight at once, all RPCs and duties together: the connection "
        "pool's size (a call waits up to 5 s for a free connection); in cluster mode "
        "calls wait for one of this many slots and each node's pool holds as many."))
    events_max_subscribers: int = field(default=256, metadata=_meta(
        "Most open Events.Subscribe streams per gateway; more are refused with "
        "RESOURCE_EXHAUSTED."))
    events_max_deliveries_per_s: int = field(default=5000, metadata=_meta(
        "Events buffered for Events.Subscribe streams per second, all streams together "
        "(events x subscribers); beyond it events are dropped and counted."))
    consumer_prune_idle_s: float = field(default=300.0, metadata=_meta(
        "A worker id's consumer in a queue's streams is deleted once it holds no pending "
        "entry and has not read for this long (s); checked per busy queue every minute."))
    shutdown_grace_s: float = field(default=10.0, metadata=_meta(
        "On SIGTERM, unary calls get this long to finish (s)."))
    grpc_keepalive_time_ms: int = field(default=10000, metadata=_meta(
        "HTTP/2 keepalive: the gateway PINGs each client connection this often, also "
        "while no call is open (ms)."))
    grpc_keepalive_timeout_ms: int = field(default=5000, metadata=_meta(
        "A connection whose keepalive PING is not answered this long is closed, ending "
        "its Lease streams (ms)."))
    grpc_min_ping_interval_ms: int = field(default=5000, metadata=_meta(
        "Shortest interval between client PINGs the gateway accepts (ms); must not exceed "
        "the workers' keepalive time (10000 in the reference workers)."))
    require_noeviction: bool = field(default=True, metadata=_meta(
        "Refuse to serve while Redis maxmemory-policy is not noeviction (startup fails; "
        "at run time health NOT_SERVING and Enqueue FAILED_PRECONDITION); false = warn."))
    eviction_check_interval_s: float = field(default=30.0, metadata=_meta(
        "How often the Redis maxmemory-policy is read again (s)."))
    followup_sweep_interval_s: float = field(default=2.0, metadata=_meta(
        "How often the scheduler leader looks for chain steps and group callbacks that a "
        "gateway did not create right after the Ack/Fail that owed them (s)."))
    embedded_dir: str = field(default=".dtq/redis", metadata=_meta(
        "Data directory of the embedded redis-server (AOF on). One gateway per directory: "
        "a second one on it is refused (run it with DTQ_REDIS_URL=unix://<dir>/redis.sock "
        "to share the first one's Redis)."))
    tls_cert: str = field(default="", metadata=_meta(
        "Server certificate PEM path (enables TLS). With DTQ_TLS_KEY it must load as a "
        "matching certificate and unencrypted key, else the start fails (exit 2)."))
    tls_key: str = field(default="", metadata=_meta("Server private key PEM path.", secret=True))
    tls_client_ca: str = field(default="", metadata=_meta(
        "CA bundle PEM path; when set, clients must present a certificate (mTLS)."))
    auth_tokens: str = field(default="", metadata=_meta(
        "Bearer tokens 'token=role:identity,...' (roles producer, worker, scaler, admin); "
        "empty = no auth.", secret=True))
    lease_secret: str = field(default="", metadata=_meta(
        "Lease-id secrets, comma-separated (16+ bytes each): ids are signed with the first "
        "and accepted under any. Rotate in three rolling steps: 'old,new' (accept the "
        "new), 'new,old' (sign with it), then 'new' after the visibility timeout "
        "(docs/security.md). Empty = a random "
        "secret created once in Redis (dtq:secret:lease) and shared by every replica.",
        secret=True))
    gateway_id: str = field(default="", metadata=_meta(
        "Identity of this replica; default host-pid-random."))
    log_level: str = field(default="INFO", metadata=_meta("Log level."))
    log_format: str = field(default="json", metadata=_meta("Log format: json or text."))

    def __repr__(self) -> str:
        parts = []
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("secret") and value:
                value = "***"
            parts.append(f"{f.name}={value!r}")
        return f"Settings({', '.join(parts)})"

    @property
    def visibility_timeout_ms(self) -> int:
        """Visibility timeout in ms."""
        return int(self.visibility_timeout_s * 1000)

    @property
    def heartbeat_interval_ms(self) -> int:
        """Heartbeat interval in ms."""
        return int(self.heartbeat_interval_s * 1000)

    def keep_finished_for(self, queue: str) -> int:
        """DTQ_KEEP_FINISHED of ``queue``: its DTQ_KEEP_FINISHED_QUEUES entry, else
        DTQ_KEEP_FINISHED (0 = no count limit)."""
        return parse_keep_finished_queues(self.keep_finished_queues).get(
            queue, self.keep_finished)

    @property
    def worker_ttl_ms(self) -> int:
        """TTL of worker hashes: three heartbeat intervals (ms)."""
        return 3 * self.heartbeat_interval_ms


_POSITIVE = {
    "visibility_timeout_s", "heartbeat_interval_s", "task_retention_s", "result_retention_s",
    "idem_ttl_s", "dlq_maxlen", "audit_maxlen", "recent_max", "max_payload_bytes",
    "default_max_attempts", "default_timeout_ms", "backoff_base_ms", "backoff_cap_ms",
    "max_in_flight_cap", "scheduler_interval_ms", "result_max_bytes", "redis_max_connections",
    "events_max_subscribers", "events_max_deliveries_per_s",
    "metrics_max_queues", "consumer_prune_idle_s",
    "grpc_keepalive_time_ms", "grpc_keepalive_timeout_ms", "grpc_min_ping_interval_ms",
    "eviction_check_interval_s", "max_queues", "max_schedules", "max_rate_limits",
    "max_streams_per_peer", "grpc_max_connections",
    "grpc_max_concurrent_streams", "grpc_max_pending_calls", "lease_buffer_max_bytes",
    "followup_sweep_interval_s", "history_interval_s", "history_points",
}
#: Most gateway processes one supervisor runs (DTQ_GATEWAY_PROCESSES): each is a full
#: replica with its own Redis pool, so far more than the host's cores only costs memory.
MAX_GATEWAY_PROCESSES = 256
_NON_NEGATIVE = {"gateway_processes", "queue_idle_delete_s", "grpc_max_connection_idle_ms",
                 "metrics_port",
                 "dashboard_port", "max_queue_depth", "keep_finished", "lease_grace_ms",
                 "shutdown_grace_s", "lease_stall_heartbeats"}


def env_name(name: str) -> str:
    """Environment variable of a settings field, e.g. ``DTQ_REDIS_URL``."""
    return "DTQ_" + name.upper()


_BOOLS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}


def _convert(name: str, raw: str, typ: Any, source: str) -> Any:
    if typ in (bool, "bool"):
        if raw.lower() not in _BOOLS:
            raise SettingsError(f"{source}: expected true or false, got {raw!r}")
        return _BOOLS[raw.lower()]
    try:
        if typ in (int, "int"):
            return int(raw)
        if typ in (float, "float"):
            return float(raw)
    except ValueError:
        raise SettingsError(f"{source}: expected a number, got {raw!r}") from None
    return raw


@functools.cache
def parse_keep_finished_queues(text: str) -> dict[str, int]:
    """``{queue: N}`` of DTQ_KEEP_FINISHED_QUEUES (``queue=N,...``; blanks ignored).

    Raises:
        SettingsError: an item that is not ``<queue name>=<integer >= 0>``.
    """
    out: dict[str, int] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        name, sep, raw = item.strip().partition("=")
        if not sep or not _QUEUE_NAME_RE.match(name) or not raw.strip().isdigit():
            raise SettingsError(f"DTQ_KEEP_FINISHED_QUEUES: {item.strip()!r} is not "
                                "queue=N (a queue name and an integer >= 0)")
        out[name] = int(raw)
    return out


def _check_tls_files(s: Settings) -> None:
    """Refuse TLS files that are missing or that grpc could not use: a certificate and
    key that do not load as a matching PEM pair, or a client CA with no certificate.
    Checked here, grpc would only say "Failed to bind" (and --processes would restart
    its processes forever)."""
    import ssl

    for path_field in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(s, path_field)
        if path and not os.path.isfile(path):
            raise SettingsError(f"{env_name(path_field)}: no such file {path!r}")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        if s.tls_cert:  # an encrypted key fails on the empty password, never prompts
            ctx.load_cert_chain(s.tls_cert, s.tls_key, password=lambda: b"")
    except (ssl.SSLError, OSError) as exc:
        raise SettingsError(f"DTQ_TLS_CERT and DTQ_TLS_KEY are not a usable PEM "
                            f"certificate and unencrypted private key that match: {exc}") from None
    try:
        if s.tls_client_ca:
            ctx.load_verify_locations(cafile=s.tls_client_ca)
    except (ssl.SSLError, OSError) as exc:
        raise SettingsError(f"DTQ_TLS_CLIENT_CA is not a PEM CA bundle: {exc}") from None


def _validate(s: Settings) -> None:
    parse_keep_finished_queues(s.keep_finished_queues)
    for name in _POSITIVE:
        if getattr(s, name) <= 0:
            raise SettingsError(f"{env_name(name)} must be > 0 (got {getattr(s, name)})")
    for name in _NON_NEGATIVE:
        if getattr(s, name) < 0:
            raise SettingsError(f"{env_name(name)} must be >= 0 (got {getattr(s, name)})")
    if s.heartbeat_interval_s >= s.visibility_timeout_s:
        raise SettingsError(
            f"DTQ_HEARTBEAT_INTERVAL_S ({s.heartbeat_interval_s}) must be below "
            f"DTQ_VISIBILITY_TIMEOUT_S ({s.visibility_timeout_s}) so a live worker's "
            "heartbeat always lands before its leases can be reclaimed")
    if s.backoff_base_ms > s.backoff_cap_ms:
        raise SettingsError("DTQ_BACKOFF_BASE_MS must not exceed DTQ_BACKOFF_CAP_MS")
    host, sep, port = s.listen.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise SettingsError(f"DTQ_LISTEN must be host:port with a port 0..65535 "
                            f"(got {s.listen!r})")
    if s.gateway_processes > MAX_GATEWAY_PROCESSES:
        raise SettingsError(f"DTQ_GATEWAY_PROCESSES must be at most {MAX_GATEWAY_PROCESSES} "
                            f"(got {s.gateway_processes}); 0 = one per CPU core")
    if s.gateway_processes != 1 and int(port) == 0:
        raise SettingsError("DTQ_GATEWAY_PROCESSES other than 1 needs a fixed port in "
                            f"DTQ_LISTEN (got {s.listen!r}): port 0 would give each "
                            "process its own port")
    if s.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise SettingsError(f"DTQ_LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL "
                            f"(got {s.log_level!r})")
    if s.metrics_port > 65535:
        raise SettingsError(f"DTQ_METRICS_PORT must be a port number (got {s.metrics_port})")
    if s.metrics_port and s.metrics_port + max(1, s.gateway_processes) - 1 > 65535:
        raise SettingsError(f"DTQ_METRICS_PORT + DTQ_GATEWAY_PROCESSES - 1 must be a port "
                            f"number (got {s.metrics_port} and {s.gateway_processes})")
    if s.dashboard_port > 65535:
        raise SettingsError(f"DTQ_DASHBOARD_PORT must be a port number (got {s.dashboard_port})")
    if s.dashboard_port and not s.dashboard_host.strip():
        raise SettingsError("DTQ_DASHBOARD_HOST must not be empty while DTQ_DASHBOARD_PORT is set")
    if s.redis_url and not s.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError("DTQ_REDIS_URL must start with redis://, rediss:// or unix://")
    if s.redis_mode not in ("standalone", "cluster", "sentinel"):
        raise SettingsError(f"DTQ_REDIS_MODE must be standalone, cluster or sentinel "
                            f"(got {s.redis_mode!r})")
    if s.redis_mode != "standalone" and not s.redis_url:
        raise SettingsError(f"DTQ_REDIS_MODE={s.redis_mode} needs DTQ_REDIS_URL (the "
                            "embedded redis-server is standalone only)")
    if not 0 <= s.redis_min_replicas_ack <= 16:
        raise SettingsError(f"DTQ_REDIS_MIN_REPLICAS_ACK must be 0..16 "
                            f"(got {s.redis_min_replicas_ack})")
    if not 10 <= s.redis_replica_ack_timeout_ms <= 4000:
        raise SettingsError(f"DTQ_REDIS_REPLICA_ACK_TIMEOUT_MS must be 10..4000 "
                            f"(got {s.redis_replica_ack_timeout_ms})")
    if s.redis_mode == "sentinel" and not s.redis_sentinel_master:
        raise SettingsError("DTQ_REDIS_MODE=sentinel needs DTQ_REDIS_SENTINEL_MASTER "
                            "(the service name the sentinels monitor)")
    if bool(s.tls_cert) != bool(s.tls_key):
        raise SettingsError("DTQ_TLS_CERT and DTQ_TLS_KEY must be set together")
    if s.tls_client_ca and not s.tls_cert:
        raise SettingsError("DTQ_TLS_CLIENT_CA needs DTQ_TLS_CERT and DTQ_TLS_KEY")
    _check_tls_files(s)
    if s.log_format not in ("json", "text"):
        raise SettingsError(f"DTQ_LOG_FORMAT must be json or text (got {s.log_format!r})")
    if s.lease_secret:
        from dtq_gateway.leasing.leaseid import parse_secrets

        try:
            if not parse_secrets(s.lease_secret):
                raise ValueError("no secret given")
        except ValueError as exc:
            raise SettingsError(f"DTQ_LEASE_SECRET: {exc}") from None
    if s.auth_tokens:
        from dtq_gateway.rpc.auth import parse_tokens  # local import: auth is optional

        try:
            parse_tokens(s.auth_tokens)
        except ValueError as exc:
            raise SettingsError(f"DTQ_AUTH_TOKENS: {exc}") from None


#: Short flags of some settings, beside their ``--<field>`` flag.
_ALIASES = {"gateway_processes": ("--processes",)}


def build_parser() -> argparse.ArgumentParser:
    """Argument parser with one flag per settings field (defaults come from env)."""
    parser = argparse.ArgumentParser(
        prog="dtq-gateway",
        description="dtq gateway: gRPC front of the task queue; the only Redis client.",
    )
    for f in fields(Settings):
        flags = ["--" + f.name.replace("_", "-"), *_ALIASES.get(f.name, ())]
        parser.add_argument(*flags, dest=f.name, default=None,
                            help=f"{f.metadata['help']} [env {env_name(f.name)}]")
    return parser


def load(argv: Sequence[str] | None = None,
         environ: Mapping[str, str] | None = None) -> Settings:
    """Build validated settings from flags (``argv``) over env (``environ``).

    Raises:
        SettingsError: a value is malformed or the combination is invalid.
    """
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(list(argv) if argv is not None else [])
    values: dict[str, Any] = {}
    for f in fields(Settings):
        raw = getattr(args, f.name)
        source = "--" + f.name.replace("_", "-")
        if raw is None:
            raw = environ.get(env_name(f.name))
            source = env_name(f.name)
        if raw is None:
            continue
        values[f.name] = _convert(f.name, raw.strip(), f.type, source)
    settings = Settings(**values)
    if not settings.gateway_id:
        gid = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        settings = dataclasses.replace(settings, gateway_id=gid)
    _validate(settings)
    return settings
