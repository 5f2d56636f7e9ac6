"""Lease ids: the fencing token handed to workers, signed so that it cannot be forged.

A lease is (stream entry, consumer, attempt) of one task. The id is opaque to
workers but self-contained, so any gateway replica can check an Ack, Fail or
Heartbeat without local state::

    2|<task_id>|<queue>|<band>|<entry_id>|<attempt>|<worker_id>|<idem digest or ->|<owner>|<mac>

Queue names, worker ids and task ids are validated against alphabets without
``|``, so splitting is unambiguous. The idempotency digest is carried so that
terminal updates can name the idempotency record key up front (Lua receives
every key through KEYS).

``owner`` is :func:`owner_tag` of the identity that opened the Lease stream (the
bearer-token identity and/or the mTLS certificate; see :func:`dtq_gateway.rpc.auth.caller_identity`):
only a caller with that identity may Ack, Fail or extend the lease. ``mac`` is the
first 128 bits of HMAC-SHA256 over everything before it, keyed with the deployment's
lease secret (:class:`Keyring`), in unpadded base64url (22 characters): an edited or
invented id does not verify, whoever sends it. Secrets rotate without downtime: ids
are signed with the first secret and accepted under any listed one, so a new secret is
first listed second (accepted everywhere) and only then first (docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets as _secrets
from dataclasses import dataclass

from dtq_gateway.errors import InvalidArgument, PermissionDenied
from dtq_gateway.store import leasing as store
from dtq_gateway.store.client import Client
from dtq_gateway.store.keys import QUEUE_RE, TASK_ID_RE, WORKER_ID_RE

log = logging.getLogger(__name__)

_VERSION = "2"
_ENTRY_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}\Z")
_DIGEST_RE = re.compile(r"^(-|[0-9a-f]{64})\Z")
_ATTEMPT_RE = re.compile(r"^(0|[1-9][0-9]{0,8})\Z")  # canonical: "01" is not attempt 1
_OWNER_RE = re.compile(r"^[0-9a-f]{16}\Z")
_MAC_RE = re.compile(r"^[A-Za-z0-9_-]{22}\Z")
MAX_LEN = 450
#: Shortest lease secret accepted (bytes of UTF-8).
MIN_SECRET_BYTES = 16


def owner_tag(identity: str) -> str:
    """16 hex characters naming a caller identity (SHA-256 prefix); "" has a tag too
    (the anonymous caller of a gateway without auth or mTLS)."""
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:16]


class Keyring:
    """The lease-id secrets of a deployment: signs with the first, accepts any.

    Args:
        secrets: one or more secrets (bytes), the signing one first. Every replica of a
            deployment must hold the same list (DTQ_LEASE_SECRET, or the one stored in
            Redis when that is unset).
    """

    def __init__(self, secrets: list[bytes] | None = None, loader=None) -> None:
        self._secrets: list[bytes] = list(secrets or [])
        #: async callable filling this keyring (load_keyring bound to the gateway's
        #: Redis and settings), run by :meth:`ensure` until a secret is known
        self._loader = loader

    async def ensure(self) -> None:
        """Load the secrets if none is known yet (a gateway that started while Redis
        was down loads them at its first lease or Ack).

        Raises:
            redis errors: Redis unreachable.
        """
        if not self._secrets and self._loader is not None:
            await self._loader(self)

    @property
    def ready(self) -> bool:
        """True once at least one secret is known."""
        return bool(self._secrets)

    def set(self, secrets: list[bytes]) -> None:
        """Replace the secrets (the signing one first)."""
        self._secrets = list(secrets)

    def _mac(self, secret: bytes, body: str) -> str:
        digest = hmac.new(secret, body.encode(), hashlib.sha256).digest()[:16]
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    def sign(self, body: str) -> str:
        """MAC of ``body`` under the first secret.

        Raises:
            RuntimeError: no secret loaded yet.
        """
        if not self._secrets:
            raise RuntimeError("lease secret not loaded")
        return self._mac(self._secrets[0], body)

    def verify(self, body: str, mac: str) -> bool:
        """True when ``mac`` is the MAC of ``body`` under any secret (constant time each)."""
        ok = False
        for secret in self._secrets:
            ok |= hmac.compare_digest(self._mac(secret, body), mac)
        return ok


def parse_secrets(spec: str) -> list[bytes]:
    """``DTQ_LEASE_SECRET``: comma-separated secrets, the signing one first (blank items
    ignored).

    Raises:
        ValueError: a secret shorter than MIN_SECRET_BYTES (message never quotes it).
    """
    out = []
    for pos, item in enumerate(spec.split(","), start=1):
        item = item.strip()
        if not item:
            continue
        if len(item.encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"entry {pos}: a lease secret needs at least "
                             f"{MIN_SECRET_BYTES} bytes")
        out.append(item.encode())
    return out


async def load_keyring(keyring: Keyring, redis: Client, configured: str) -> None:
    """Fill ``keyring`` from ``configured`` (DTQ_LEASE_SECRET) or, when that is empty,
    from the deployment secret stored in Redis (``dtq:secret:lease``), creating it
    once with SET NX so that every replica signs with the same secret. Does nothing
    once the keyring holds a secret.

    Raises:
        redis errors: Redis unreachable (the caller retries later).
    """
    if keyring.ready:
        return
    if configured:
        keyring.set(parse_secrets(configured))
        return
    stored = await store.load_lease_secret(redis, _secrets.token_hex(32))
    if stored:
        keyring.set([stored])


_PROCESS_KEYRING = Keyring([_secrets.token_bytes(32)])


def default_keyring() -> Keyring:
    """A keyring with a random per-process secret, for components built alone (tools,
    tests). A gateway never uses it: it loads the deployment's secret (Gateway.start)."""
    return _PROCESS_KEYRING


@dataclass(frozen=True, slots=True)
class Lease:
    """Decoded lease id. ``owner`` is the :func:`owner_tag` of the identity it was
    issued to."""

    task_id: str
    queue: str
    band: int
    entry_id: str
    attempt: int
    worker_id: str
    idem_digest: str  # "" when the task has no idempotency key
    owner: str = ""

    def body(self) -> str:
        """The signed part of the wire form."""
        return "|".join((_VERSION, self.task_id, self.queue, str(self.band), self.entry_id,
                         str(self.attempt), self.worker_id, self.idem_digest or "-",
                         self.owner or owner_tag("")))

    def encode(self, keyring: Keyring) -> str:
        """The wire form of this lease, signed with ``keyring``'s first secret."""
        body = self.body()
        return body + "|" + keyring.sign(body)

    @property
    def tag(self) -> str:
        """``<queue>:<band>:<digest or ->``: what the scripts check against the task record
        (its queue, priority and idem_digest), so a lease id edited to name another
        queue, band or idempotency record is stale, not a way to reach another stream's
        entry with the same id or to skip the idempotency update."""
        return f"{self.queue}:{self.band}:{self.idem_digest or '-'}"


def decode(lease_id: str, keyring: Keyring, field: str = "lease_id",
           caller: str | None = None) -> Lease:
    """Parse and verify a lease id.

    Args:
        lease_id: the wire form.
        keyring: the deployment's secrets.
        field: request field named in errors.
        caller: the calling identity (:func:`dtq_gateway.rpc.auth.caller_identity`); None
            skips the owner check (the gateway's own releases).

    Raises:
        InvalidArgument: malformed id (reason MALFORMED_LEASE).
        PermissionDenied: the MAC does not verify (reason LEASE_SIGNATURE: edited,
            invented, or signed with a secret no longer listed), or the lease was issued
            to another identity (reason LEASE_NOT_OWNED).
    """
    parts = lease_id.split("|") if len(lease_id) <= MAX_LEN else []
    if (len(parts) != 10 or parts[0] != _VERSION or not TASK_ID_RE.match(parts[1])
            or not QUEUE_RE.match(parts[2]) or parts[3] not in "0123456789"
            or len(parts[3]) != 1 or not _ENTRY_RE.match(parts[4]) or not _ATTEMPT_RE.match(parts[5])
            or not WORKER_ID_RE.match(parts[6]) or not _DIGEST_RE.match(parts[7])
            or not _OWNER_RE.match(parts[8]) or not _MAC_RE.match(parts[9])):
        raise InvalidArgument(f"{field}: malformed lease id", field=field, reason="MALFORMED_LEASE")
    if not keyring.verify(lease_id.rpartition("|")[0], parts[9]):
        raise PermissionDenied(f"{field}: lease id does not verify (edited, or issued under "
                               "a lease secret no longer configured)", field=field,
                               reason="LEASE_SIGNATURE")
    if caller is not None and parts[8] != owner_tag(caller):
        raise PermissionDenied(f"{field}: lease was issued to another identity", field=field,
                               reason="LEASE_NOT_OWNED")
    return Lease(parts[1], parts[2], int(parts[3]), parts[4], int(parts[5]), parts[6],
                 "" if parts[7] == "-" else parts[7], parts[8])
