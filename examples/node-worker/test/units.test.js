'use strict';
// Unit tests of the pure parts: node --test test/
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');

const { loadConfig, ConfigError } = require('../src/config');
const { Backoff } = require('../src/backoff');
const { decodePayload, encodeResult, isJson } = require('../src/task');
const { cutUtf8, describeError, PermanentError, RetryError } = require('../src/errors');
const demo = require('../src/handlers/demo');
const conf = require('../src/handlers/conf');

test('config: DTQ_QUEUES wins over DTQ_QUEUE, defaults applied', () => {
  const c = loadConfig({ DTQ_QUEUES: 'a, b', DTQ_QUEUE: 'z', DTQ_CONCURRENCY: '3' });
  assert.deepEqual(c.queues, ['a', 'b']);
  assert.equal(c.maxInFlight, 6);
  assert.equal(c.drainGraceMs, 30000);
  assert.equal(c.gateway, '127.0.0.1:50051');
  assert.ok(fs.existsSync(c.protoPath), c.protoPath);
});

test('config: DTQ_QUEUE alone, explicit max in flight and proto path', () => {
  const c = loadConfig({ DTQ_QUEUE: 'q', DTQ_MAX_IN_FLIGHT: '2', DTQ_PROTO: '/x/dtq.proto' });
  assert.deepEqual(c.queues, ['q']);
  assert.equal(c.maxInFlight, 2);
  assert.equal(c.protoPath, '/x/dtq.proto');
});

test('config: bad values fail with the variable named', () => {
  assert.throws(() => loadConfig({}), /DTQ_QUEUES/);
  assert.throws(() => loadConfig({ DTQ_QUEUE: 'bad queue' }), ConfigError);
  assert.throws(() => loadConfig({ DTQ_QUEUE: 'q', DTQ_CONCURRENCY: '0' }), /DTQ_CONCURRENCY/);
  assert.throws(() => loadConfig({ DTQ_QUEUE: 'q', DTQ_GATEWAY: 'nohost' }), /DTQ_GATEWAY/);
  assert.throws(() => loadConfig({ DTQ_QUEUE: 'q', DTQ_WORKER_ID: 'a|b' }), /DTQ_WORKER_ID/);
});

test('config: DTQ_TLS is on for 1, true, yes and on (any case) or with DTQ_TLS_CA', () => {
  for (const v of ['1', 'true', 'YES', ' on ']) {
    assert.equal(loadConfig({ DTQ_QUEUE: 'q', DTQ_TLS: v }).tls, true, v);
  }
  for (const v of ['', '0', 'false', 'off']) {
    assert.equal(loadConfig({ DTQ_QUEUE: 'q', DTQ_TLS: v }).tls, false, v);
  }
  assert.equal(loadConfig({ DTQ_QUEUE: 'q', DTQ_TLS_CA: '/etc/dtq/ca.pem' }).tls, true);
});

test('backoff: grows to the cap, stays within [d/2, d], resets', () => {
  const b = new Backoff(100, 1000, () => 0.999999);
  const delays = Array.from({ length: 6 }, () => b.next());
  assert.deepEqual(delays, [100, 200, 400, 800, 1000, 1000]);
  const low = new Backoff(100, 1000, () => 0);
  assert.deepEqual([low.next(), low.next()], [50, 100]);
  b.reset();
  assert.equal(b.next(), 100);
});

test('payload: JSON decoded for JSON media types, bytes otherwise', () => {
  const json = { payload: Buffer.from('{"a":1}'), content_type: '' };
  assert.deepEqual(decodePayload(json), { a: 1 });
  assert.equal(decodePayload({ payload: Buffer.alloc(0), content_type: 'application/json' }), null);
  const raw = Buffer.from([0, 255]);
  assert.equal(decodePayload({ payload: raw, content_type: 'application/octet-stream' }), raw);
  assert.ok(isJson('application/vnd.x+json; charset=utf-8'));
  assert.throws(() => decodePayload({ payload: Buffer.from('{'), content_type: '' }),
    (err) => err.name === 'PayloadError' && err.retryable === false);
});

test('result: bytes as-is, values JSON-encoded', () => {
  assert.deepEqual(encodeResult(Buffer.from('x')), Buffer.from('x'));
  assert.equal(encodeResult({ a: 'é' }).toString(), '{"a":"é"}');
  assert.equal(encodeResult(undefined).length, 0);
});

test('errors: retryable, permanent, retry-after', () => {
  assert.deepEqual(describeError(new TypeError('t')),
    { error_class: 'TypeError', error_message: 't', retryable: true, retry_after_ms: 0 });
  assert.equal(describeError(new PermanentError('p')).retryable, false);
  assert.equal(describeError(new RetryError('r', 1500)).retry_after_ms, 1500);
  assert.equal(describeError(Object.assign(new Error('x'), { code: 'ENOENT' })).error_class,
    'FileNotFoundError');
});

test('demo: lines and top words follow the Python demo rules', () => {
  assert.equal(demo.countLines(''), 0);
  assert.equal(demo.countLines('a\nb'), 2);
  assert.equal(demo.countLines('a\nb\n'), 2);
  assert.equal(demo.countLines('a\r\n\u2028b'), 2);
  assert.deepEqual(demo.topWords(['b', 'a', 'a', 'b', 'c'], 2), [['b', 2], ['a', 2]]);
});

test('demo: file.stats result', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'dtq-node-'));
  const file = path.join(dir, 'f.txt');
  fs.writeFileSync(file, Buffer.concat([Buffer.from('Foo foo_1 bar\n\xff'), Buffer.from([0xff])]));
  const r = await demo.handlers['file.stats']({ path: file });
  assert.equal(r.lines, 2);
  assert.equal(r.words, 3);
  assert.equal(r.worker_lang, 'node');
  assert.deepEqual(r.top_words, [['foo', 1], ['foo_1', 1], ['bar', 1]]);
  assert.match(r.sha256, /^[0-9a-f]{64}$/);
  fs.rmSync(dir, { recursive: true });
});

test('demo: flaky fails retryably until fail_attempts, corrupt is permanent', async () => {
  const flaky = demo.handlers['file.flaky'];
  await assert.rejects(flaky({ path: '/nope', fail_attempts: 1 }, { attempt: 1 }),
    (err) => err.name === 'FlakyError' && err.retryable);
  await assert.rejects(demo.handlers['file.corrupt']({ path: 'x' }, {}),
    (err) => err.retryable === false);
});

test('conf.sleep stops when the signal aborts', async () => {
  const controller = new AbortController();
  const started = Date.now();
  const run = conf.handlers['conf.sleep']({ ms: 10000 }, { signal: controller.signal });
  setTimeout(() => controller.abort('cancelled'), 20);
  await assert.rejects(run, (reason) => reason === 'cancelled');
  assert.ok(Date.now() - started < 1000);
});

test('conf.fail honours retryable and message', async () => {
  await assert.rejects(conf.handlers['conf.fail']({ retryable: false, message: 'm' }),
    (err) => err.retryable === false && err.message === 'm');
  await assert.rejects(conf.handlers['conf.fail']({ message: 'n' }), (err) => err.retryable === true);
});

test('conf.echo returns the payload bytes', async () => {
  const bytes = Buffer.from([1, 2, 3]);
  assert.equal(await conf.handlers['conf.echo'](null, { payloadBytes: bytes }), bytes);
});

test('errors: error text is cut by UTF-8 bytes at a character boundary', () => {
  assert.equal(cutUtf8('abcd', 3), 'abc');
  assert.equal(cutUtf8('ééé', 5), 'éé');
  assert.equal(cutUtf8('a€', 3), 'a');
  assert.equal(cutUtf8('😀x', 4), '😀');
  const item = describeError(new Error('é'.repeat(3000)));
  assert.equal(Buffer.byteLength(item.error_message), 4096);
});

test('rpc: channel keepalive and a reconnect backoff capped by DTQ_RECONNECT_MAX_MS', () => {
  const { channelOptions } = require('../src/rpc');
  const opts = channelOptions(loadConfig({ DTQ_QUEUE: 'q', DTQ_RECONNECT_MAX_MS: '3000' }));
  assert.equal(opts['grpc.max_reconnect_backoff_ms'], 3000);
  assert.equal(opts['grpc.initial_reconnect_backoff_ms'], 200);
  assert.equal(opts['grpc.keepalive_time_ms'], 10000);
  assert.equal(opts['grpc.keepalive_permit_without_calls'], 1);
});

test('ctx.progress clamps, cuts the message to 256 bytes and hands the report over', () => {
  const { makeContext } = require('../src/task');
  const reports = [];
  const task = { task_id: 't', traceparent: '00-' + 'a'.repeat(32) + '-' + 'b'.repeat(16) + '-01' };
  const ctx = makeContext(task, 'w', new AbortController().signal, (r) => reports.push(r));
  ctx.progress(140, 'é'.repeat(200));
  ctx.progress(-3);
  assert.equal(reports[0].percent, 100);
  assert.equal(Buffer.byteLength(reports[0].message, 'utf8'), 256);
  assert.deepEqual(reports[1], { percent: 0, message: '' });
  assert.throws(() => ctx.progress('x'), TypeError);
  assert.equal(ctx.traceparent, task.traceparent);
});

test('session: finish() does not wait for a call that never got its SessionInfo', async () => {
  const { EventEmitter } = require('node:events');
  const { LeaseSession } = require('../src/session');
  const call = Object.assign(new EventEmitter(), { cancel() {} }); // waits for its gateway
  const md = { setOptions() {} };
  const session = new LeaseSession(
    { config: loadConfig({ DTQ_QUEUE: 'q' }), broker: { Lease: () => call }, metadata: () => md },
    { onSession() {}, onTask() {}, onFatal() {} });
  session.once();
  assert.equal(await session.finish(60000), true); // at once, not after the 60 s bound
  session.onMessage({ kind: 'session', session: {} });
  assert.equal(await session.finish(10), false); // a live stream is waited for (bounded)
  session.close();
});

test('session: asks for cancel notices and hands their lease ids to onCancelled', () => {
  const { LeaseSession } = require('../src/session');
  const cancelled = [];
  const session = new LeaseSession(
    { config: loadConfig({ DTQ_QUEUE: 'q' }), broker: {}, metadata: () => ({}) },
    { onSession() {}, onTasks() {}, onCancelled: (ids) => cancelled.push(...ids), onFatal() {} });
  assert.equal(session.request().accept_cancel_notices, true);
  session.onMessage({ kind: 'cancelled', cancelled: { lease_ids: ['l1', 'l2'] } });
  assert.deepEqual(cancelled, ['l1', 'l2']);
});
