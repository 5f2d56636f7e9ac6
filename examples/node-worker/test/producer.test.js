'use strict';
// The Producer against a real gateway: tests/conformance/test_node_producer.py starts
// one (with a worker serving queue DTQ_TEST_QUEUE: "ok" echoes, "boom" fails for
// good) and sets DTQ_TEST_GATEWAY. Without it only the pure tests run.
const test = require('node:test');
const assert = require('node:assert/strict');

const dtq = require('..');
const { Producer, TaskFailed, TaskCancelled, TaskNotSucceeded, TaskWaitTimeout, enqueueRequest } = dtq;

const GATEWAY = process.env.DTQ_TEST_GATEWAY;
const QUEUE = process.env.DTQ_TEST_QUEUE || 'node-producer';
const live = { skip: GATEWAY ? false : 'DTQ_TEST_GATEWAY not set (run from pytest)' };

test('enqueueRequest: JSON by default, Buffers as octet-stream, options mapped', () => {
  const json = enqueueRequest('q', 't', { a: 1 }, { priority: 7, delayMs: 50, idempotencyKey: 'k',
    metadata: { n: 1 }, retryPolicy: { backoffBaseMs: 10 } });
  assert.equal(json.content_type, 'application/json');
  assert.deepEqual(JSON.parse(json.payload.toString()), { a: 1 });
  assert.equal(json.priority, 7);
  assert.equal(json.delay_ms, 50);
  assert.equal(json.idempotency_key, 'k');
  assert.deepEqual(json.metadata, { n: '1' });
  assert.deepEqual(json.retry_policy, { backoff_base_ms: 10, backoff_cap_ms: 0 });
  const raw = enqueueRequest('q', 't', Buffer.from([0, 255]));
  assert.equal(raw.content_type, 'application/octet-stream');
  assert.throws(() => enqueueRequest('q', 't', {}, { colour: 'red' }), TypeError);
  const deb = enqueueRequest('q', 't', {}, { debounce: { key: 'k', windowMs: 100, mode: 'keep_last', maxDelayMs: 500 } });
  assert.deepEqual(deb.debounce, { key: 'k', window_ms: 100, mode: 'DEBOUNCE_MODE_KEEP_LAST', max_delay_ms: 500 });
  assert.throws(() => enqueueRequest('q', 't', {}, { debounce: { key: 'k', windowMs: 1, mode: 'last' } }), TypeError);
});

test('producer: a debounced burst is one task with the last payload', live, async () => {
  const producer = new Producer({ gateway: GATEWAY });
  try {
    const debounce = { key: 'node-doc', windowMs: 60000, mode: 'keep_last' };
    const first = await producer.enqueue(`${QUEUE}-idle`, 'ok', { rev: 1 }, { debounce });
    const second = await producer.enqueue(`${QUEUE}-idle`, 'ok', { rev: 2 }, { debounce });
    assert.equal(first.debounced, false);
    assert.equal(first.status, 'SCHEDULED');
    assert.equal(second.debounced, true);
    assert.equal(second.taskId, first.taskId);
    assert.deepEqual((await producer.get(first.taskId)).payload, { rev: 2 });
    await producer.cancel(first.taskId, 'node test');
  } finally {
    producer.close();
  }
});

test('the package exports the producer and the worker', () => {
  for (const name of ['Producer', 'Worker', 'TaskFailed', 'TaskCancelled', 'TaskExpired', 'PermanentError']) {
    assert.equal(typeof dtq[name], 'function', name);
  }
});

test('producer: enqueue, get and wait for a succeeding task', live, async () => {
  const producer = new Producer({ gateway: GATEWAY });
  try {
    const res = await producer.enqueue(QUEUE, 'ok', { n: 21 }, { priority: 8, metadata: { from: 'node' } });
    assert.match(res.taskId, /^[0-9a-f]{32}-[0-9a-z]{1,4}$/); // <random>-<slot tag of its queue>
    assert.equal(res.deduplicated, false);
    assert.equal(res.status, 'QUEUED');
    const task = await producer.wait(res.taskId, { timeoutMs: 10000 });
    assert.equal(task.status, 'SUCCEEDED');
    assert.deepEqual(task.result, { echo: { n: 21 } });
    assert.deepEqual(task.payload, { n: 21 });
    assert.equal(task.priority, 8);
    assert.deepEqual(task.metadata, { from: 'node' });
    assert.ok(task.createdAt instanceof Date && task.finishedAt >= task.createdAt);
    assert.equal(task.attempts.length, 1);
    assert.equal(task.attempts[0].outcome, 'succeeded');
    const again = await producer.get(res.taskId);
    assert.equal(again.status, 'SUCCEEDED');
  } finally {
    producer.close();
  }
});

test('producer: wait rejects with TaskFailed, TaskCancelled and TaskWaitTimeout', live, async () => {
  const producer = new Producer({ gateway: GATEWAY });
  try {
    const bad = await producer.enqueue(QUEUE, 'boom', { x: 1 });
    await assert.rejects(producer.wait(bad.taskId, { timeoutMs: 10000 }), (err) => {
      assert.ok(err instanceof TaskFailed && err instanceof TaskNotSucceeded);
      assert.equal(err.status, 'DEAD_LETTERED');
      assert.equal(err.errorClass, 'PermanentError');
      assert.equal(err.error, 'kaput');
      return true;
    });
    const parked = await producer.enqueue(`${QUEUE}-idle`, 'ok', {}, { delayMs: 60000 });
    assert.equal(parked.status, 'SCHEDULED');
    await assert.rejects(producer.wait(parked.taskId, { timeoutMs: 50 }), TaskWaitTimeout);
    const cancelled = await producer.cancel(parked.taskId, 'node test');
    assert.equal(cancelled.status, 'CANCELLED');
    await assert.rejects(producer.wait(parked.taskId), TaskCancelled);
    const ended = await producer.wait(parked.taskId, { raiseOnFailure: false });
    assert.equal(ended.status, 'CANCELLED');
    await assert.rejects(producer.get('0'.repeat(32)), (err) => err.code === 5); // NOT_FOUND
  } finally {
    producer.close();
  }
});
