'use strict';
// DTQ_POOL=process: handlers in child processes, killed on time-out and cancellation.
const test = require('node:test');
const assert = require('node:assert/strict');
const path = require('node:path');

const { loadConfig, ConfigError } = require('../src/config');
const { fakeBroker, task, startWorker, until } = require('./helpers');

const FIXTURE = path.join(__dirname, 'fixtures', 'pool_handlers.js');
const { handlers } = require(FIXTURE);
const NEXT_TASK_MS = 1000; // the task after a killed or dead child starts within 1 s

function poolWorker(port, env = {}) {
  return startWorker(port, { DTQ_POOL: 'process', DTQ_CONCURRENCY: '1', ...env },
    { handlers, handlersPath: FIXTURE });
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return err.code !== 'ESRCH';
  }
}

/** Ack'd results by lease id, decoded, with when the fake got them. */
function ackOf(fake, leaseId) {
  const ack = fake.seen.acks.find((a) => a.lease_id === leaseId);
  return ack && JSON.parse(Buffer.from(ack.result).toString('utf8'));
}

test('DTQ_POOL takes loop or process; DTQ_CANCEL_GRACE_MS defaults to 2000', () => {
  const config = loadConfig({ DTQ_QUEUE: 'q' });
  assert.deepEqual([config.pool, config.cancelGraceMs], ['loop', 2000]);
  assert.equal(loadConfig({ DTQ_QUEUE: 'q', DTQ_POOL: 'process' }).pool, 'process');
  assert.throws(() => loadConfig({ DTQ_QUEUE: 'q', DTQ_POOL: 'thread' }), ConfigError);
});

test('a handler blocking its thread past timeout_ms is killed; the next task runs within 1 s', async () => {
  const fake = await fakeBroker({ tasks: [task(0, 'pool.pid', {}),
    task(1, 'pool.block', { ms: 60000 }, { timeout_ms: 300 }), task(2, 'pool.pid', {})] });
  const { worker, done } = poolWorker(fake.port);
  await until(() => ackOf(fake, 'lease-2'), 10000);
  const failAt = fake.seen.at['lease-1'];
  assert.ok(fake.seen.at['lease-2'] - failAt < NEXT_TASK_MS, `${fake.seen.at['lease-2'] - failAt} ms`);
  const fail = fake.seen.fails.find((f) => f.lease_id === 'lease-1');
  assert.deepEqual([fail.error_class, fail.retryable], ['Timeout', true]);
  const first = ackOf(fake, 'lease-0').pid;
  assert.notEqual(ackOf(fake, 'lease-2').pid, first); // the slot's child was replaced
  await until(() => !alive(first));
  assert.equal(worker.stats.timeouts, 1);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('a child that aborts fails only its task as HandlerProcessDied', async () => {
  const fake = await fakeBroker({ tasks: [task(1, 'pool.abort', {}), task(2, 'pool.pid', {})] });
  const { worker, done } = poolWorker(fake.port);
  await until(() => ackOf(fake, 'lease-2'), 10000);
  const fail = fake.seen.fails.find((f) => f.lease_id === 'lease-1');
  assert.equal(fail.error_class, 'HandlerProcessDied');
  assert.match(fail.error_message, /died while running the task \(killed by signal SIGABRT\)/);
  assert.equal(fail.retryable, true);
  assert.ok(fake.seen.at['lease-2'] - fake.seen.at['lease-1'] < NEXT_TASK_MS);
  assert.equal(worker.processes.started, 2); // one child, one replacement
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('cancel kills a child that ignores it after the grace; one that stops keeps its child', async () => {
  const ref = {};
  const running = (ids, lease) => ids.filter((id) => id === lease
    && ref.worker?.held.get(id)?.phase === 'running');
  const fake = await fakeBroker({ tasks: [task(0, 'pool.pid', {}), task(1, 'pool.block', { ms: 60000 }),
    task(2, 'pool.pid', {}), task(3, 'pool.polite', {}), task(4, 'pool.pid', {})],
  cancelled: (ids) => [...running(ids, 'lease-1'), ...running(ids, 'lease-3')] });
  const { worker, done } = poolWorker(fake.port, { DTQ_CANCEL_GRACE_MS: '400' });
  ref.worker = worker;
  await until(() => ackOf(fake, 'lease-4'), 10000);
  const modes = Object.fromEntries(fake.seen.fails.map((f) => [f.lease_id, f.mode]));
  assert.deepEqual(modes, { 'lease-1': 'FAIL_MODE_CANCELLED', 'lease-3': 'FAIL_MODE_CANCELLED' });
  const [first, second, third] = ['lease-0', 'lease-2', 'lease-4'].map((id) => ackOf(fake, id).pid);
  assert.ok(!alive(first));
  assert.notEqual(second, first); // the blocked child was killed after the grace
  assert.ok(fake.seen.at['lease-2'] - fake.seen.at['lease-1'] >= 400);
  assert.equal(third, second); // the polite handler returned: its child stayed
  assert.equal(worker.stats.cancelled, 2);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('progress from a child reaches the heartbeat', async () => {
  const fake = await fakeBroker({ tasks: [task(1, 'pool.pid', {})] });
  const { worker, done } = poolWorker(fake.port);
  await until(() => (fake.seen.progress || []).length === 1, 4000);
  assert.deepEqual([fake.seen.progress[0].percent, fake.seen.progress[0].message], [50, 'half']);
  worker.stop();
  assert.equal(await done, 0);
  fake.close();
});

test('the drain kills a blocked child and releases its task', async () => {
  const fake = await fakeBroker({ tasks: [task(0, 'pool.pid', {}), task(1, 'pool.block', { ms: 60000 })] });
  const { worker, done } = poolWorker(fake.port, { DTQ_DRAIN_GRACE_MS: '200' });
  await until(() => ackOf(fake, 'lease-0') && worker.held.get('lease-1')?.phase === 'running');
  const started = Date.now();
  worker.stop();
  assert.equal(await done, 0);
  assert.ok(Date.now() - started < 10000); // not the 60 s the handler blocks for
  const fail = fake.seen.fails.find((f) => f.lease_id === 'lease-1');
  assert.equal(fail.mode, 'FAIL_MODE_RELEASE');
  await until(() => !alive(ackOf(fake, 'lease-0').pid));
  fake.close();
});

test('a child ignores a SIGTERM sent to the process group; the worker stops it', async () => {
  const { ProcessPool } = require('../src/procpool');
  const pool = new ProcessPool({ size: 1, handlersPath: FIXTURE, cancelGraceMs: 0, workerId: 'w' });
  pool.start();
  const run = (n) => pool.run(task(n, 'pool.pid', {}), {}, new AbortController().signal, () => {});
  const first = JSON.parse((await run(1)).value.toString('utf8')).pid;
  process.kill(first, 'SIGTERM');
  await new Promise((r) => setTimeout(r, 300));
  const second = JSON.parse((await run(2)).value.toString('utf8')).pid;
  assert.equal(second, first);
  pool.close();
  await until(() => !alive(first));
});
