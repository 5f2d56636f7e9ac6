'use strict';
/**
 * Conformance task types (docs/protocol.md, "Conformance task types").
 * Every worker that runs tests/conformance implements these three.
 */
const { TaskError } = require('../errors');

/** Resolve after `ms` ms; reject with the signal's reason when it aborts first. */
function abortableSleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    function onAbort() {
      clearTimeout(timer);
      reject(signal.reason);
    }
    signal.addEventListener('abort', onAbort, { once: true });
  });
}

/** conf.echo: the result is the payload bytes, unchanged. */
async function echo(_payload, ctx) {
  return ctx.payloadBytes;
}

/** conf.sleep: payload {"ms": N}; sleeps N ms, stops early when cancelled. */
async function sleepTask(payload, ctx) {
  const ms = Number(payload?.ms ?? 0);
  if (!Number.isFinite(ms) || ms < 0) {
    throw new TaskError('payload.ms must be a number >= 0', { retryable: false, errorClass: 'ValueError' });
  }
  ctx.progress?.(0, 'sleeping'); // optional protocol feature: sent on an early heartbeat
  await abortableSleep(ms, ctx.signal);
  return { slept_ms: ms };
}

/** conf.fail: payload {"retryable": bool, "message": str}; always fails. */
async function fail(payload) {
  const retryable = payload?.retryable !== false;
  throw new TaskError(String(payload?.message ?? 'conf.fail'), { retryable, errorClass: 'ConfFailure' });
}

module.exports = {
  handlers: { 'conf.echo': echo, 'conf.sleep': sleepTask, 'conf.fail': fail },
  abortableSleep,
};
