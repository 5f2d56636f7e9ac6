"""The key module: exact seed layout, no collisions from user input."""

from __future__ import annotations

import pytest

from dtq_gateway.domain import names
from dtq_gateway.store import keys


def test_layout_hash_tags_every_queue_key_with_the_queue_name():
    assert keys.stream("emails", 9) == "dtq:stream:{emails}:p9"
    assert keys.dead_letter("emails") == "dtq:stream:{emails}:dead-letter"
    assert keys.schedule("emails") == "dtq:retry:{emails}:schedule"
    assert keys.cancelled("emails") == "dtq:cancelled:{emails}"
    assert keys.paused("emails") == "dtq:queue:{emails}:paused"
    assert keys.busy_marker("emails") == "dtq:queue:{emails}:busy"
    assert keys.idempotency("emails", "ab") == "dtq:idempotency:{emails}:ab"
    assert keys.debounce("emails", "ab") == "dtq:debounce:{emails}:ab"
    assert keys.AUDIT == "dtq:stream:audit"
    assert keys.RETRY_CLAIMED == "dtq:retry:claimed"
    assert keys.worker("w-1") == "dtq:worker:{workers}:w-1"
    assert keys.WORKERS == "dtq:workers:{workers}"
    assert keys.gateway("ab") == "dtq:gateway:{workers}:ab"
    assert keys.RECENT_TASKS == "dtq:tasks:recent"
    assert keys.SCHEDULER_LOCK == "dtq:lock:scheduler"
    assert keys.EVENTS_CHANNEL == "dtq:events"


def test_task_ids_carry_the_slot_tag_of_their_queue():
    for queue in ("emails", "q", "a.b-c_1", "x" * 64, "Z9"):
        task_id = keys.new_task_id(queue)
        assert keys.TASK_ID_RE.match(task_id), task_id
        slot = keys.key_slot(keys.stream(queue, 0))
        for key in (keys.task(task_id), keys.result(task_id), keys.idempotency(queue, "d"),
                    keys.schedule(queue), keys.dead_letter(queue), keys.paused(queue)):
            assert keys.key_slot(key) == slot, (queue, key)
    assert keys.task("a" * 32 + "-9z") == "dtq:task:{9z}:" + "a" * 32 + "-9z"


def test_key_slot_agrees_with_redis_py():
    from redis.crc import key_slot
    for key in ("dtq:stream:{emails}:p9", "plain", "a{}b", "{x}{y}", "dtq:task:{0}:ab"):
        assert keys.key_slot(key) == key_slot(key.encode()), key


def test_every_slot_has_a_short_tag():
    tags = names._slot_tags()
    assert len(tags) == 16384 and max(map(len, tags)) <= 4
    assert all(keys.key_slot("{" + t + "}") == slot for slot, t in enumerate(tags))


@pytest.mark.parametrize("task_id, ok", [
    ("a" * 32, True), ("a" * 32 + "-0", True), ("a" * 32 + "-zzzz", True),
    ("a" * 32 + "-", False), ("a" * 32 + "-zzzzz", False), ("a" * 32 + "-Z", False),
    ("A" * 32, False), ("a" * 31 + "-1", False), ("a" * 32 + "-1\n", False)])
def test_task_id_alphabet(task_id, ok):
    assert bool(keys.TASK_ID_RE.match(task_id)) is ok


def test_untagged_ids_keep_the_keys_of_the_older_layout():
    assert keys.task("ab" * 16) == "dtq:task:" + "ab" * 16
    assert keys.result("ab" * 16) == "dtq:result:" + "ab" * 16


@pytest.mark.parametrize("key, parsed", [
    ("dtq:stream:{emails}:p3", ("emails", 3)),
    ("dtq:stream:emails:p3", None),
    ("dtq:stream:{emails}:dead-letter", None),
    ("dtq:stream:audit", None),
    ("dtq:stream:{a:b}:p1", None),
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


def test_delete_queue_touches_one_slot_only() -> None:
    from dtq_gateway.store.queue_delete import queue_keys

    names = queue_keys("emails")
    assert len(set(names)) == 21
    assert {keys.key_slot(k) for k in names} == {keys.key_slot("{emails}")}


def test_the_scripts_consumer_group_is_the_layouts() -> None:
    """_lib.lua creates a vanished band stream with this group (xadd_band); the rest of
    the gateway reads and creates keys.GROUP."""
    import re

    from dtq_gateway.store.scripts import LUA_DIR

    lib = (LUA_DIR / "_lib.lua").read_text()
    found = re.search(r"^local CONSUMER_GROUP = '([^']*)'$", lib, re.MULTILINE)
    assert found and found.group(1) == keys.GROUP


def test_internal_digests_are_out_of_reach_of_client_keys():
    for text in ("schedule:s:1000", "chain:abc", "group:g", ""):
        inner = keys.internal_idempotency_digest(text)
        assert len(inner) == 64 and int(inner, 16) >= 0
        assert inner != keys.idempotency_digest(text)
    # the hashed domain byte 0xFF is never part of a UTF-8 string, so no client text
    # (a protobuf string is UTF-8) can reproduce the internal input
    assert all(0xFF not in chr(c).encode("utf-8") for c in range(0x110000)
               if not 0xD800 <= c < 0xE000)


def test_entry_digest_prefers_the_entry_field_and_falls_back_for_old_entries():
    from dtq_gateway.store.leasing import entry_idem_digest
    inner = keys.internal_idempotency_digest("chain:a")
    assert entry_idem_digest({b"idempotency_key": b"chain:a", b"idem_digest": inner.encode()}) \
        == inner
    assert entry_idem_digest({"idempotency_key": "k"}) == keys.idempotency_digest("k")
    assert entry_idem_digest({"idempotency_key": ""}) == ""


def test_the_finished_index_builds_the_task_keys_the_layout_does() -> None:
    """_finished.lua deletes the records it trims by names it builds from task ids; they
    must be keys.task / keys.result of the id, tagged and untagged."""
    import re

    from dtq_gateway.store.scripts import LUA_DIR

    lua = (LUA_DIR / "_finished.lua").read_text()
    assert re.search(r"string\.match\(task_id, '%-\(\[0-9a-z\]\+\)\$'\)", lua)
    tagged = keys.new_task_id("emails")
    tag = tagged.rpartition("-")[2]
    assert "'dtq:task:{' .. tag .. '}:' .. task_id" in lua
    assert "'dtq:result:{' .. tag .. '}:' .. task_id" in lua
    assert keys.task(tagged) == f"dtq:task:{{{tag}}}:{tagged}"
    assert keys.result(tagged) == f"dtq:result:{{{tag}}}:{tagged}"
    untagged = "0" * 32
    assert "'dtq:task:' .. task_id, 'dtq:result:' .. task_id" in lua
    assert keys.task(untagged) == f"dtq:task:{untagged}"
    assert keys.result(untagged) == f"dtq:result:{untagged}"
    assert keys.key_slot(keys.finished("emails")) == keys.key_slot(keys.task(tagged))
