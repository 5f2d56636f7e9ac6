"""Worker conformance: black-box checks of a worker process against a real gateway.

Each test names one rule of docs/protocol.md and observes only what the gateway
records (GetTask, ListDeadLetters) and how the worker process exits.
"""

from __future__ import annotations

import json
import time

import pytest

from dtq_proto import dtq_pb2
from tests.conformance.client import ConformanceClient, describe, max_overlap
from tests.conformance.conftest import VISIBILITY_TIMEOUT_S, StartWorker
from tests.conformance.processes import Gateway

pytestmark = pytest.mark.system

S = dtq_pb2.TaskStatus
FAST_RETRY = dtq_pb2.RetryPolicy(backoff_base_ms=50, backoff_cap_ms=100)

POLL_S = 0.02  # interval of deadline-bounded polls


def test_tasks_are_received_and_acked_with_their_result(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    worker = start_worker(concurrency=4)
    payloads = [{"i": i, "text": "héllo wörld", "nested": {"list": [1, 2.5, None]}}
                for i in range(20)]
    ids = [client.enqueue(queue, "conf.echo", p) for p in payloads]
    binary = bytes(range(256))
    ids.append(client.enqueue(queue, "conf.echo", binary,
                              content_type="application/octet-stream"))
    # JSON that re-encoding would change (spaces, 1.0, \u escape): echo is byte-exact
    loose_json = b'{ "b" : 1.0, "a":"\\u00e9" }'
    ids.append(client.enqueue(queue, "conf.echo", loose_json, content_type="application/json"))
    expected = [json.dumps(p, separators=(",", ":"), ensure_ascii=False).encode()
                for p in payloads] + [binary, loose_json]

    for task_id, want, task in zip(ids, expected, client.wait_all_terminal(ids, 30)):
        assert task.status == S.TASK_STATUS_SUCCEEDED, describe(task)
        assert task.result == want, f"{task_id}: result is not the payload bytes"
        assert task.attempt == 1 and len(task.attempts) == 1, describe(task)
        assert task.attempts[0].outcome == "succeeded", describe(task)
        assert task.worker_id == worker.worker_id, describe(task)


def test_max_in_flight_is_never_exceeded(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    start_worker(concurrency=2, max_in_flight=2)
    ids = [client.enqueue(queue, "conf.sleep", {"ms": 250}) for _ in range(8)]
    tasks = client.wait_all_terminal(ids, 30)

    assert all(t.status == S.TASK_STATUS_SUCCEEDED for t in tasks), [describe(t) for t in tasks]
    # Every lease is an interval [leased, finished) on the Redis clock; at no
    # instant may more than max_in_flight of them overlap.
    intervals = [(a.started_at_ms, a.finished_at_ms) for t in tasks for a in t.attempts]
    assert all(start and end for start, end in intervals), intervals
    assert max_overlap(intervals) <= 2, intervals


def test_task_longer_than_visibility_timeout_is_kept_alive_by_heartbeats(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    start_worker(concurrency=1)
    sleep_ms = int(VISIBILITY_TIMEOUT_S * 1000 * 2.5)
    task_id = client.enqueue(queue, "conf.sleep", {"ms": sleep_ms}, timeout_ms=60000)
    task = client.wait_terminal(task_id, sleep_ms / 1000 + 15)

    assert task.status == S.TASK_STATUS_SUCCEEDED, describe(task)
    assert task.attempt == 1, "the task was redelivered: " + describe(task)
    assert [a.outcome for a in task.attempts] == ["succeeded"], describe(task)
    assert task.attempts[0].finished_at_ms - task.attempts[0].started_at_ms >= sleep_ms


def test_cancelled_running_task_is_stopped_and_reported(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    start_worker(concurrency=1, max_in_flight=1)
    task_id = client.enqueue(queue, "conf.sleep", {"ms": 60000}, timeout_ms=120000)
    client.wait_for(task_id, lambda t: t.status == S.TASK_STATUS_ACTIVE, 10, "ACTIVE")

    response = client.cancel(task_id)
    assert response.cancel_requested and response.status == S.TASK_STATUS_ACTIVE
    task = client.wait_terminal(task_id, 10)
    assert task.status == S.TASK_STATUS_CANCELLED, describe(task)
    assert task.attempts[-1].outcome == "cancelled", describe(task)
    # The only handler slot is free again: the cancelled handler really stopped.
    follow_up = client.enqueue(queue, "conf.echo", {"after": "cancel"})
    assert client.wait_terminal(follow_up, 10).status == S.TASK_STATUS_SUCCEEDED


#: Workers that take cancel notices on their Lease stream (LeaseRequest.accept_cancel_notices).
CANCEL_NOTICE_WORKERS = {"pyworker", "node", "go"}


@pytest.mark.gateway_heartbeat_s(30)
def test_cancel_reaches_a_running_handler_before_the_next_heartbeat(
        worker_command: tuple[str, str], start_worker: StartWorker,
        client: ConformanceClient, queue: str) -> None:
    if worker_command[0] not in CANCEL_NOTICE_WORKERS:
        pytest.skip(f"{worker_command[0]} takes cancels from heartbeats only (no "
                    "accept_cancel_notices): test_cancelled_running_task_is_stopped_and_reported")
    start_worker(concurrency=1, max_in_flight=1)
    task_id = client.enqueue(queue, "conf.sleep", {"ms": 60000}, timeout_ms=120000)
    client.wait_for(task_id, lambda t: t.status == S.TASK_STATUS_ACTIVE, 10, "ACTIVE")

    assert client.cancel(task_id).cancel_requested
    # with a 30 s heartbeat interval, only the pushed notice can end it this soon
    task = client.wait_terminal(task_id, 2.0)
    assert task.status == S.TASK_STATUS_CANCELLED, describe(task)
    assert [a.outcome for a in task.attempts] == ["cancelled"], describe(task)


def test_retryable_failure_is_retried_until_attempts_run_out(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    start_worker()
    task_id = client.enqueue(queue, "conf.fail", {"retryable": True, "message": "conf boom"},
                             max_attempts=3, retry_policy=FAST_RETRY)
    task = client.wait_terminal(task_id, 30)

    assert task.status == S.TASK_STATUS_DEAD_LETTERED, describe(task)
    assert task.attempt == 3, describe(task)
    assert [a.outcome for a in task.attempts] == ["failed"] * 3, describe(task)
    assert all(a.error_message == "conf boom" for a in task.attempts), describe(task)
    assert task.last_error == "conf boom"


def test_non_retryable_failure_is_dead_lettered_at_once(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    start_worker()
    task_id = client.enqueue(queue, "conf.fail", {"retryable": False, "message": "conf fatal"},
                             max_attempts=3, retry_policy=FAST_RETRY)
    task = client.wait_terminal(task_id, 20)

    assert task.status == S.TASK_STATUS_DEAD_LETTERED, describe(task)
    assert task.attempt == 1 and [a.outcome for a in task.attempts] == ["failed"], describe(task)
    assert task.last_error == "conf fatal"
    entries = [e for e in client.dead_letters(queue) if e.task_id == task_id]
    assert len(entries) == 1 and entries[0].attempts_made == 1, entries


def test_handler_timeout_is_enforced_by_the_worker(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    start_worker(concurrency=1)
    started = time.monotonic()
    task_id = client.enqueue(queue, "conf.sleep", {"ms": 60000}, timeout_ms=500,
                             max_attempts=1)
    # The gateway alone would only give up after timeout + lease grace (5 s) +
    # visibility timeout; the worker must fail the task right after 500 ms.
    task = client.wait_terminal(task_id, 4)

    assert time.monotonic() - started < 4.5
    assert task.status == S.TASK_STATUS_DEAD_LETTERED, describe(task)
    assert [a.outcome for a in task.attempts] == ["failed"], describe(task)
    assert task.last_error_class == "Timeout", describe(task)


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
def test_worker_reconnects_after_gateway_restart(
        start_worker: StartWorker, client: ConformanceClient, queue: str,
        gateway: Gateway, how: str) -> None:
    worker = start_worker(concurrency=2)
    in_flight = client.enqueue(queue, "conf.sleep", {"ms": 1500}, timeout_ms=60000)
    client.wait_for(in_flight, lambda t: t.status == S.TASK_STATUS_ACTIVE, 10, "ACTIVE")

    if how == "sigkill":
        gateway.kill()  # connections just break
    else:
        gateway.stop()  # graceful drain: Lease streams end with UNAVAILABLE
    gateway.start()
    assert worker.running, "the worker exited when the gateway went away\n" + worker.output()
    ids = [client.enqueue(queue, "conf.echo", {"after_restart": i}) for i in range(5)]
    for task in client.wait_all_terminal(ids, 30):
        assert task.status == S.TASK_STATUS_SUCCEEDED, describe(task)
    task = client.wait_terminal(in_flight, 20)
    assert task.status == S.TASK_STATUS_SUCCEEDED, describe(task)


def test_sigterm_drains_without_losing_or_double_running_tasks(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    first = start_worker(concurrency=2, max_in_flight=4, drain_grace_ms=10000)
    ids = [client.enqueue(queue, "conf.sleep", {"ms": 2000}, timeout_ms=60000)
           for _ in range(6)]
    # Wait until a heartbeat says both handler slots run (HeartbeatRequest.active_tasks):
    # those two tasks must then be finished by this worker, during the drain or before.
    deadline = time.monotonic() + 10
    while (info := client.worker_info(first.worker_id)) is None or info.active_tasks < 2:
        assert time.monotonic() < deadline, f"no heartbeat with 2 running handlers: {info}"
        time.sleep(POLL_S)

    code = first.terminate_and_wait(25)
    assert code == 0, f"worker exit code {code} after SIGTERM\n{first.output()}"
    # Right after exit nothing may still be leased to the drained worker: running
    # tasks were finished, buffered ones handed back.
    for task_id in ids:
        task = client.get(task_id)
        assert not (task.status == S.TASK_STATUS_ACTIVE and task.worker_id == first.worker_id), \
            "a lease was abandoned instead of released: " + describe(task)
    finished_by_first = [t for t in ids if client.get(t).status == S.TASK_STATUS_SUCCEEDED]
    assert len(finished_by_first) >= 2, \
        "running tasks must be finished during the drain, not released or dropped"

    start_worker(concurrency=2, warm_up=False)
    for task in client.wait_all_terminal(ids, 30):
        assert task.status == S.TASK_STATUS_SUCCEEDED, describe(task)
        assert task.attempt == 1, "a released task spent an attempt: " + describe(task)
        outcomes = [a.outcome for a in task.attempts]
        assert outcomes.count("succeeded") == 1, describe(task)
        assert not {"failed", "lease_expired", "cancelled"} & set(outcomes), describe(task)



@pytest.mark.gateway_auth
def test_worker_sends_its_bearer_token(
        start_worker: StartWorker, client: ConformanceClient, queue: str) -> None:
    worker = start_worker()  # warm-up: a task was leased and acked with DTQ_TOKEN
    task_id = client.enqueue(queue, "conf.echo", {"auth": True})
    task = client.wait_terminal(task_id, 10)
    assert task.status == S.TASK_STATUS_SUCCEEDED, describe(task)
    assert task.worker_id == worker.worker_id


@pytest.mark.gateway_auth
def test_worker_stops_when_its_token_is_refused(start_worker: StartWorker) -> None:
    worker = start_worker(token="not-a-known-token", warm_up=False)
    # UNAUTHENTICATED is not transient: the worker must stop and report, not retry.
    code = worker.wait(15)
    assert code is not None, "worker kept running after UNAUTHENTICATED\n" + worker.output()
    assert code != 0, "a refused worker must exit with a non-zero status"
