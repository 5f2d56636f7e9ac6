"""Validation of Enqueue requests into normalized, ready-to-store tasks.

Every rule names the request field it checks; a failed rule raises
:class:`~dtq_gateway.errors.InvalidArgument` (or ``TooLarge``) and nothing is written.
Limits follow proto/dtq.proto.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dtq_gateway.domain import names
from dtq_gateway.errors import InvalidArgument, TooLarge
from dtq_proto import dtq_pb2

if TYPE_CHECKING:  # annotations only: the settings loader is wiring, above this leaf
    from dtq_gateway.settings import Settings

JSON_TYPES = ("application/json", "")
MAX_METADATA_ENTRIES = 64
MAX_ATTEMPTS = 100
MAX_TIMEOUT_MS = 86_400_000
#: Longest delay_ms and ttl_ms, and how far ahead not_before_ms / expires_at_ms may lie.
MAX_DELAY_MS = 365 * 86_400_000
#: Earliest plausible epoch ms (2001-09-09): a smaller time is a value in seconds.
MIN_EPOCH_MS = 1_000_000_000_000
#: Clock skew allowed between producer and gateway when checking absolute times (ms).
CLOCK_TOLERANCE_MS = 300_000
#: W3C traceparent: version-trace id-parent id-flags, lowercase hex (version ff is invalid).
TRACEPARENT_RE = re.compile(r"^(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}"
                            r"-[0-9a-f]{2}\Z")
#: Longest tracestate, in bytes (the W3C limit is 32 members of up to 256 characters;
#: dtq keeps the first 512 bytes' worth, which every vendor header fits in practice).
MAX_TRACESTATE_BYTES = 512
#: Longest audit reason (CancelTask, PauseQueue, ...), in bytes of UTF-8.
MAX_REASON_BYTES = 1024


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated task, with every default applied. Times in epoch ms, durations in ms."""

    task_id: str
    queue: str
    task_type: str
    payload: bytes
    content_type: str
    priority: int
    max_attempts: int
    timeout_ms: int
    idem_key: str
    idem_digest: str
    metadata_json: str
    backoff_base_ms: int
    backoff_cap_ms: int
    delay_ms: int
    not_before_ms: int
    expires_at_ms: int
    ttl_ms: int
    #: Extra record fields as a flat JSON array [name, value, ...] ("" = none): chain
    #: and group membership, set by followups.py.
    extra_json: str = ""
    #: Debounce ("" = none): ``<first|last>:<window ms>:<max delay ms>`` for enqueue.lua,
    #: and the SHA-256 hex of the debounce key (the record's name, names.debounce).
    debounce_spec: str = ""
    debounce_digest: str = ""


def check_queue(queue: str, field: str = "queue") -> str:
    """Return ``queue`` if it matches ``[A-Za-z0-9_.-]{1,64}``, else raise InvalidArgument."""
    if not names.QUEUE_RE.match(queue):
        raise InvalidArgument(f"{field}: queue name must match [A-Za-z0-9_.-]{{1,64}}",
                              field=field)
    return queue


def check_worker_id(worker_id: str, field: str = "worker_id") -> str:
    """Return ``worker_id`` if it matches ``[A-Za-z0-9_.:@-]{1,128}``."""
    if not names.WORKER_ID_RE.match(worker_id):
        raise InvalidArgument(f"{field}: must match [A-Za-z0-9_.:@-]{{1,128}}", field=field)
    return worker_id


#: Most entries of LeaseRequest.task_types; each is a task type (1..128 bytes).
MAX_TASK_TYPES = 256
#: Longest hostname a worker may report (bytes of UTF-8).
MAX_HOSTNAME_BYTES = 256


def check_task_types(task_types, field: str = "task_types") -> None:
    """Refuse more than MAX_TASK_TYPES entries, or one not matching the task-type
    alphabet ``[A-Za-z0-9_.:/-]{1,128}``."""
    if len(task_types) > MAX_TASK_TYPES:
        raise InvalidArgument(f"{field}: at most {MAX_TASK_TYPES} task types", field=field)
    for t in task_types:
        if not names.TASK_TYPE_RE.match(t):
            raise InvalidArgument(f"{field}: each must match [A-Za-z0-9_.:/-]{{1,128}}",
                                  field=field)


#: Longest LeaseRequest.sdk (bytes of UTF-8).
MAX_SDK_BYTES = 128


def check_worker_strings(request) -> None:
    """Bound of the free-text ``sdk`` of a LeaseRequest (MAX_SDK_BYTES). Its ``labels``
    are checked by ``broker_servicer.check_labels`` (32 entries, keys 1..64 bytes,
    values up to 256 bytes; the docs' tables are tested against those constants).

    Raises:
        InvalidArgument: naming ``sdk``.
    """
    if len(request.sdk.encode()) > MAX_SDK_BYTES:
        raise InvalidArgument(f"sdk: at most {MAX_SDK_BYTES} bytes", field="sdk")


def check_hostname(hostname: str, field: str = "hostname") -> str:
    """Refuse a hostname over MAX_HOSTNAME_BYTES bytes of UTF-8."""
    if len(hostname) > MAX_HOSTNAME_BYTES or len(hostname.encode()) > MAX_HOSTNAME_BYTES:
        raise InvalidArgument(f"{field}: at most {MAX_HOSTNAME_BYTES} bytes", field=field)
    return hostname


def check_task_id(task_id: str, field: str = "task_id") -> str:
    """Return ``task_id`` if it has the form of an id the gateway makes (32 lowercase hex
    characters, then ``-`` and a 1-4 character slot tag; see names.TASK_ID_RE)."""
    if not names.TASK_ID_RE.match(task_id):
        raise InvalidArgument(f"{field}: not a task id (32 lowercase hex characters and "
                              f"a slot tag, as Enqueue returns it)", field=field)
    return task_id


def cut_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` bytes of UTF-8, at a character boundary.

    The proto states text limits in bytes (error_message 4096, error_class 128,
    reasons 1024); cutting by characters would let multi-byte text through at up
    to four times the limit.

    Args:
        text: the user string.
        max_bytes: the limit in bytes of UTF-8 (>= 0).

    Returns:
        ``text`` itself when it fits, else its longest prefix that fits.
    """
    if len(text) * 4 <= max_bytes:  # fits whatever the characters: no encoding needed
        return text
    data = text.encode()
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", errors="ignore")


def _range(value: int, lo: int, hi: int, field: str) -> int:
    if not lo <= value <= hi:
        raise InvalidArgument(f"{field}: must be in {lo}..{hi} (got {value})", field=field)
    return value


def is_json_type(content_type: str) -> bool:
    """True for ``application/json`` and every ``<type>/<subtype>+json`` media type,
    parameters (``; charset=utf-8``) and case aside."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.endswith("+json") and "/" in media)


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON (RFC 8259)")


def check_json(payload: bytes, field: str) -> None:
    """Refuse a payload that is not RFC 8259 JSON in UTF-8.

    Refused: bytes that are not UTF-8 (UTF-16/32 included), a byte-order mark, the
    non-standard constants ``NaN``, ``Infinity`` and ``-Infinity``, and nesting deeper
    than the parser's recursion limit (about 1,000 levels of arrays and objects).
    Integers of any length pass: they are checked, not converted (Python refuses to make
    an int of more than 4,300 digits, which RFC 8259 allows).

    Raises:
        InvalidArgument: naming ``field``.
    """
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{field}: JSON must be UTF-8 (RFC 8259)", field=field) from None
    try:
        json.loads(text, parse_constant=_refuse_constant, parse_int=str)
    except RecursionError:
        raise InvalidArgument(f"{field}: JSON nested too deeply (at most about 1,000 levels "
                              "of arrays and objects)", field=field) from None
    except ValueError as exc:
        where = (f" at line {exc.lineno} column {exc.colno}"
                 if isinstance(exc, json.JSONDecodeError) else "")
        raise InvalidArgument(f"{field}: not valid JSON{where} (RFC 8259: UTF-8, no NaN or "
                              "Infinity) for a JSON content_type", field=field) from None


def _payload(req: dtq_pb2.EnqueueRequest, settings: Settings, prefix: str) -> str:
    if len(req.payload) > settings.max_payload_bytes:
        raise TooLarge(f"{prefix}payload: {len(req.payload)} bytes exceeds "
                       f"{settings.max_payload_bytes}", field=prefix + "payload")
    content_type = req.content_type or "application/json"
    if len(content_type) > 128:
        raise InvalidArgument(f"{prefix}content_type: too long", field=prefix + "content_type")
    if req.payload and is_json_type(content_type):
        check_json(req.payload, prefix + "payload")
    return content_type


def _metadata(req: dtq_pb2.EnqueueRequest, prefix: str, trace: tuple[str, str]) -> str:
    field = prefix + "metadata"
    if len(req.metadata) > MAX_METADATA_ENTRIES:
        raise InvalidArgument(f"{field}: at most {MAX_METADATA_ENTRIES} entries", field=field)
    for k, v in req.metadata.items():
        if not k or len(k.encode()) > 128 or len(v.encode()) > 1024:
            raise InvalidArgument(f"{field}: keys 1..128 bytes, values up to 1024 bytes",
                                  field=field)
    traceparent, tracestate = _trace(req, prefix, trace)
    if not traceparent:
        return json.dumps(dict(req.metadata), separators=(",", ":")) if req.metadata else "{}"
    meta = dict(req.metadata, traceparent=traceparent)
    if tracestate:
        meta["tracestate"] = tracestate
    return json.dumps(meta, separators=(",", ":"))


def _trace(req: dtq_pb2.EnqueueRequest, prefix: str, trace: tuple[str, str]) -> tuple[str, str]:
    """The (traceparent, tracestate) to store: the request fields, else the call's
    metadata. A malformed field is refused; malformed call metadata is ignored (a
    tracing proxy's header must not fail an enqueue)."""
    if req.traceparent:
        if not TRACEPARENT_RE.match(req.traceparent):
            raise InvalidArgument(f"{prefix}traceparent: not a W3C traceparent "
                                  "(00-<32 hex>-<16 hex>-<2 hex>)", field=prefix + "traceparent")
        if len(req.tracestate.encode()) > MAX_TRACESTATE_BYTES:
            raise InvalidArgument(f"{prefix}tracestate: at most {MAX_TRACESTATE_BYTES} bytes",
                                  field=prefix + "tracestate")
        return req.traceparent, req.tracestate
    if req.tracestate:
        raise InvalidArgument(f"{prefix}tracestate: needs traceparent",
                              field=prefix + "tracestate")
    if trace[0] and TRACEPARENT_RE.match(trace[0]):
        return trace[0], cut_utf8(trace[1], MAX_TRACESTATE_BYTES)
    return "", ""


def _epoch_ms(value: int, lo_ms: int, hi_ms: int, now_ms: int, field: str) -> None:
    """Refuse an absolute time outside ``lo_ms..hi_ms`` (0 = unset is always fine),
    naming the likely unit mistake."""
    if value == 0 or lo_ms <= value <= hi_ms:
        return
    if 0 < value < MIN_EPOCH_MS:
        hint = "looks like seconds"
    elif value > now_ms * 100:
        hint = "looks like microseconds or nanoseconds"
    elif value > hi_ms:
        hint = f"more than {MAX_DELAY_MS // 86_400_000} days ahead"
    else:
        hint = "already past"
    raise InvalidArgument(f"{field}: {value} is not a plausible epoch ms ({hint}; the gateway's "
                          f"clock reads {now_ms}; allowed {lo_ms}..{hi_ms})", field=field)


def _timing(req: dtq_pb2.EnqueueRequest, prefix: str, now_ms: int) -> None:
    if req.delay_ms and req.not_before_ms:
        raise InvalidArgument(f"{prefix}delay_ms: exclusive with not_before_ms",
                              field=prefix + "delay_ms")
    if req.expires_at_ms and req.ttl_ms:
        raise InvalidArgument(f"{prefix}ttl_ms: exclusive with expires_at_ms",
                              field=prefix + "ttl_ms")
    _range(req.delay_ms, 0, MAX_DELAY_MS, prefix + "delay_ms")
    _range(req.ttl_ms, 0, MAX_DELAY_MS, prefix + "ttl_ms")
    if req.not_before_ms < 0:
        raise InvalidArgument(f"{prefix}not_before_ms: must be >= 0", field=prefix + "not_before_ms")
    if req.expires_at_ms < 0:
        raise InvalidArgument(f"{prefix}expires_at_ms: must be >= 0", field=prefix + "expires_at_ms")
    # Absolute times get the bounds of their relative forms, against the gateway's clock
    # with CLOCK_TOLERANCE_MS for skew. Redis TIME still decides due and expiry times in
    # the scripts; these bounds only refuse unit mistakes (seconds, microseconds).
    latest = now_ms + MAX_DELAY_MS + CLOCK_TOLERANCE_MS
    _epoch_ms(req.not_before_ms, MIN_EPOCH_MS, latest, now_ms, prefix + "not_before_ms")
    _epoch_ms(req.expires_at_ms, now_ms - CLOCK_TOLERANCE_MS, latest, now_ms,
              prefix + "expires_at_ms")


#: Debounce modes as enqueue.lua spells them.
_DEBOUNCE_MODES = {dtq_pb2.DEBOUNCE_MODE_KEEP_FIRST: "first",
                   dtq_pb2.DEBOUNCE_MODE_KEEP_LAST: "last"}


def _debounce(req: dtq_pb2.EnqueueRequest, prefix: str) -> tuple[str, str]:
    """(spec, digest) of ``req.debounce`` for NewTask, ("", "") when unset.

    Raises:
        InvalidArgument: naming ``debounce.<field>`` (or ``debounce`` when it clashes
            with another field).
    """
    if not req.HasField("debounce"):
        return "", ""
    d, field = req.debounce, prefix + "debounce"
    for other in ("idempotency_key", "chain"):
        if getattr(req, other):
            raise InvalidArgument(f"{field}: exclusive with {other}", field=field)
    if not 1 <= len(d.key.encode()) <= 256:
        raise InvalidArgument(f"{field}.key: 1..256 bytes required", field=field + ".key")
    _range(d.window_ms, 1, MAX_DELAY_MS, field + ".window_ms")
    mode = _DEBOUNCE_MODES.get(d.mode)
    if mode is None:
        raise InvalidArgument(f"{field}.mode: KEEP_FIRST or KEEP_LAST required",
                              field=field + ".mode")
    if mode == "first" and d.max_delay_ms:
        raise InvalidArgument(f"{field}.max_delay_ms: KEEP_LAST only", field=field + ".max_delay_ms")
    if mode == "last":
        if d.max_delay_ms:
            _range(d.max_delay_ms, d.window_ms, MAX_DELAY_MS, field + ".max_delay_ms")
        for other in ("delay_ms", "not_before_ms"):
            if getattr(req, other):
                raise InvalidArgument(f"{field}: KEEP_LAST is exclusive with {other}",
                                      field=field)
    return f"{mode}:{d.window_ms}:{d.max_delay_ms}", names.idempotency_digest(d.key)


def validate_enqueue(req: dtq_pb2.EnqueueRequest, settings: Settings,
                     prefix: str = "", now_ms: int | None = None,
                     trace: tuple[str, str] = ("", "")) -> NewTask:
    """Validate one Enqueue request and apply defaults.

    Args:
        req: the request (or one EnqueueBatch item).
        settings: gateway settings (limits and defaults).
        prefix: field-name prefix for batch items, e.g. ``"items[3]."``.
        now_ms: the gateway's clock in epoch ms (default: read it), against which
            ``not_before_ms`` and ``expires_at_ms`` are bounded.
        trace: (traceparent, tracestate) of the call's gRPC metadata, used when the
            request carries none; stored in the metadata map under those names.

    Raises:
        InvalidArgument: a field is malformed (``.field`` names it).
        TooLarge: the payload exceeds DTQ_MAX_PAYLOAD_BYTES.
    """
    check_queue(req.queue, prefix + "queue")
    if not names.TASK_TYPE_RE.match(req.task_type):
        raise InvalidArgument(f"{prefix}task_type: must match [A-Za-z0-9_.:/-]{{1,128}}",
                              field=prefix + "task_type")
    content_type = _payload(req, settings, prefix)
    priority = _range(req.priority, 0, 9, prefix + "priority") if req.HasField("priority") else 5
    max_attempts = _range(req.max_attempts or settings.default_max_attempts, 1, MAX_ATTEMPTS,
                          prefix + "max_attempts")
    timeout_ms = _range(req.timeout_ms or settings.default_timeout_ms, 1, MAX_TIMEOUT_MS,
                        prefix + "timeout_ms")
    if len(req.idempotency_key.encode()) > 256:
        raise InvalidArgument(f"{prefix}idempotency_key: at most 256 bytes",
                              field=prefix + "idempotency_key")
    _timing(req, prefix, int(time.time() * 1000) if now_ms is None else now_ms)
    base = req.retry_policy.backoff_base_ms or settings.backoff_base_ms
    cap = req.retry_policy.backoff_cap_ms or settings.backoff_cap_ms
    _range(base, 1, 3_600_000, prefix + "retry_policy.backoff_base_ms")
    _range(cap, 1, 86_400_000, prefix + "retry_policy.backoff_cap_ms")
    if cap < base:
        field = prefix + "retry_policy.backoff_cap_ms"
        given = "" if req.retry_policy.backoff_cap_ms else ", the default"
        raise InvalidArgument(f"{field}: must be at least backoff_base_ms ({base} ms; got "
                              f"{cap} ms{given})", field=field)
    idem = req.idempotency_key
    debounce_spec, debounce_digest = _debounce(req, prefix)
    return NewTask(
        task_id=names.new_task_id(req.queue), queue=req.queue, task_type=req.task_type,
        payload=req.payload, content_type=content_type, priority=priority,
        max_attempts=max_attempts, timeout_ms=timeout_ms, idem_key=idem,
        idem_digest=names.idempotency_digest(idem) if idem else "",
        metadata_json=_metadata(req, prefix, trace), backoff_base_ms=base, backoff_cap_ms=cap,
        delay_ms=req.delay_ms, not_before_ms=req.not_before_ms,
        expires_at_ms=req.expires_at_ms, ttl_ms=req.ttl_ms,
        debounce_spec=debounce_spec, debounce_digest=debounce_digest)
