'use strict';
/**
 * A handler process of the process pool (src/procpool.js): runs one handler at a time
 * for the worker that forked it, over the IPC channel (structured clone).
 *
 * argv[2] is the path of the handler registry (a module exporting `{ handlers }`).
 * Messages in: `{ run: task, payload }` (task: the LeasedTask fields), `{ cancel: leaseId }`.
 * Messages out: `{ id, progress: {percent, message} }`, `{ id, done: true, value }` (the
 * encoded result bytes) or `{ id, done: true, error }` (FailItem fields of the error).
 */
const { describeError } = require('./errors');
const { encodeResult, makeContext } = require('./task');

const { handlers } = require(process.argv[2]);
let current = null; // { id, controller } of the running handler

function asBuffer(value) {
  return value instanceof Uint8Array && !Buffer.isBuffer(value)
    ? Buffer.from(value.buffer, value.byteOffset, value.byteLength) : value;
}

async function run({ run: task, payload, workerId }) {
  const id = task.lease_id;
  const controller = new AbortController();
  current = { id, controller };
  task.payload = asBuffer(task.payload);
  const ctx = makeContext(task, workerId, controller.signal,
    (progress) => process.send({ id, progress }));
  let reply;
  try {
    const value = await handlers[task.task_type](asBuffer(payload), ctx);
    reply = { id, done: true, value: encodeResult(value) };
  } catch (err) {
    reply = { id, done: true, error: describeError(err) };
  } finally {
    current = null;
  }
  process.send(reply);
}

process.on('message', (msg) => {
  if (msg.cancel !== undefined) {
    if (current && current.id === msg.cancel) current.controller.abort('cancelled');
    return;
  }
  run(msg);
});
process.on('disconnect', () => process.exit(0)); // the worker is gone or closed the pool
// A terminal's SIGINT, or a SIGTERM sent to the whole process group, reaches the
// children too: the worker drains, lets running handlers finish within its grace and
// stops the children itself.
process.on('SIGINT', () => {});
process.on('SIGTERM', () => {});
