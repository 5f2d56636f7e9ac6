'use strict';
/** Payload decoding, result encoding and the handler context. */

/** True for JSON media types ("" counts as the default, application/json). */
function isJson(contentType) {
  const base = (contentType || 'application/json').split(';')[0].trim().toLowerCase();
  return base === 'application/json' || base.endsWith('+json');
}

/**
 * Payload as the handler sees it: parsed JSON for JSON media types (null when
 * empty), else the raw bytes.
 */
function decodePayload(task) {
  if (!isJson(task.content_type)) return task.payload;
  if (task.payload.length === 0) return null;
  try {
    return JSON.parse(task.payload.toString('utf8'));
  } catch (err) {
    throw Object.assign(new Error(`payload is not valid JSON: ${err.message}`),
      { name: 'PayloadError', retryable: false });
  }
}

/** Result bytes: Buffers/Uint8Arrays as-is, undefined as empty, anything else JSON. */
function encodeResult(value) {
  if (value === undefined) return Buffer.alloc(0);
  if (Buffer.isBuffer(value)) return value;
  if (value instanceof Uint8Array) return Buffer.from(value);
  return Buffer.from(JSON.stringify(value), 'utf8');
}

/** Longest progress message the gateway stores, in bytes of UTF-8. */
const MAX_PROGRESS_MESSAGE_BYTES = 256;

/**
 * The handler's view of its task. `onProgress({percent, message})` receives each
 * `ctx.progress(percent, message)` call (the worker keeps the latest for the next
 * heartbeat).
 */
function makeContext(task, workerId, signal, onProgress = () => {}) {
  return Object.freeze({
    taskId: task.task_id,
    queue: task.queue,
    taskType: task.task_type,
    attempt: task.attempt,
    maxAttempts: task.max_attempts,
    timeoutMs: task.timeout_ms,
    metadata: task.metadata,
    priority: task.priority,
    leaseId: task.lease_id,
    workerId,
    contentType: task.content_type,
    payloadBytes: task.payload,
    signal,
    traceparent: task.traceparent || '',
    tracestate: task.tracestate || '',
    /**
     * Report progress: percent 0..100 (clamped), a short message. Rides on the next
     * heartbeat (the latest report per interval wins).
     */
    progress(percent, message = '') {
      const value = Number(percent);
      if (Number.isNaN(value)) throw new TypeError('progress percent must be a number');
      let text = String(message);
      while (Buffer.byteLength(text, 'utf8') > MAX_PROGRESS_MESSAGE_BYTES) text = text.slice(0, -1);
      onProgress({ percent: Math.min(100, Math.max(0, value)), message: text });
    },
  });
}

module.exports = { isJson, decodePayload, encodeResult, makeContext };
