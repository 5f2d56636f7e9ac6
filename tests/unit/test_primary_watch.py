"""Sentinel mode's primary following (store.primary_watch), against fake sentinels: the
newest configuration epoch wins, a failover in progress refuses connections and drops
the pooled ones, a switch drops every connection to the old primary."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError

from dtq_gateway.store.primary_watch import FollowingSentinelPool, PrimaryWatch, read_primary


def _state(port: int, epoch: int, flags: str = "master") -> dict[str, Any]:
    names = set(flags.split(","))
    return {"ip": "10.0.0.1", "port": port, "config-epoch": epoch, "flags": flags,
            "is_master": "master" in names, "is_sdown": "s_down" in names,
            "is_odown": "o_down" in names, "num-other-sentinels": 2}


class FakeSentinel:
    """One sentinel answering SENTINEL MASTER with ``state`` (or raising it)."""

    def __init__(self, state: Any) -> None:
        self.state = state

    async def sentinel_master(self, service: str) -> dict[str, Any]:
        if isinstance(self.state, Exception):
            raise self.state
        return self.state


class FakeConnection:
    def __init__(self) -> None:
        self.disconnects = 0
        self.marked = False

    async def disconnect(self) -> None:
        self.disconnects += 1

    def mark_for_reconnect(self) -> None:
        self.marked = True


def _manager(*states: Any) -> Sentinel:
    manager = Sentinel([])
    manager.sentinels = [FakeSentinel(s) for s in states]
    return manager


async def test_the_newest_epoch_wins_over_a_lagging_or_unreachable_sentinel() -> None:
    manager = _manager(_state(6380, 1), RedisConnectionError("down"), _state(6381, 2))
    assert await read_primary(manager, "dtq") == (("10.0.0.1", 6381), False)
    manager.sentinels[0].state = _state(6380, 1, "master,failover_in_progress")
    assert await read_primary(manager, "dtq") == (("10.0.0.1", 6381), True)
    with pytest.raises(MasterNotFoundError):
        await read_primary(_manager(RedisConnectionError("down")), "dtq")


async def test_a_failover_fences_the_pool_and_a_switch_drops_every_connection() -> None:
    manager = _manager(_state(6380, 1), _state(6380, 1))
    pool = FollowingSentinelPool("dtq", manager)
    assert await pool.get_master_address() == ("10.0.0.1", 6380)
    idle, busy = FakeConnection(), FakeConnection()
    pool._available_connections.append(idle)
    pool._in_use_connections.add(busy)
    # a sentinel starts a failover: no connection, every pooled one dropped
    manager.sentinels[0].state = _state(6380, 1, "master,failover_in_progress")
    watch = PrimaryWatch.of(type("Client", (), {"connection_pool": pool})())
    assert watch is not None
    with pytest.raises(MasterNotFoundError):
        await watch.check_once()
    assert pool.fenced and idle.disconnects == busy.disconnects == 1 and busy.marked
    # the sentinels name the promoted replica: connections go there
    manager.sentinels[0].state = _state(6381, 2)
    assert await pool.get_master_address() == ("10.0.0.1", 6381)
    assert not pool.fenced and pool.master_address == ("10.0.0.1", 6381)
    assert idle.disconnects == 2  # dropped again on the switch
    assert PrimaryWatch.of(object()) is None  # other modes have no watch


async def test_one_watch_switches_every_client_of_the_gateway() -> None:
    """The calls' client and the health probe's each have a pool; one watch moves both."""
    manager = _manager(_state(6380, 1), _state(6380, 1))
    calls, probe = FollowingSentinelPool("dtq", manager), FollowingSentinelPool("dtq", manager)
    for pool in (calls, probe):
        assert await pool.get_master_address() == ("10.0.0.1", 6380)
    watch = PrimaryWatch.of(*(type("Client", (), {"connection_pool": p})()
                              for p in (calls, probe, calls)))
    assert watch is not None and len(watch.pools) == 2
    manager.sentinels[0].state = _state(6381, 2)
    await watch.check_once()
    assert calls.master_address == probe.master_address == ("10.0.0.1", 6381)
