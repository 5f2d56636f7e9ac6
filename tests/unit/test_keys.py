"""The key module: exact seed layout, no collisions from user input."""

from __future__ import annotations

import pytest

from dtq_gateway import keys


def test_layout_matches_the_seed_table():
    assert keys.stream("emails", 9) == "dtq:stream:emails:p9"
    assert keys.DEAD_LETTER == "dtq:stream:dead-letter"
    assert keys.AUDIT == "dtq:stream:audit"
    assert keys.RETRY_SCHEDULE == "dtq:retry:schedule"
    assert keys.RETRY_CLAIMED == "dtq:retry:claimed"
    assert keys.task("ab") == "dtq:task:ab"
    assert keys.result("ab") == "dtq:result:ab"
    assert keys.worker("w-1") == "dtq:worker:w-1"
    assert keys.WORKERS == "dtq:workers"
    assert keys.paused("emails") == "dtq:queue:emails:paused"
    assert keys.CANCELLED == "dtq:cancelled"
    assert keys.RECENT_TASKS == "dtq:tasks:recent"
    assert keys.SCHEDULER_LOCK == "dtq:lock:scheduler"
    assert keys.EVENTS_CHANNEL == "dtq:events"


def test_queue_streams_are_p9_first():
    assert keys.queue_streams_desc("q") == [f"dtq:stream:q:p{b}" for b in range(9, -1, -1)]


@pytest.mark.parametrize("key, parsed", [
    ("dtq:stream:emails:p3", ("emails", 3)),
    ("dtq:stream:dead-letter", None),
    ("dtq:stream:audit", None),
    ("dtq:stream:a:b:p1", None),
])
def test_parse_stream(key, parsed):
    assert keys.parse_stream(key) == parsed


def test_idempotency_keys_cannot_collide_across_queues_or_keys():
    # "a:b" in queue "q" and "b" in queue "q:a" would collide if keys were concatenated raw;
    # queue names cannot hold ':' and the user key is hashed.
    a = keys.idempotency("q", keys.idempotency_digest("a:b"))
    b = keys.idempotency("q", keys.idempotency_digest("b"))
    assert a != b
    assert not keys.QUEUE_RE.match("q:a")
    assert len(keys.idempotency_digest("x" * 10_000)) == 64


@pytest.mark.parametrize("name, ok", [("emails", True), ("a.b-c_1", True), ("", False),
                                      ("x" * 65, False), ("with space", False),
                                      ("colon:no", False), ("star*", False),
                                      ("hidden\n", False), ("caf\u00e9", False)])
def test_queue_name_alphabet(name, ok):
    assert bool(keys.QUEUE_RE.match(name)) is ok


@pytest.mark.parametrize("pattern", [keys.QUEUE_RE, keys.WORKER_ID_RE, keys.TASK_TYPE_RE])
def test_names_ending_in_a_newline_are_refused(pattern):
    assert pattern.match("name") and not pattern.match("name\n")
    assert not keys.TASK_ID_RE.match("a" * 32 + "\n")
