"""Loading and calling the Lua scripts in ``dtq_gateway/store/lua``.

Every script file gets ``_lib.lua`` prepended (shared helpers: Client TIME clock,
event publishing, attempt records). Scripts are called with EVALSHA; a NOSCRIPT
reply (after a Redis restart or SCRIPT FLUSH) loads the script and repeats the
call, which is safe because a NOSCRIPT call executed nothing. Pipelined calls
reuse that rule item by item, so a batch stays one round trip in the common case.

Convention: ARGV[1] is the events channel and ARGV[2] a fresh event-id prefix;
:meth:`Script.argv` prepends both. The script body runs as a function whose reply is
returned after ``flush_events()`` (``_lib.lua``) published the call's events as one
message, so a body may ``return`` anywhere.

The way out of a full Redis: scripts built with ``allow_oom=True`` (leasing, Ack, Fail,
heartbeats, cancel, reclaiming, resuming, purging and deleting: what drains a full
Redis) start with the Redis 7 shebang ``#!lua flags=allow-oom,allow-cross-slot-keys``,
so they run and write while ``used_memory`` is at ``maxmemory`` (noeviction refuses
every other write). ``allow-cross-slot-keys`` keeps what a script without a shebang may
do in a cluster (touch keys of several slots of one node). Redis 6.2 does not know the
shebang (``Error compiling script``): the first such refusal switches this process to
the plain sources for good (one WARNING), and on 6.2 a full Redis refuses those scripts'
writes like any other (docs/operations.md, "Redis settings").
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from dtq_gateway.store import keys
from dtq_gateway.store.client import Client, is_cluster
from dtq_gateway.store.durability import ReplicaWait
from dtq_gateway.store.errors import ReplicasNotAcked

LUA_DIR = Path(__file__).parent / "lua"

log = logging.getLogger(__name__)

#: First line of the scripts that must run while Redis is full (Redis >= 7.0).
OOM_SHEBANG = "#!lua flags=allow-oom,allow-cross-slot-keys\n"
#: Set once a server refused a shebang (Redis < 7.0): plain sources from then on.
_shebang_refused = False


def flags_supported() -> bool:
    """False once Redis refused a script shebang (Redis 6.2): the ``allow_oom`` scripts
    then run without flags, and a full Redis refuses their writes."""
    return not _shebang_refused


def _is_shebang_refusal(exc: ResponseError) -> bool:
    """Redis 6.2's answer to a script whose first line is ``#!lua ...``."""
    text = str(exc)
    return "Error compiling script" in text and "'#'" in text


def note_no_script_flags() -> None:
    """Use the plain sources from now on: the server is older than Redis 7.0 (read by
    the health probe, :func:`dtq_gateway.store.health.takes_script_flags`)."""
    _note_shebang_refused()


def _note_shebang_refused() -> None:
    global _shebang_refused
    if not _shebang_refused:
        _shebang_refused = True
        log.warning("redis does not take script flags (Redis < 7.0): while its memory is "
                    "full, leasing, Ack and Fail are refused too; use Redis 7.0 or newer")


#: First 8 hex characters of the event ids of calls whose wake-up this process's
#: lease dispatcher already got directly (enqueue, ack/fail): it skips those events
#: when they come back over pub/sub. Every other call uses OTHER_EVENT_ID_PREFIX.
EVENT_ID_PREFIX = os.urandom(4).hex()
OTHER_EVENT_ID_PREFIX = os.urandom(4).hex()
_calls = itertools.count()


def event_id_prefix(process_prefix: str = OTHER_EVENT_ID_PREFIX) -> str:
    """A fresh 24-hex-character event-id prefix: process prefix + call counter."""
    return f"{process_prefix}{next(_calls) & 0xFFFFFFFFFFFFFFFF:016x}"


@cache
def _lib() -> str:
    return (LUA_DIR / "_lib.lua").read_text()


class Script:
    """One Lua script: source, SHA1, and EVALSHA-with-fallback calls.

    Args:
        name: the file ``lua/<name>.lua``.
        helpers: more helper files (names without ``.lua``) placed between ``_lib.lua``
            and the body, e.g. ``("_audit",)``.
        allow_oom: the script is on the way out of a full Redis: on Redis >= 7.0 it is
            sent with :data:`OOM_SHEBANG` and may write at ``maxmemory``. Only for
            scripts that free memory or move it (a few hundred bytes at most per call).
    """

    #: (source, sha) with :data:`OOM_SHEBANG`, for ``allow_oom`` scripts
    flagged: tuple[str, str] | None = None

    def __init__(self, name: str, helpers: Sequence[str] = (),
                 allow_oom: bool = False) -> None:
        self.name = name
        parts = [_lib()] + [(LUA_DIR / f"{h}.lua").read_text() for h in helpers]
        body = (LUA_DIR / f"{name}.lua").read_text()
        self.source = "\n".join(parts) + (
            "\nlocal dtq_reply = (function()\n" + body
            + "\nend)()\nflush_events()\nreturn dtq_reply\n")
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        if allow_oom:
            flagged = OOM_SHEBANG + self.source
            self.flagged = (flagged, hashlib.sha1(flagged.encode()).hexdigest())

    def current(self) -> tuple[str, str]:
        """(source, sha) to send: the flagged one unless Redis refused shebangs."""
        if self.flagged is not None and not _shebang_refused:
            return self.flagged
        return self.source, self.sha

    async def eval_source(self, client: Client, keys_: Sequence[str],
                          args: Sequence[Any]) -> Any:
        """EVAL of :meth:`current`'s source; a shebang refused by Redis 6.2 switches
        this process to plain sources (:func:`flags_supported`) and runs the plain one."""
        source, _ = self.current()
        try:
            return await client.eval(source, len(keys_), *keys_, *args)
        except ResponseError as exc:
            if source == self.source or not _is_shebang_refusal(exc):
                raise
            _note_shebang_refused()
        return await client.eval(self.source, len(keys_), *keys_, *args)

    @staticmethod
    def argv(*args: Any) -> list[Any]:
        """ARGV with the events channel and a fresh event-id prefix in front."""
        return [keys.EVENTS_CHANNEL, event_id_prefix(), *args]

    @staticmethod
    def argv_notified(*args: Any) -> list[Any]:
        """Like :meth:`argv`, for calls whose caller wakes the local dispatcher itself:
        their events carry EVENT_ID_PREFIX, which the dispatcher skips."""
        return [keys.EVENTS_CHANNEL, event_id_prefix(EVENT_ID_PREFIX), *args]

    async def __call__(self, client: Client, keys_: Sequence[str], args: Sequence[Any]) -> Any:
        """Run the script once (EVALSHA; NOSCRIPT → EVAL of the source, which also caches
        it on the node that owns the keys' slot, so this works on every cluster node)."""
        try:
            return await client.evalsha(self.current()[1], len(keys_), *keys_, *args)
        except NoScriptError:
            return await self.eval_source(client, keys_, args)

    def queue(self, pipe: ScriptPipeline, keys_: Sequence[str], args: Sequence[Any]) -> None:
        """Add one call to a :class:`ScriptPipeline`; run it with its ``execute``. Other
        commands may share the pipeline (their replies come back in place)."""
        pipe.add(self, keys_, args)


#: One script call of a pipeline: (script, KEYS, ARGV).
ScriptCall = tuple[Script, Sequence[str], Sequence[Any]]


class ScriptPipeline:
    """A non-transactional pipeline that remembers which :class:`Script` each call was.

    :func:`execute` needs that to re-run a call answered NOSCRIPT with its source, to
    route calls per cluster node and to add ``WAIT``. Plain commands (``xpending_range``,
    ``hset``, ...) go straight to the underlying redis-py pipeline; their replies come
    back in place.

    Args:
        client: the Redis or RedisCluster client the pipeline runs on.
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self.pipe = client.pipeline(transaction=False)
        #: pipeline position -> the script call at that position
        self.calls: dict[int, ScriptCall] = {}

    def __len__(self) -> int:
        return len(self.pipe)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pipe, name)

    def add(self, script: Script, keys_: Sequence[str], args: Sequence[Any]) -> None:
        """Queue one EVALSHA of ``script`` (see :meth:`Script.queue`)."""
        self.calls[len(self.pipe)] = (script, keys_, args)
        self.pipe.execute_command("EVALSHA", script.current()[1], len(keys_), *keys_, *args)

    def add_source(self, script: Script, keys_: Sequence[str], args: Sequence[Any]) -> None:
        """Queue one EVAL of ``script``'s source (the NOSCRIPT re-run)."""
        self.calls[len(self.pipe)] = (script, keys_, args)
        self.pipe.execute_command("EVAL", script.current()[0], len(keys_), *keys_, *args)

    async def execute(self, wait: ReplicaWait | None = None) -> list[Any]:
        """Run the pipeline: :func:`execute` on its client."""
        return await execute(self.client, self, wait)


async def execute(client: Client, pipe: ScriptPipeline,
                  wait: ReplicaWait | None = None) -> list[Any]:
    """Execute a :class:`ScriptPipeline` of :meth:`Script.queue` calls.

    Items answered NOSCRIPT (a Redis restart, SCRIPT FLUSH, a cluster node that never
    ran the script) are re-run with EVAL of the source, which caches the script on that
    node; a NOSCRIPT call executed nothing, so the re-run is safe. Other errors are
    returned in place (as exceptions) for the caller to map per item.

    With ``wait``, the pipeline ends with ``WAIT`` on each node its script calls went
    to (the same connection as their writes, no extra round trip) and every script call
    that succeeded on a node whose WAIT saw fewer than ``wait.replicas`` replicas is
    answered :class:`ReplicasNotAcked` in its place (see :func:`_apply_wait`).
    """
    calls = pipe.calls
    if is_cluster(client) and len(calls) == len(pipe) > 1:
        groups = _by_node(client, calls)
        if len(groups) > 1:
            return await _execute_per_node(client, calls, groups, wait)
    waits = _queue_waits(client, pipe, calls, wait)
    replies = await pipe.pipe.execute(raise_on_error=False)
    if waits and wait is not None:
        replies = _apply_wait(client, calls, waits, replies, wait)
    for i, r in enumerate(replies):
        if i in calls and (isinstance(r, NoScriptError) or (
                isinstance(r, ResponseError) and str(r).startswith("NOSCRIPT"))):
            script, keys_, args = calls[i]
            try:
                if wait is None:
                    replies[i] = await script.eval_source(client, keys_, args)
                    continue
                again = ScriptPipeline(client)
                again.add_source(script, keys_, args)
                replies[i] = (await execute(client, again, wait))[0]
            except ResponseError as exc:
                replies[i] = exc
    return replies


def _queue_waits(client: Any, pipe: ScriptPipeline, calls: dict[int, ScriptCall],
                 wait: ReplicaWait | None) -> dict[int, Any]:
    """Add ``WAIT`` to ``pipe`` once per node its script calls go to (one for a single
    server); returns {pipeline position of the WAIT: that node (None off a cluster)}."""
    if wait is None or not calls:
        return {}
    if not is_cluster(client):
        pos = len(pipe)
        pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
        return {pos: None}
    waits: dict[int, Any] = {}
    for node in {client.get_node_from_key(k[0]).name: client.get_node_from_key(k[0])
                 for _, k, _ in calls.values()}.values():
        waits[len(pipe)] = node
        pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms, target_nodes=node)
    return waits


def _apply_wait(client: Any, calls: dict[int, ScriptCall],
                waits: dict[int, Any], replies: list[Any], wait: ReplicaWait) -> list[Any]:
    """Strip the WAIT replies off ``replies`` and put :class:`ReplicasNotAcked` in place
    of each successful script call not confirmed by ``wait.replicas`` replicas.

    In a cluster a call counts as confirmed only if the node its WAIT went to still owns
    the call's slot afterwards: a call redirected (MOVED, a failover) ran on another
    connection, which that WAIT does not cover."""
    got = {pos: (r if isinstance(r, int) else -1) for pos, r in
           ((p, replies[p]) for p in waits)}
    out = [r for i, r in enumerate(replies) if i not in waits]
    for i, (_, keys_, _) in calls.items():
        if isinstance(out[i], Exception):
            continue
        if not is_cluster(client):
            seen = next(iter(got.values()))
        else:
            owner = client.get_node_from_key(keys_[0]).name
            seen = next((got[p] for p, n in waits.items() if n.name == owner), -1)
        if seen < wait.replicas:
            out[i] = ReplicasNotAcked(wait.replicas, seen, wait.timeout_ms, out[i])
    return out


def _by_node(client: Any, calls: dict[int, ScriptCall]
             ) -> dict[str, list[int]]:
    """Pipeline positions by the cluster node that owns each call's slot."""
    groups: dict[str, list[int]] = {}
    for i, (_, keys_, _) in calls.items():
        groups.setdefault(client.get_node_from_key(keys_[0]).name, []).append(i)
    return groups


async def _execute_per_node(client: Any,
                            calls: dict[int, ScriptCall],
                            groups: dict[str, list[int]],
                            wait: ReplicaWait | None = None) -> list[Any]:
    """Script calls on several cluster nodes: one pipeline per node, concurrently.

    redis-py's cluster pipeline raises one error for the whole pipeline when any node's
    connection fails, although the other nodes ran their calls; per node, the error
    lands on that node's calls only and the others keep their replies (a call answered
    with a connection error may still have run: its caller must treat it as unknown).
    """
    async def run(positions: list[int]) -> list[Any]:
        pipe = ScriptPipeline(client)
        for i in positions:
            script, keys_, args = calls[i]
            script.queue(pipe, keys_, args)
        return await execute(client, pipe, wait)

    results = await asyncio.gather(*(run(g) for g in groups.values()), return_exceptions=True)
    replies: list[Any] = [None] * len(calls)
    for positions, result in zip(groups.values(), results):
        if isinstance(result, BaseException) and not isinstance(result, Exception):
            raise result  # cancellation
        for n, i in enumerate(positions):
            replies[i] = result if isinstance(result, Exception) else result[n]
    return replies


async def call_each(client: Client, script: Script,
                    calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
                    wait: ReplicaWait | None = None) -> list[Any]:
    """Run calls of a script; one reply per call, in order, with a failed call's error
    in its place (one EVALSHA for a single call, one pipeline otherwise; with ``wait``
    always a pipeline ending in WAIT, see :func:`execute`). Connection errors of a
    single call are raised."""
    if len(calls) == 1 and wait is None:
        try:
            return [await script(client, *calls[0])]
        except ResponseError as exc:
            return [exc]
    pipe = ScriptPipeline(client)
    for keys_, args in calls:
        script.queue(pipe, keys_, args)
    return await execute(client, pipe, wait)


async def call_chunks(client: Client, script: Script,
                      calls: Sequence[tuple[Sequence[str], Sequence[Any]]],
                      wait: ReplicaWait | None = None) -> list[Any]:
    """Run calls of a script that answers one list per call (one item per input) and
    return the items concatenated, in order. Raises the first failed call's error
    (:class:`ReplicasNotAcked` for a call ``wait`` did not confirm)."""
    items: list[Any] = []
    for reply in await call_each(client, script, calls, wait):
        if isinstance(reply, Exception):
            raise reply
        items += reply
    return items
