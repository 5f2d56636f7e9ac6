"""Durable acknowledgements (DTQ_REDIS_MIN_REPLICAS_ACK): what a write waits for.

Redis replication is asynchronous: a write the primary answered may be missing on the
replica promoted after the primary's death. With the setting on, the store follows the
writes of Enqueue, EnqueueBatch, Ack and Fail with ``WAIT replicas timeout_ms`` on the
same connection (``scripts.execute``) and answers OK only when enough replicas have
them; docs/delivery-guarantees.md states what that buys and what it costs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """Durable acknowledgements (DTQ_REDIS_MIN_REPLICAS_ACK): the writes of a call are
    followed, on the same connection, by ``WAIT replicas timeout_ms``, and a write whose
    WAIT reports fewer replicas is answered :class:`ReplicasNotAcked` in its place.

    Args:
        replicas: replicas that must have the write (1..16).
        timeout_ms: longest wait (ms, 10..4000).
    """

    replicas: int
    timeout_ms: int

    @classmethod
    def of(cls, replicas: int, timeout_ms: int) -> ReplicaWait | None:
        """The wait for these settings, or None when ``replicas`` is 0 (off)."""
        return cls(replicas, timeout_ms) if replicas > 0 else None
