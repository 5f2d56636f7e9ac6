"""lua/_concurrency.lua builds the per-key concurrency keys from the queue name: they
must be the names store/keys.py gives (the Admin side reads and writes those), and the
band stream a parked task goes back to must be keys.stream's."""

from __future__ import annotations

import redis.asyncio as aioredis

from dtq_gateway.store import keys
from dtq_gateway.store.scripts import LUA_DIR

BODY = """
local p = conc_prefix(ARGV[3])
return {p .. 'limit', p .. 'active', p .. 'waiting', p .. 'parked:' .. ARGV[4],
        'dtq:stream:{' .. ARGV[3] .. '}:p' .. ARGV[5]}
"""


async def test_lua_names_match_keys_py(redis_url) -> None:
    source = "\n".join((LUA_DIR / f"{name}.lua").read_text()
                       for name in ("_lib", "_finished", "_concurrency")) + BODY
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        names = await r.eval(source, 0, "events", "0" * 24, "orders.eu-1", "tenant:7", "5")
    finally:
        await r.aclose()
    assert names == [keys.concurrency_limit("orders.eu-1"), keys.concurrency_active("orders.eu-1"),
                     keys.concurrency_waiting("orders.eu-1"),
                     keys.concurrency_parked("orders.eu-1", "tenant:7"),
                     keys.stream("orders.eu-1", 5)]
    assert len({keys.key_slot(n) for n in names}) == 1  # one hash slot: the queue's
