'use strict';
// Protocol behaviour of the Worker against a scripted in-process fake Broker.
const test = require('node:test');
const assert = require('node:assert/strict');
const grpc = require('@grpc/grpc-js');

const { fakeBroker, task, startWorker, until } = require('./helpers');

test('a lost lease is stopped and never reported', async () => {
  const fake = await fakeBroker({ tasks: [task(1, 'conf.sleep', { ms: 10000 })],
    lost: (ids) => ids.filter((id) => id === 'lease-1') });
  const { worker, done } = startWorker(fake.port);
  await until(() => worker.stats.lost === 1);
  assert.equal(worker.held.size, 0);
  assert.equal(worker.stop() instanceof Promise, true);
  assert.equal(await done, 0);
  assert.deepEqual([fake.seen.acks.length, fake.seen.fails.length], [0, 0]);
  fake.close();
});

/** A heartbeat script reporting lease-1 lost once its result waits in the reporter. */
function lostWhileReporting(ref) {
  return (ids) => ids.filter((id) => id === 'lease-1' && ref.worker?.held.get(id)?.phase === 'reporting');
}

test('an unsent result of a lost lease is still sent and counted by the answer', async () => {
  const ref = {};
  const fake = await fakeBroker({ tasks: [task(1, 'conf.echo', { a: 1 })],
    lost: lostWhileReporting(ref), ackError: grpc.status.FAILED_PRECONDITION });
  // the result waits a second for companions; heartbeats every 50 ms report it lost
  const { worker, done } = startWorker(fake.port, { DTQ_ACK_FLUSH_MS: '1000' });
  ref.worker = worker;
  await until(() => worker.stats.stale === 1);
  assert.ok(fake.seen.heartbeats.some((ids) => ids.includes('lease-1')));
  assert.deepEqual(fake.seen.acks.map((a) => a.lease_id), ['lease-1']); // fenced: STALE_LEASE
  assert.equal(worker.stats.processed, 0);
  assert.equal(worker.held.size, 0);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('a Fail of a lost lease answered as a duplicate counts the failure and its retry', async () => {
  const ref = {};
  // the gateway had applied this Fail (a reply lost): the resend is a duplicate, and
  // the retry it scheduled is already leased again
  const fake = await fakeBroker({ tasks: [task(1, 'conf.fail', { message: 'boom' })],
    lost: lostWhileReporting(ref),
    failResult: (i) => ({ lease_id: i.lease_id, duplicate: true, status: 'TASK_STATUS_ACTIVE' }) });
  const { worker, done } = startWorker(fake.port, { DTQ_ACK_FLUSH_MS: '1000' });
  ref.worker = worker;
  await until(() => worker.stats.failed === 1);
  assert.ok(fake.seen.heartbeats.some((ids) => ids.includes('lease-1')));
  assert.deepEqual([worker.stats.retried, worker.stats.stale], [1, 0]);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('progress goes out on an early heartbeat with only the reporting lease', async () => {
  const fake = await fakeBroker({ heartbeatMs: 60000,
    tasks: [task(1, 'conf.sleep', { ms: 10000 }), task(2, 'conf.echo', { a: 1 })] });
  const { worker, done } = startWorker(fake.port);
  await until(() => (fake.seen.progress || []).length === 1, 4000);
  assert.equal(fake.seen.progress[0].lease_id, 'lease-1');
  assert.equal(fake.seen.progress[0].message, 'sleeping');
  assert.deepEqual(fake.seen.heartbeats, [['lease-1']]); // the regular one is 60 s away
  worker.stop();
  await done;
  fake.close();
});

test('a cancelled running task is reported with FAIL_MODE_CANCELLED', async () => {
  const fake = await fakeBroker({ tasks: [task(1, 'conf.sleep', { ms: 10000 })],
    cancelled: (ids) => ids });
  const { worker, done } = startWorker(fake.port);
  await until(() => fake.seen.fails.length === 1);
  assert.equal(fake.seen.fails[0].mode, 'FAIL_MODE_CANCELLED');
  await until(() => worker.stats.cancelled === 1);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('a stale single-item Ack is dropped, not resent', async () => {
  const fake = await fakeBroker({ tasks: [task(1, 'conf.echo', { a: 1 })],
    ackError: grpc.status.FAILED_PRECONDITION });
  const { worker, done } = startWorker(fake.port);
  await until(() => worker.stats.stale === 1);
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(fake.seen.acks.length, 1);
  assert.equal(worker.stats.processed, 0);
  worker.stop();
  await done;
  fake.close();
});

test('heartbeats list buffered leases; drain releases them and finishes the running one', async () => {
  const tasks = [1, 2, 3].map((n) => task(n, 'conf.sleep', { ms: 300 }));
  const fake = await fakeBroker({ tasks });
  const { worker, done } = startWorker(fake.port, { DTQ_CONCURRENCY: '1' });
  await until(() => fake.seen.heartbeats.some((ids) => ids.length === 3));
  worker.stop();
  assert.equal(await done, 0);
  const released = fake.seen.fails.filter((f) => f.mode === 'FAIL_MODE_RELEASE');
  assert.deepEqual(released.map((f) => f.lease_id).sort(), ['lease-2', 'lease-3']);
  assert.deepEqual(fake.seen.acks.map((a) => a.lease_id), ['lease-1']);
  fake.close();
});

test('a timed-out handler fails with error class Timeout', async () => {
  const fake = await fakeBroker({ tasks: [task(1, 'conf.sleep', { ms: 10000 }, { timeout_ms: 100 })] });
  const { worker, done } = startWorker(fake.port);
  await until(() => fake.seen.fails.length === 1);
  assert.equal(fake.seen.fails[0].error_class, 'Timeout');
  assert.equal(fake.seen.fails[0].retryable, true);
  worker.stop();
  await done;
  fake.close();
});

test('UNAUTHENTICATED on Lease stops the worker with exit code 3', async () => {
  const fake = await fakeBroker({ leaseError: grpc.status.UNAUTHENTICATED });
  const { done } = startWorker(fake.port);
  assert.equal(await done, 3);
  assert.equal(fake.seen.leases, 1);
  fake.close();
});

test('UNAVAILABLE on Lease reconnects', async () => {
  const fake = await fakeBroker({ leaseError: grpc.status.UNAVAILABLE });
  const { worker, done } = startWorker(fake.port, { DTQ_RECONNECT_BASE_MS: '10', DTQ_RECONNECT_MAX_MS: '20' });
  await until(() => fake.seen.leases >= 3);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('drain: draining heartbeat, tasks in transit released, stream read to its OK end', async () => {
  const fake = await fakeBroker({ tasks: [task(1, 'conf.sleep', { ms: 300 })],
    inTransit: [task(2, 'conf.echo', { late: true })] });
  const { worker, done } = startWorker(fake.port, { DTQ_CONCURRENCY: '1' });
  await until(() => worker.running.size === 1 && fake.seen.heartbeats.length > 0);
  const started = Date.now();
  worker.stop();
  assert.equal(await done, 0);
  assert.ok(Date.now() - started < 2000, 'the stream ended on OK, before the bounded wait');
  const first = fake.seen.draining.indexOf(true);
  assert.ok(first > 0, 'a heartbeat with draining=true was sent');
  assert.ok(fake.seen.draining.slice(first).every((d) => d), 'later heartbeats keep draining');
  assert.ok(fake.seen.heartbeats[first].includes('lease-1'));
  assert.equal(fake.seen.ended, 1);
  assert.equal(fake.seen.leases, 1, 'no reconnect after the stream ended');
  assert.deepEqual(fake.seen.fails.map((f) => [f.lease_id, f.mode]), [['lease-2', 'FAIL_MODE_RELEASE']]);
  assert.deepEqual(fake.seen.acks.map((a) => a.lease_id), ['lease-1']);
  fake.close();
});

test('drain: a gateway that ignores draining is waited for at most the bound', async () => {
  const fake = await fakeBroker({ honorDraining: false });
  const { worker, done } = startWorker(fake.port);
  await until(() => fake.seen.heartbeats.length > 0);
  const started = Date.now();
  worker.stop();
  assert.equal(await done, 0);
  const waited = Date.now() - started;
  assert.ok(waited >= 1900 && waited < 4000, `drain took ${waited} ms`);
  assert.ok(fake.seen.draining.includes(true));
  fake.close();
});

test('tasks of a batch message each run and are reported on their own', async () => {
  const tasks = Array.from({ length: 7 }, (_, i) => task(i + 1, 'conf.echo', { n: i + 1 }));
  tasks[4] = task(5, 'conf.fail', { retryable: false, message: 'no' });
  const fake = await fakeBroker({ batch: true, tasks });
  const { worker, done } = startWorker(fake.port, { DTQ_CONCURRENCY: '2', DTQ_MAX_IN_FLIGHT: '3' });
  await until(() => fake.seen.acks.length === 6 && fake.seen.fails.length === 1);
  assert.equal(fake.seen.request.max_batch, 3); // as many as the credit
  assert.deepEqual(fake.seen.messages, [3, 3, 1]);
  assert.deepEqual(fake.seen.acks.map((a) => [a.lease_id, a.result.toString()]).sort(),
    [1, 2, 3, 4, 6, 7].map((n) => [`lease-${n}`, `{"n":${n}}`]).sort());
  assert.deepEqual(fake.seen.fails.map((f) => [f.lease_id, f.error_message]), [['lease-5', 'no']]);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('a gateway that ignores max_batch still delivers one task per message', async () => {
  const tasks = [1, 2, 3].map((n) => task(n, 'conf.echo', { n }));
  const fake = await fakeBroker({ tasks }); // no script.batch: the original protocol
  const { worker, done } = startWorker(fake.port, { DTQ_MAX_IN_FLIGHT: '300' });
  await until(() => fake.seen.acks.length === 3);
  assert.equal(fake.seen.request.max_batch, 256); // asked for, capped at 256
  assert.deepEqual(fake.seen.messages, [1, 1, 1]);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});
