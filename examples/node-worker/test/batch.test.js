'use strict';
// Batch handlers (src/batch.js) against the scripted fake Broker.
const test = require('node:test');
const assert = require('node:assert/strict');

const { batch } = require('../src/batch');
const { loadConfig } = require('../src/config');
const { createBroker } = require('../src/rpc');
const { Worker } = require('../src/worker');
const { fakeBroker, task, startWorker, until } = require('./helpers');

function tasks(n, type, extra = () => ({})) {
  return Array.from({ length: n }, (_, i) => task(i + 1, type, { n: i + 1 }, extra(i + 1)));
}

async function stopped(worker, done, fake) {
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
}

test('a batch of 100 with 3 failing items acks 97 and fails the 3 alone', async () => {
  const calls = [];
  const failing = new Set([7, 42, 99]);
  const handlers = { embed: batch((payloads) => {
    calls.push(payloads.map((p) => p.n));
    return payloads.map((p) => (failing.has(p.n) ? new Error(`item ${p.n} broke`) : { n: p.n }));
  }, { maxSize: 100, maxWaitMs: 5000 }) };
  const fake = await fakeBroker({ tasks: tasks(100, 'embed') });
  const { worker, done } = startWorker(fake.port, {}, { handlers });
  await until(() => worker.stats.processed + worker.stats.failed === 100, 20000);
  assert.deepEqual(calls.map((c) => c.length), [100]); // one call for the whole batch
  assert.deepEqual(fake.seen.fails.map((f) => [f.lease_id, f.error_class, f.error_message,
    f.retryable]).sort(), [...failing].map((n) => [`lease-${n}`, 'Error', `item ${n} broke`, true]).sort());
  const acked = fake.seen.acks.map((a) => JSON.parse(Buffer.from(a.result).toString('utf8')).n);
  assert.equal(acked.length, 97);
  assert.ok(acked.every((n) => !failing.has(n)));
  assert.deepEqual([worker.stats.processed, worker.stats.failed], [97, 3]);
  await stopped(worker, done, fake);
});

test('a batch that throws fails every item with that error', async () => {
  const handlers = { bulk: batch(async () => { throw new TypeError('database unavailable'); },
    { maxSize: 5, maxWaitMs: 5000 }) };
  const fake = await fakeBroker({ tasks: tasks(5, 'bulk') });
  const { worker, done } = startWorker(fake.port, {}, { handlers });
  await until(() => fake.seen.fails.length === 5);
  assert.ok(fake.seen.fails.every((f) => f.error_class === 'TypeError' && f.retryable
    && f.error_message === 'database unavailable'));
  assert.equal(fake.seen.acks.length, 0);
  await stopped(worker, done, fake);
});

test('maxWaitMs flushes a partial batch', async () => {
  const sizes = [];
  const handlers = { partial: batch((payloads) => { sizes.push(payloads.length); },
    { maxSize: 100, maxWaitMs: 100 }) };
  const fake = await fakeBroker({ tasks: tasks(3, 'partial') });
  const { worker, done } = startWorker(fake.port, {}, { handlers });
  await until(() => fake.seen.acks.length === 3);
  assert.equal(sizes.reduce((a, b) => a + b, 0), 3);
  assert.ok(Math.max(...sizes) < 100);
  await stopped(worker, done, fake);
});

test('a batch past the smallest timeout_ms of its tasks fails every item as Timeout', async () => {
  const handlers = { slow: batch(() => new Promise(() => {}), { maxSize: 3, maxWaitMs: 5000 }) };
  const fake = await fakeBroker({ tasks: tasks(3, 'slow', (n) => ({ timeout_ms: n === 2 ? 200 : 60000 })) });
  const { worker, done } = startWorker(fake.port, {}, { handlers });
  await until(() => fake.seen.fails.length === 3);
  for (const f of fake.seen.fails) {
    assert.equal(f.error_class, 'Timeout');
    assert.equal(f.error_message, 'batch handler exceeded timeout_ms=200 (the smallest of its 3 tasks)');
  }
  assert.equal(worker.stats.timeouts, 3);
  await stopped(worker, done, fake);
});

test('cancelling one item of a running batch aborts its ctx.signal and reports it at once', async () => {
  const ref = { started: false, seen: null };
  const handlers = { pair: batch(async (payloads, ctxs) => {
    ref.started = true;
    while (!ctxs.some((c) => c.signal.aborted)) await new Promise((r) => setTimeout(r, 10));
    ref.seen = ctxs.map((c) => c.signal.aborted);
    return payloads;
  }, { maxSize: 2, maxWaitMs: 5000 }) };
  const fake = await fakeBroker({ tasks: tasks(2, 'pair'),
    cancelled: (ids) => (ref.started ? ids.filter((id) => id === 'lease-2') : []) });
  const { worker, done } = startWorker(fake.port, {}, { handlers });
  await until(() => worker.stats.processed === 1 && worker.stats.cancelled === 1);
  assert.deepEqual(ref.seen, [false, true]);
  assert.deepEqual([fake.seen.fails[0].lease_id, fake.seen.fails[0].mode], ['lease-2', 'FAIL_MODE_CANCELLED']);
  assert.equal(fake.seen.acks[0].lease_id, 'lease-1');
  assert.deepEqual([worker.stats.cancelled, worker.stats.processed], [1, 1]);
  await stopped(worker, done, fake);
});

test('a drain releases a gathering batch; the LeaseRequest counts a batch as maxSize tasks', async () => {
  const handlers = { never: batch(() => assert.fail('must not run'), { maxSize: 50, maxWaitMs: 60000 }) };
  const fake = await fakeBroker({ tasks: tasks(2, 'never') });
  const { worker, done } = startWorker(fake.port, { DTQ_CONCURRENCY: '3' }, { handlers });
  assert.equal(worker.session.request().concurrency, 3 + 49);
  await until(() => worker.held.size === 2);
  worker.stop();
  assert.equal(await done, 0);
  assert.deepEqual(fake.seen.fails.map((f) => [f.lease_id, f.mode]).sort(),
    [['lease-1', 'FAIL_MODE_RELEASE'], ['lease-2', 'FAIL_MODE_RELEASE']]);
  fake.close();
});

test('bad batch registration is refused naming the option; DTQ_POOL=process refuses batches', () => {
  assert.equal(require('..').batch, batch); // exported by the package
  const fn = () => {};
  assert.throws(() => batch(fn, { maxSize: 0 }), { name: 'RangeError', message: /^maxSize: / });
  assert.throws(() => batch(fn, { maxSize: 1.5 }), { name: 'RangeError', message: /^maxSize: / });
  assert.throws(() => batch(fn, { maxWaitMs: -1 }), { name: 'RangeError', message: /^maxWaitMs: / });
  assert.throws(() => batch(fn, { maxWaitMs: 60001 }), { name: 'RangeError', message: /^maxWaitMs: / });
  assert.throws(() => batch('nope'), TypeError);
  const config = loadConfig({ DTQ_QUEUE: 'q', DTQ_GATEWAY: '127.0.0.1:1', DTQ_POOL: 'process' });
  const { broker, metadata } = createBroker(config);
  assert.throws(() => new Worker(config, { broker, metadata, handlers: { b: batch(fn) } }),
    /batch task b: batch handlers are not supported with DTQ_POOL=process/);
  broker.close();
});
