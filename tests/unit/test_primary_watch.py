"""Sentinel mode's primary following (store.primary_watch), against fake sentinels: the
newest configuration epoch wins, a failover in progress refuses connections and drops
the pooled ones, a switch drops every connection to the old primary."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import ConnectionError as RedisConnectionError

from dtq_gateway.store.primary_watch import (
    FollowingSentinelPool,
    PrimaryWatch,
    event_service,
    read_primary,
)


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
    # the failover's leader still flags the old primary's record while it reconfigures
    # the replicas: that failover is over for whoever writes to the promoted one
    manager.sentinels[0].state = _state(6380, 1, "master,failover_in_progress")
    assert await read_primary(manager, "dtq") == (("10.0.0.1", 6381), False)
    manager.sentinels[2].state = _state(6381, 2, "master,failover_in_progress")
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
    await watch.check_once()
    assert pool.fenced and idle.disconnects == busy.disconnects == 1 and busy.marked
    with pytest.raises(MasterNotFoundError):  # no connection while fenced
        await pool.get_master_address()
    # the sentinels name the promoted replica: connections go there
    manager.sentinels[0].state = _state(6381, 2)
    await pool.refresh()
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


class HungSentinel:
    """A sentinel that accepted the connection and never answers (SIGSTOPped)."""

    async def sentinel_master(self, service: str) -> dict[str, Any]:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")


async def test_a_hung_sentinel_does_not_hold_up_the_read() -> None:
    manager = _manager(_state(6381, 2), _state(6381, 2))
    manager.sentinels.append(HungSentinel())
    started = asyncio.get_running_loop().time()
    assert await read_primary(manager, "dtq", wait_s=0.2) == (("10.0.0.1", 6381), False)
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_a_failover_event_fences_at_once_and_the_switch_ends_the_fence() -> None:
    """+try-failover from any sentinel fences every pool before the poll reads the
    sentinels; once they name another primary the fence ends, although the leader
    still flags its failover in progress (it reconfigures the replicas for seconds)."""
    manager = _manager(_state(6380, 1), _state(6380, 1))
    pool = FollowingSentinelPool("dtq", manager)
    await pool.refresh()
    conn = FakeConnection()
    pool._available_connections.append(conn)
    watch = PrimaryWatch([pool])
    await watch.on_event(b"+try-failover", b"master other 10.0.0.9 6390")  # not ours
    assert not pool.fenced
    await watch.on_event(b"+try-failover", b"master dtq 10.0.0.1 6380")
    assert pool.fenced and conn.disconnects == 1
    manager.sentinels.append(HungSentinel())  # the sentinel running it may be slow
    await pool.refresh()  # no answer says a failover runs, but one is missing: fenced
    assert pool.fenced
    manager.sentinels[0].state = _state(6381, 2, "master,failover_in_progress")
    await pool.refresh()  # switched: writes go to the promoted replica
    assert not pool.fenced and pool.master_address == ("10.0.0.1", 6381)
    # an event about a failover that then aborts: every sentinel answers, none runs one
    manager.sentinels[0].state = _state(6381, 2)
    manager.sentinels.pop()
    await watch.on_event(b"+try-failover", b"master dtq 10.0.0.1 6381")
    assert pool.fenced
    await pool.refresh()
    assert not pool.fenced


def test_event_service_reads_both_event_forms() -> None:
    assert event_service("master dtq 127.0.0.1 6379") == "dtq"
    assert event_service("slave 127.0.0.1:6380 127.0.0.1 6380 @ dtq 127.0.0.1 6379") == "dtq"
    assert event_service("") == ""


async def test_a_pool_never_follows_an_older_config_epoch() -> None:
    """When only a lagging sentinel answers in time, the pool keeps the newer primary
    it knows instead of switching back to the old one."""
    manager = _manager(_state(6381, 2))
    pool = FollowingSentinelPool("dtq", manager)
    await pool.refresh()
    manager.sentinels[0].state = _state(6380, 1)  # a sentinel that missed the switch
    await pool.refresh()
    assert pool.master_address == ("10.0.0.1", 6381) and not pool.fenced


async def test_the_failover_leader_still_naming_the_old_primary_loses_the_tie() -> None:
    """After the promotion the failover's leader reports the new epoch but still the old
    primary, flagged, while the others already name the promoted one with that epoch:
    the promoted one wins whatever order the answers come in (a tie went either way and
    the gateway flipped between the two every 0.5 s)."""
    leader, other = _state(6380, 2, "master,failover_in_progress"), _state(6381, 2)
    for order in ((leader, other), (other, leader)):
        assert await read_primary(_manager(*order), "dtq") == (("10.0.0.1", 6381), False)


async def test_the_watch_runs_as_one_task_that_ends_with_any_part_and_can_start_again() -> None:
    """The gateway's supervisor watches one task: a listener that fails (here a sentinel
    without pub/sub) ends the poll too, and start() after that starts a new task."""
    manager = _manager(_state(6380, 1))
    watch = PrimaryWatch([FollowingSentinelPool("dtq", manager)], interval_s=0.05)
    first = watch.start()
    await asyncio.wait({first}, timeout=5)
    assert first.done() and isinstance(first.exception(), AttributeError)
    assert not [t for t in asyncio.all_tasks()
                if t.get_name() in ("dtq-primary-poll", "dtq-sentinel-events") and not t.done()]
    second = watch.start()
    assert second is not first
    await watch.stop()
    assert second.done()
