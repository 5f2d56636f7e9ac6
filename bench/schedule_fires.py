"""How many schedule fires per second one gateway sustains: ``python -m bench.schedule_fires``.

Starts a private redis-server and one in-process gateway (the scheduler leader, its
firer ticking every 0.5 s), stores N one-second interval schedules, then counts the
fires over a window of D seconds (``fires_total`` of every schedule, read before and
after) and prints fires per second next to what falls due (N per second), the
fewest and median fires per schedule, and the late and missed fires counted by the
firer (docs/schedules.md, "How fast fires are enqueued").

    .venv/bin/python -m bench.schedule_fires --schedules 2000 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from bench.common import REPO, private_redis


async def _fires(redis, names: list[str]) -> list[int]:
    from dtq_gateway.store import schedules

    return [schedules.info_of(f).fires_total for f in await schedules.load_many(redis, names)]


async def run(n: int, seconds: float) -> dict:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from prometheus_client import REGISTRY

    from dtq_gateway.server import Gateway
    from dtq_gateway.store import schedules
    from dtq_proto import dtq_pb2 as pb
    from tests.conftest import gateway_settings

    server = private_redis()
    gw = Gateway(gateway_settings(server.url, scheduler_interval_ms=500,
                                  max_schedules=max(n, 10000)), server.url)
    try:
        await gw.start()
        names = [f"bench-{i:06d}" for i in range(n)]
        for name in names:
            await schedules.create(gw.redis, gw.settings, pb.Schedule(
                name=name, interval_ms=1000, task=pb.EnqueueRequest(
                    queue=f"sched{hash(name) % 8}", task_type="tick", payload=b"{}")), False)
        await asyncio.sleep(2)  # every schedule has fired at least once: steady state

        def counter(name: str) -> float:
            if name.endswith("missed_total"):  # summed over the missed-fire policies
                return sum(REGISTRY.get_sample_value(name, {"policy": p}) or 0.0
                           for p in ("skip", "latest", "all"))
            return REGISTRY.get_sample_value(name) or 0.0

        late0, missed0 = counter("dtq_schedule_fires_late_total"), counter(
            "dtq_schedule_fires_missed_total")
        before, t0 = await _fires(gw.redis, names), time.monotonic()
        await asyncio.sleep(seconds)
        after, t1 = await _fires(gw.redis, names), time.monotonic()
        per = [b - a for a, b in zip(before, after)]
        window = t1 - t0
        return {
            "schedules": n, "window_s": round(window, 2), "fires": sum(per),
            "fires_per_s": round(sum(per) / window, 1), "due_per_s": n,
            "fires_per_schedule_min": min(per),
            "fires_per_schedule_median": statistics.median(per),
            "late": int(counter("dtq_schedule_fires_late_total") - late0),
            "missed": int(counter("dtq_schedule_fires_missed_total") - missed0)}
    finally:
        await gw.stop()
        server.cleanup()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schedules", type=int, default=2000)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args.schedules, args.seconds)), indent=2))


if __name__ == "__main__":
    main()
