"""The per-key concurrency RPCs of ``dtq.v1.Admin`` (store/concurrency.py), mixed into
:class:`dtq_gateway.rpc.admin_servicer.AdminServicer`, which provides ``redis`` and
``_audit``."""

from __future__ import annotations

from typing import Any

from dtq_gateway.rpc.grpc_errors import mapped_errors
from dtq_gateway.store import concurrency
from dtq_proto import dtq_pb2 as pb


class ConcurrencyRpcs:
    """SetConcurrencyLimit, GetConcurrency, DeleteConcurrencyLimit and
    ListConcurrencyLimits (docs/fairness.md)."""

    redis: Any

    async def _audit(self, context: Any, action: str, target: str, detail: str = "") -> str:
        raise NotImplementedError  # AdminServicer's

    @mapped_errors
    async def SetConcurrencyLimit(self, request: pb.SetConcurrencyLimitRequest, context: Any
                                  ) -> pb.SetConcurrencyLimitResponse:
        """Set or change a queue's per-key limit (audited as set_concurrency_limit).

        Raises:
            INVALID_ARGUMENT naming ``queue`` or ``max_active_per_key`` (1..1,000,000).
        """
        queue, limit = concurrency.validate(request.queue, request.max_active_per_key)
        created = await concurrency.set_limit(self.redis, queue, limit)
        await self._audit(context, "set_concurrency_limit", queue,
                          f"max_active_per_key={limit}")
        return pb.SetConcurrencyLimitResponse(created=created)

    @mapped_errors
    async def GetConcurrency(self, request: pb.GetConcurrencyRequest, context: Any
                             ) -> pb.GetConcurrencyResponse:
        """A queue's per-key limit (0 = none) and its busiest keys (active + waiting)."""
        c = await concurrency.get(self.redis, request.queue, request.max_keys)
        return pb.GetConcurrencyResponse(
            queue=c.queue, max_active_per_key=c.max_active_per_key, key_count=c.key_count,
            active=c.active, waiting=c.waiting,
            keys=[pb.ConcurrencyKeyStats(key=k.key, active=k.active, waiting=k.waiting)
                  for k in c.keys])

    @mapped_errors
    async def DeleteConcurrencyLimit(self, request: pb.DeleteConcurrencyLimitRequest,
                                     context: Any) -> pb.DeleteConcurrencyLimitResponse:
        """Remove a queue's per-key limit; its parked tasks go back to their bands
        (audited as delete_concurrency_limit)."""
        deleted = await concurrency.delete_limit(self.redis, request.queue)
        await self._audit(context, "delete_concurrency_limit", request.queue,
                          "" if deleted else "absent")
        return pb.DeleteConcurrencyLimitResponse(deleted=deleted)

    @mapped_errors
    async def ListConcurrencyLimits(self, request: pb.ListConcurrencyLimitsRequest,
                                    context: Any) -> pb.ListConcurrencyLimitsResponse:
        """Every queue's per-key limit, sorted by queue."""
        return pb.ListConcurrencyLimitsResponse(limits=[
            pb.ConcurrencyLimit(queue=q, max_active_per_key=n)
            for q, n in await concurrency.list_limits(self.redis)])
