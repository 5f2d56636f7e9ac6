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

/** The handler's view of its task. */
function makeContext(task, workerId, signal) {
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
  });
}

module.exports = { isJson, decodePayload, encodeResult, makeContext };
