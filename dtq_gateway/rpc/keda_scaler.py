"""KEDA external scaler served by the gateway (``externalscaler.ExternalScaler``).

KEDA's own Redis Streams scaler watches one stream and one consumer group; a dtq
queue has ten band streams behind the gateway. A ScaledObject trigger of type
``external`` (polling) or ``external-push`` (StreamIsActive) with
``scalerAddress: <gateway host>:<port>`` scales a worker Deployment on dtq's own
figures. The trigger's metadata (``ScaledObjectRef.scalerMetadata``):

* ``queue`` or ``queues``: one queue, or several separated by commas (at most
  :data:`MAX_QUEUES`); the figures are summed (backlog age: the oldest).
* ``metric``: ``backlog`` (default: waiting tasks, not leased), ``backlog_age``
  (age of the oldest waiting task, seconds) or ``leased_plus_waiting`` (tasks
  waiting or leased).
* ``target``: the metric's value one replica should handle, a number > 0 and at most 1e15
  (default :data:`DEFAULT_TARGETS`).
* ``token`` (or ``tokenFromEnv``, which KEDA resolves from the scale target's
  environment): the bearer token when ``DTQ_AUTH_TOKENS`` is set, since KEDA sends
  no call metadata of its own. A ``scaler`` or ``admin`` role is needed
  (:mod:`dtq_gateway.rpc.auth`).

Other keys (``scalerAddress``, ``caCert``, ...) are KEDA's and ignored. Every figure
counts live work only: tasks whose expiry passed are expired by the scheduler
leader (``expire_waiting.lua``), not counted.

Cost: each IsActive / GetMetrics call (and each StreamIsActive re-check) reads the
named queues' bands in one pipeline (XLEN + XINFO GROUPS per band, then one XRANGE
and XREVRANGE COUNT 1 per band with undelivered entries), i.e. at most
``40 * MAX_QUEUES`` commands in two round trips, whatever the number of queues in
Redis. StreamIsActive re-checks when the events hub sees an event of one of its
queues (at most every :data:`STREAM_MIN_RECHECK_S`) and every
:data:`STREAM_RECHECK_S` otherwise; it never polls Redis per stream beyond that.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from dtq_gateway.errors import InvalidArgument
from dtq_gateway.events.events_hub import EventsHub
from dtq_gateway.rpc.grpc_errors import abort, mapped_errors
from dtq_gateway.store import admin
from dtq_gateway.store.client import Client
from dtq_proto.keda import externalscaler_pb2 as es
from dtq_proto.keda import externalscaler_pb2_grpc as es_grpc

log = logging.getLogger(__name__)

#: Most queues one ScaledObject trigger may name (bounds the cost of a call).
MAX_QUEUES = 16
#: Largest target per replica: KEDA's targetSize is an int64, and no queue holds more.
MAX_TARGET = 1e15
#: Metric → default target per replica (tasks, or seconds for backlog_age).
DEFAULT_TARGETS = {"backlog": 10.0, "backlog_age": 30.0, "leased_plus_waiting": 10.0}
#: StreamIsActive re-checks at least this often without events (s).
STREAM_RECHECK_S = 5.0
#: ... and at most this often however many events arrive (s).
STREAM_MIN_RECHECK_S = 0.1
SERVICE_NAME = es.DESCRIPTOR.services_by_name["ExternalScaler"].full_name



@dataclass(frozen=True, slots=True)
class Trigger:
    """A ScaledObject trigger's dtq metadata, validated.

    Attributes:
        queues: the queue names, in the order given, without repeats.
        metric: ``backlog``, ``backlog_age`` or ``leased_plus_waiting``.
        target: the metric's value per replica (> 0).
    """

    queues: tuple[str, ...]
    metric: str
    target: float

    @property
    def metric_name(self) -> str:
        """The metric's name in GetMetricSpec/GetMetrics: ``dtq-<metric>-<queues>``
        (KEDA prefixes it with ``s<trigger index>-``)."""
        return f"dtq-{self.metric.replace('_', '-')}-{'-'.join(self.queues)}"[:200]


def parse_trigger(metadata: Mapping[str, str]) -> Trigger:
    """Validate a trigger's ``scalerMetadata``.

    Raises:
        InvalidArgument: no queue, a bad queue name, more than MAX_QUEUES queues, an
            unknown metric, a target that is not a number > 0; ``field`` names the
            metadata key (``scalerMetadata.<key>``).
    """
    raw = metadata.get("queues") or metadata.get("queue") or ""
    key = "queues" if metadata.get("queues") else "queue"
    names = [q.strip() for q in raw.split(",") if q.strip()]
    if not names:
        raise InvalidArgument("scalerMetadata.queue: name the queue (queue: <name>, or "
                              "queues: <a>,<b>)", field="scalerMetadata.queue")
    if len(names) > MAX_QUEUES:
        raise InvalidArgument(f"scalerMetadata.{key}: at most {MAX_QUEUES} queues",
                              field=f"scalerMetadata.{key}")
    for name in names:
        admin.validate_queue(name, f"scalerMetadata.{key}")
    metric = metadata.get("metric") or "backlog"
    if metric not in DEFAULT_TARGETS:
        raise InvalidArgument(f"scalerMetadata.metric: {metric[:64]!r} is not one of "
                              f"{', '.join(DEFAULT_TARGETS)}", field="scalerMetadata.metric")
    target = DEFAULT_TARGETS[metric]
    if metadata.get("target"):
        try:
            target = float(metadata["target"])
        except ValueError:
            target = math.nan
        if not (math.isfinite(target) and 0 < target <= MAX_TARGET):
            raise InvalidArgument(f"scalerMetadata.target: must be a number > 0 and at most "
                                  f"{MAX_TARGET:.0e}", field="scalerMetadata.target")
    return Trigger(tuple(dict.fromkeys(names)), metric, target)


@dataclass(frozen=True, slots=True)
class Figures:
    """Live figures of a trigger's queues (summed; age: the oldest)."""

    waiting: int
    leased: int
    backlog_age_s: float

    def value(self, metric: str) -> float:
        """The named metric's value."""
        if metric == "backlog":
            return float(self.waiting)
        if metric == "backlog_age":
            return self.backlog_age_s
        return float(self.waiting + self.leased)

    @property
    def active(self) -> bool:
        """True while any task waits or runs (workers must not scale to zero)."""
        return self.waiting + self.leased > 0


async def read_figures(redis: Client, trigger: Trigger) -> Figures:
    """Read the trigger's queues' bands (two pipelined round trips, TIME aside).

    ``waiting`` = band entries not leased (depth - pending, as GetQueueStats' bands),
    ``leased`` = pending entries, ``backlog_age_s`` = age of the oldest undelivered
    entry (GetQueueStats' ``oldest_task_age_ms`` without its by-type scan).

    Raises:
        InvalidArgument: a queue that has neither band streams nor a registry entry
            (``field`` = ``scalerMetadata.queue``, reason UNKNOWN_QUEUE).
    """
    bands = await admin.band_infos_many(redis, list(trigger.queues))
    for queue, infos in bands.items():
        if not any(b.exists for b in infos) and not await admin.queue_known(redis, queue):
            raise InvalidArgument(f"scalerMetadata.queue: unknown queue {queue!r} (no task "
                                  "was ever enqueued to it)", field="scalerMetadata.queue",
                                  reason="UNKNOWN_QUEUE")
    now = await admin.redis_now_ms(redis)
    every = [b for infos in bands.values() for b in infos]
    pending = sum(b.pending for b in every)
    oldest = [b.oldest_undelivered_ms for b in every if b.oldest_undelivered_ms]
    age_ms = max(0, now - min(oldest)) if oldest else 0
    return Figures(waiting=max(0, sum(b.depth for b in every) - pending), leased=pending,
                   backlog_age_s=age_ms / 1000.0)


_rpc = mapped_errors


class KedaScaler(es_grpc.ExternalScalerServicer):
    """``externalscaler.ExternalScaler`` over the gateway's Redis (see module doc).

    Args:
        redis: the gateway's client.
        hub: the gateway's events hub (StreamIsActive wakes on its events).
    """

    def __init__(self, redis: Client, hub: EventsHub) -> None:
        self.redis = redis
        self.hub = hub

    @_rpc
    async def IsActive(self, request: es.ScaledObjectRef, context: Any) -> es.IsActiveResponse:
        """True while a task of the trigger's queues waits or is leased.

        Errors: INVALID_ARGUMENT for bad metadata or an unknown queue.
        """
        trigger = parse_trigger(request.scalerMetadata)
        return es.IsActiveResponse(result=(await read_figures(self.redis, trigger)).active)

    @_rpc
    async def GetMetricSpec(self, request: es.ScaledObjectRef, context: Any
                            ) -> es.GetMetricSpecResponse:
        """One metric spec: the trigger's metric name and its target per replica.

        Errors: INVALID_ARGUMENT for bad metadata (no Redis read).
        """
        trigger = parse_trigger(request.scalerMetadata)
        return es.GetMetricSpecResponse(metricSpecs=[es.MetricSpec(
            metricName=trigger.metric_name, targetSize=max(1, round(trigger.target)),
            targetSizeFloat=trigger.target)])

    @_rpc
    async def GetMetrics(self, request: es.GetMetricsRequest, context: Any
                         ) -> es.GetMetricsResponse:
        """The metric's current value (tasks, or seconds for backlog_age), named as
        the request names it (KEDA's prefixed name) or else as GetMetricSpec does.

        Errors: INVALID_ARGUMENT for bad metadata or an unknown queue.
        """
        trigger = parse_trigger(request.scaledObjectRef.scalerMetadata)
        value = (await read_figures(self.redis, trigger)).value(trigger.metric)
        return es.GetMetricsResponse(metricValues=[es.MetricValue(
            metricName=request.metricName or trigger.metric_name,
            metricValue=math.ceil(value), metricValueFloat=value)])

    async def StreamIsActive(self, request: es.ScaledObjectRef, context: Any
                             ) -> AsyncIterator[es.IsActiveResponse]:
        """The activity at once, then every change: re-checked on each event of the
        trigger's queues from the events hub (so the first enqueue is pushed within
        about STREAM_MIN_RECHECK_S plus one read) and every STREAM_RECHECK_S.

        Errors: INVALID_ARGUMENT for bad metadata or an unknown queue (at open).
        """
        try:
            trigger = parse_trigger(request.scalerMetadata)
            last = (await read_figures(self.redis, trigger)).active
        except Exception as exc:  # noqa: BLE001 - mapped to a status by abort()
            await abort(context, exc)
        yield es.IsActiveResponse(result=last)
        wake = asyncio.Event()
        wanted = [q.encode() for q in trigger.queues]

        def on_event(event: dict) -> None:
            if event.get("queue") in trigger.queues:
                wake.set()

        self.hub.add_listener(on_event, lambda raw: any(q in raw for q in wanted))
        try:
            while True:
                try:
                    await asyncio.wait_for(wake.wait(), STREAM_RECHECK_S)
                except TimeoutError:
                    pass
                wake.clear()
                try:
                    active = (await read_figures(self.redis, trigger)).active
                except Exception as exc:  # noqa: BLE001 - Redis outage: keep the stream
                    log.warning("scaler: re-check failed: %r", exc)
                    continue
                if active != last:
                    last = active
                    yield es.IsActiveResponse(result=active)
                await asyncio.sleep(STREAM_MIN_RECHECK_S)
        finally:
            self.hub.remove_listener(on_event)


def add_to_server(scaler: KedaScaler, server: grpc.aio.Server) -> None:
    """Register the scaler on the gateway's gRPC server."""
    es_grpc.add_ExternalScalerServicer_to_server(scaler, server)
