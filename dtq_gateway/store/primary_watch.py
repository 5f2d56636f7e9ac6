"""Sentinel mode: write only to the current primary, following a switch at once.

redis-py's :class:`SentinelConnectionPool` asks the sentinels for the primary only when
it opens a connection, and drops pooled connections to a demoted node only when one of
them gets READONLY, which the old primary answers only once Sentinel has turned it
into a replica (about 10 s after a requested failover). Until then it accepts writes
that the demotion discards. Two pieces close that window:

- :class:`FollowingSentinelPool` asks *every* sentinel and trusts the answer with the
  highest ``config-epoch`` (a sentinel that has not heard of the switch yet answers an
  older epoch). While any sentinel reports a failover of the service in progress
  (from ``+try-failover``, before the replica is promoted, until ``+switch-master`` or
  an abort) it makes no connection and drops every pooled one: during a failover the
  old primary still takes writes that its replicas may no longer carry to the
  promoted one, so they are refused (UNAVAILABLE) rather than answered OK and lost.
  When the primary's address changes it drops every connection to the old one too.
  Dropping includes in-use connections: a call in flight fails (UNAVAILABLE, outcome
  unknown, the caller resends) instead of being answered OK and lost.
- :class:`PrimaryWatch`, a duty of the gateway, re-reads the sentinels when one of them
  publishes a failover event and every ``interval_s`` besides (a sentinel restarted or
  unreachable misses events), so the gateway reacts without waiting for a connection.

A write that still reaches a demoted node gets READONLY, which redis-py's
SentinelManagedConnection turns into a ConnectionError: UNAVAILABLE to the caller
(``store/errors.py``), never an OK.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from redis.asyncio.sentinel import MasterNotFoundError, SentinelConnectionPool

from dtq_gateway.store.errors import OUTAGE_ERRORS

log = logging.getLogger(__name__)

#: Sentinel events that wake the watch: a failover's steps (``+try-failover`` first,
#: before the replica is promoted), its end or abort, and ``+switch-master``.
EVENT_PATTERNS = ("*failover*", "+switch-master")
#: The SENTINEL MASTER flag of a master whose failover this sentinel is running.
FAILOVER_FLAG = "failover_in_progress"


#: How long one read of the sentinels waits for their answers (s): a hung sentinel
#: (SIGSTOPped, a dead link) must not hold the gateway up; those that answered in time
#: decide.
SENTINEL_READ_S = 1.0
#: How long a read of the sentinels serves new connections before another is made (s).
SHARED_READ_S = 0.5


async def read_primary(sentinel: Any, service: str,
                       wait_s: float = SENTINEL_READ_S) -> tuple[tuple[str, int], bool]:
    """The primary's (host, port) by the sentinel answer with the highest config epoch,
    and whether any sentinel has a failover of the service in progress
    (:func:`read_sentinels` without its third value).

    Raises:
        MasterNotFoundError: as :func:`read_sentinels`.
    """
    address, failing_over, _, _ = await read_sentinels(sentinel, service, wait_s)
    return address, failing_over


async def read_sentinels(sentinel: Any, service: str, wait_s: float = SENTINEL_READ_S
                         ) -> tuple[tuple[str, int], bool, bool, int]:
    """(primary address, a failover of it in progress, every sentinel answered, the
    answer's config epoch).

    Every sentinel is asked at once; answers that have not come within ``wait_s``
    seconds are not waited for (the third value is then False). A sentinel that
    refused the connection counts as answered: a sentinel that is down runs no
    failover. A failover flag counts only on an answer that names the chosen primary:
    the sentinel leading a failover keeps flagging the old primary's record until it
    has reconfigured every replica, seconds after the others name the promoted one.

    Raises:
        MasterNotFoundError (a redis ConnectionError): no sentinel answered in time, or
            the newest answer says the primary is down (failover not done yet).
    """
    asks = [asyncio.ensure_future(s.sentinel_master(service)) for s in sentinel.sentinels]
    done, pending = await asyncio.wait(asks, timeout=wait_s)
    for ask in pending:
        ask.cancel()
    replies = [a.result() for a in done if not a.cancelled() and a.exception() is None]
    states = [r for r in replies if isinstance(r, dict) and "ip" in r]
    if not states:
        raise MasterNotFoundError(f"no sentinel named a primary for {service!r}")
    # newest config epoch first; on a tie, an answer without a failover in progress:
    # once the replica is promoted the failover's leader already reports the new epoch
    # but still names the old primary (its record switches at +switch-master, after
    # it has reconfigured the replicas), while the other sentinels name the new one
    state = max(states, key=lambda st: (int(st.get("config-epoch", 0)), not _flagged(st)))
    if not sentinel.check_master_state(state, service):
        raise MasterNotFoundError(f"the primary of {service!r} is down (failover pending)")
    address = (state["ip"], int(state["port"]))
    failing_over = any(_flagged(st) and (st["ip"], int(st["port"])) == address
                       for st in states)
    return address, failing_over, not pending, int(state.get("config-epoch", 0))


def _flagged(state: dict[str, Any]) -> bool:
    """True when a SENTINEL MASTER answer flags a failover in progress."""
    return FAILOVER_FLAG in str(state.get("flags", "")).split(",")


def event_service(message: str) -> str:
    """The service a sentinel event is about: ``master <name> <ip> <port>`` or
    ``<kind> <name> <ip> <port> @ <service> <ip> <port>`` ("" when neither)."""
    words = str(message).split()
    if "@" in words and words.index("@") + 1 < len(words):
        return words[words.index("@") + 1]
    return words[1] if len(words) > 1 and words[0] == "master" else ""


#: Sentinel events that start a failover's writes fence at once (before the poll reads
#: the sentinels): the attempt and every step up to the promotion.
FENCE_EVENTS = ("+try-failover", "+elected-leader", "+failover-state-", "+selected-slave",
                "+promoted-slave")


class FollowingSentinelPool(SentinelConnectionPool):
    """A SentinelConnectionPool that follows the newest primary and, on a switch or
    while a failover is in progress, drops every connection to the old one (module
    docstring)."""

    #: True while a failover is under way: no connection is made
    fenced = False
    #: the primary when the fence began: once the sentinels name another one, the
    #: failover has switched and writes go there (the leader's failover_in_progress
    #: flag lasts until it has reconfigured every replica, seconds later)
    fenced_from: tuple[str, int] | None = None
    #: the newest config epoch the sentinels have named (never followed backwards)
    epoch = 0
    #: (address, failover in progress, monotonic s) of the last read of the sentinels
    _last_read: tuple[tuple[str, int], bool, float] | None = None

    async def get_master_address(self) -> tuple[str, int]:
        """The primary to connect to now (the watch's last read when under
        SHARED_READ_S old, so a new connection costs no sentinel round trip).

        Raises:
            MasterNotFoundError: no sentinel answers, the primary is down, or a failover
                is in progress (a ConnectionError: UNAVAILABLE to a caller).
        """
        last = self._last_read
        if last is not None and time.monotonic() - last[2] < SHARED_READ_S:
            address = last[0]
        else:
            address = (await self.refresh())[0]
        if self.fenced:
            raise MasterNotFoundError(f"a failover of {self.service_name!r} is in progress")
        return address

    async def refresh(self) -> tuple[tuple[str, int], bool]:
        """Read the sentinels now and apply what they say (fence, switch, unfence).

        Raises:
            MasterNotFoundError: as :func:`read_primary`.
        """
        return await self.apply(await read_sentinels(self.sentinel_manager,
                                                     self.service_name))

    async def apply(self, read: tuple[tuple[str, int], bool, bool, int]
                    ) -> tuple[tuple[str, int], bool]:
        """Act on one :func:`read_sentinels` answer (fence, switch, unfence); returns
        (the primary to use, a failover in progress)."""
        address, failing_over, complete, epoch = read
        if epoch < self.epoch and self.master_address is not None:
            # only lagging sentinels answered in time: never back to an older config
            address, failing_over = self.master_address, False
        self.epoch = max(self.epoch, epoch)
        self._last_read = (address, failing_over, time.monotonic())
        if not self.is_master:
            return address, failing_over
        switched = self.fenced_from is not None and address != self.fenced_from
        # a fence ends once the sentinels name another primary, or once every sentinel
        # answered and none runs a failover (aborted, or an event about an old one): a
        # sentinel that did not answer may be the one running it
        in_failover = not switched and (failing_over or (self.fenced and not complete))
        if in_failover and not self.fenced:
            await self.fence("a sentinel reports a failover in progress")
        elif self.fenced and not in_failover:
            self.fenced, self.fenced_from = False, None
            log.warning("redis failover over", extra={"primary": f"{address[0]}:{address[1]}"})
        if self.master_address != address:
            old, self.master_address = self.master_address, address
            if old is not None:
                log.warning("redis primary switched; dropping connections to the old one",
                            extra={"old": f"{old[0]}:{old[1]}",
                                   "new": f"{address[0]}:{address[1]}"})
                await self._drop_all()
        return address, failing_over

    async def fence(self, why: str) -> None:
        """Refuse connections and drop every pooled one until the failover is over (a
        sentinel event or a read of the sentinels saw it start)."""
        if self.fenced or not self.is_master:
            return
        self.fenced = True
        self.fenced_from = self.master_address
        log.warning("redis failover in progress; no writes until the sentinels name "
                    "the new primary", extra={"why": why})
        await self._drop_all()

    async def _drop_all(self) -> None:
        """Disconnect every connection, in-use ones too (their calls fail: UNAVAILABLE,
        outcome unknown, the caller resends), and have in-use ones reconnect."""
        await self.update_active_connections_for_reconnect()
        await self.disconnect(inuse_connections=True)


class PrimaryWatch:
    """Re-reads the Sentinel service's primary on ``+switch-master`` and every
    ``interval_s`` (s, > 0), switching each pool over at once. ``start()``/``stop()``.

    Args:
        pools: the FollowingSentinelPools of the gateway's clients (the calls' client
            and the health probe's), all of one Sentinel service.
        interval_s: period of the fallback poll (s).
    """

    def __init__(self, pools: list[FollowingSentinelPool], interval_s: float = 0.5) -> None:
        self.pools = pools
        self.interval_s = interval_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(cls, *clients: Any, interval_s: float = 0.5) -> PrimaryWatch | None:
        """The watch over the sentinel-mode clients among ``clients``; None when none
        is (standalone and cluster modes)."""
        pools = [pool for pool in (getattr(c, "connection_pool", None) for c in clients)
                 if isinstance(pool, FollowingSentinelPool)]
        return cls(list({id(p): p for p in pools}.values()), interval_s) if pools else None

    def start(self) -> asyncio.Task[None]:
        """Start polling and listening to every sentinel (again, after the task
        ended); returns the one task that runs them all (:meth:`run`)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="dtq-primary-watch")
        return self._task

    async def run(self) -> None:
        """Poll and listen to every sentinel until cancelled; one of them ending ends
        them all (the gateway's supervisor then restarts the watch)."""
        tasks = [asyncio.create_task(self._poll(), name="dtq-primary-poll")]
        tasks += [asyncio.create_task(self._listen(s), name="dtq-sentinel-events")
                  for s in self.pools[0].sentinel_manager.sentinels]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def stop(self) -> None:
        """Cancel the poll and the subscriptions and wait for them."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})

    async def check_once(self) -> None:
        """Read the primary now; a changed address switches each pool over.

        Raises:
            MasterNotFoundError: as :func:`read_sentinels` (no pool is changed).
        """
        first = self.pools[0]
        read = await read_sentinels(first.sentinel_manager, first.service_name)
        for pool in self.pools:  # one read of the sentinels serves every client
            await pool.apply(read)

    async def _poll(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            try:
                await self.check_once()
            except OUTAGE_ERRORS:  # no sentinel answers, or the primary is down
                log.debug("primary not read from the sentinels", exc_info=True)
            except Exception:
                log.exception("reading the primary from the sentinels failed")

    async def on_event(self, channel: Any, data: Any) -> None:
        """One sentinel event: a failover of our service starting fences every pool at
        once (no write reaches the old primary from here on, whatever the other
        sentinels answer); any event wakes the poll."""
        name = channel.decode() if isinstance(channel, bytes) else str(channel or "")
        text = data.decode() if isinstance(data, bytes) else str(data or "")
        service = self.pools[0].service_name
        if name.startswith(FENCE_EVENTS) and event_service(text) == service:
            for pool in self.pools:
                await pool.fence(f"sentinel event {name}")
        self._wake.set()

    async def _listen(self, sentinel: Any) -> None:
        """Wake the poll on each failover event of one sentinel (resubscribing after a
        lost connection, the poll covering the gap)."""
        while True:
            pubsub = sentinel.pubsub()
            try:
                await pubsub.psubscribe(*EVENT_PATTERNS)
                async for message in pubsub.listen():
                    if message.get("type") == "pmessage":
                        await self.on_event(message.get("channel"), message.get("data"))
            except OUTAGE_ERRORS:
                log.debug("sentinel subscription lost", exc_info=True)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()
            await asyncio.sleep(self.interval_s)
