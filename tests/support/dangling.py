"""Dangling references in a dtq Redis: ids a record names that name nothing.

Scans the keys (SCAN, so a live gateway keeps running) and follows every id that a
record names:

* a task record's ``next_task_id`` (the chain step after it), ``chain_id`` (the chain's
  first task) and ``group_id``/``group_queue`` (its group record);
* a group record's ``members`` and ``callback_task_id``;
* an idempotency record's ``task_id``;
* a schedule's ``last_task_id``;
* the members of the chain-pending and group-pending sets;
* the ``task_id`` of every dead-letter entry.

Every one must name an existing task record (or group record). The check is meant for
a run shorter than every retention (task records, groups, idempotency records, all a
day or more by default), where nothing may have expired yet. It reads record by
record, so a reference being made while it reads can look dangling for a moment:
:func:`assert_no_dangling_references` polls until a read finds none, with a deadline.
"""

from __future__ import annotations

import json
import time

import redis

from dtq_gateway.store import keys


def _s(raw) -> str:
    return raw.decode() if isinstance(raw, bytes) else (raw or "")


def _scan(client: redis.Redis, pattern: str, type_: str) -> list[str]:
    return [_s(k) for k in client.scan_iter(match=pattern, count=1000, _type=type_)]


def find_dangling_references(client: redis.Redis) -> list[str]:
    """One pass over the keys; the dangling references found, as readable lines."""
    out: list[str] = []

    def task_missing(task_id: str, named_by: str) -> None:
        if task_id and not client.exists(keys.task(task_id)):
            out.append(f"{named_by} names task {task_id}, which does not exist")

    for key in _scan(client, f"{keys.PREFIX}task:*", "hash"):
        names = ("task_id", "next_task_id", "chain_id", "group_id", "group_queue")
        f = dict(zip(names, map(_s, client.hmget(key, *names))))
        if not f["task_id"]:
            continue  # the hash expired or was deleted between SCAN and HMGET
        task_missing(f["next_task_id"], f"task {f['task_id']} (next_task_id)")
        if f["chain_id"] != f["task_id"]:
            task_missing(f["chain_id"], f"task {f['task_id']} (chain_id)")
        if f["group_id"] and not client.exists(keys.group(f["group_queue"], f["group_id"])):
            out.append(f"task {f['task_id']} names group {f['group_id']} "
                       f"(queue {f['group_queue']}), which does not exist")

    for key in _scan(client, f"{keys.PREFIX}group:*", "hash"):
        members, cb_id = client.hmget(key, "members", "callback_task_id")
        for member in json.loads(_s(members) or "[]"):
            task_missing(member, f"group {key} (members)")
        task_missing(_s(cb_id), f"group {key} (callback_task_id)")

    for key in _scan(client, f"{keys.PREFIX}idempotency:*", "string"):
        raw = client.get(key)
        if raw:
            task_missing(json.loads(raw).get("task_id", ""), f"idempotency record {key}")

    for key in _scan(client, f"{keys.PREFIX}schedule:*", "hash"):
        task_missing(_s(client.hget(key, "last_task_id")), f"schedule {key} (last_task_id)")

    for key in _scan(client, f"{keys.PREFIX}chains:pending:*", "zset"):
        for member in client.zrange(key, 0, -1):
            task_missing(_s(member), f"chain-pending set {key}")

    for key in _scan(client, f"{keys.PREFIX}groups:pending:*", "zset"):
        queue = key.split("{", 1)[1].rstrip("}")
        for member in client.zrange(key, 0, -1):
            if not client.exists(keys.group(queue, _s(member))):
                out.append(f"group-pending set {key} names group {_s(member)}, which does "
                           "not exist")

    for key in _scan(client, f"{keys.PREFIX}stream:*:dead-letter", "stream"):
        for entry_id, fields in client.xrange(key):
            task_missing(_s(fields.get(b"task_id")), f"dead-letter entry {_s(entry_id)} of {key}")
    return out


def assert_no_dangling_references(client: redis.Redis, timeout_s: float = 20.0) -> None:
    """Poll :func:`find_dangling_references` until a pass finds none; fail with the
    last pass's findings after ``timeout_s`` (a reference that stays dangling is a
    bug, one being written while the pass read is not)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = find_dangling_references(client)
        if not found or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert found == [], "\n".join(found[:50])
