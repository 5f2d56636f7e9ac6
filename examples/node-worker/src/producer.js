'use strict';
/**
 * Producer: enqueue tasks, read them back and wait for their outcome from Node.
 *
 *   const { Producer } = require('dtq-node-worker');
 *   const producer = new Producer();                 // DTQ_GATEWAY, DTQ_TOKEN, DTQ_TLS...
 *   const { taskId } = await producer.enqueue('emails', 'email.send', { to: 'ada' });
 *   const task = await producer.wait(taskId, { timeoutMs: 30000 });
 *   console.log(task.status, task.result);            // 'SUCCEEDED' { sent: true }
 *   producer.close();
 *
 * Tasks are plain objects with camelCase names: `status` is the short status name
 * ('QUEUED', 'SUCCEEDED', 'DEAD_LETTERED'...), `payload` and `result` are decoded
 * JSON where they are JSON (else Buffers), times are Date objects (null when unset),
 * and `raw` is the GetTask record as received. A refused call rejects with the
 * grpc-js ServiceError (`code`, `details`).
 */
const path = require('node:path');
const grpc = require('@grpc/grpc-js');

const { loadDtq, unary } = require('./rpc');
const { isJson } = require('./task');

const TERMINAL = new Set(['SUCCEEDED', 'DEAD_LETTERED', 'CANCELLED', 'EXPIRED']);
const POLL_FIRST_MS = 20;
const POLL_MAX_MS = 500;

/** Base of the errors `wait` rejects with for a task that ended without succeeding. */
class TaskNotSucceeded extends Error {
  constructor(task) {
    const detail = task.error ? `: ${task.errorClass || 'error'}: ${task.error}` : '';
    super(`task ${task.taskId} ${task.status.toLowerCase()}${detail}`);
    this.name = new.target.name;
    this.task = task;
    this.taskId = task.taskId;
    this.status = task.status;
    this.error = task.error;
    this.errorClass = task.errorClass;
  }
}
/** The task was dead-lettered (out of attempts, or a permanent failure). */
class TaskFailed extends TaskNotSucceeded {}
/** The task was cancelled. */
class TaskCancelled extends TaskNotSucceeded {}
/** The task expired before a worker started it. */
class TaskExpired extends TaskNotSucceeded {}
/** The task had not ended when the wait timed out; `task` is the last read. */
class TaskWaitTimeout extends Error {
  constructor(task, timeoutMs) {
    super(`task ${task.taskId} still ${task.status} after ${timeoutMs} ms`);
    this.name = 'TaskWaitTimeout';
    this.task = task;
  }
}
const FAILURES = { DEAD_LETTERED: TaskFailed, CANCELLED: TaskCancelled, EXPIRED: TaskExpired };

/** Date of epoch ms, null for 0 (unset). */
function toDate(ms) {
  return ms ? new Date(Number(ms)) : null;
}

/** Decoded JSON when `bytes` parse as JSON of a JSON media type, null when empty, else the Buffer. */
function decodeBytes(bytes, contentType, truncated = false) {
  if (!bytes || bytes.length === 0) return null;
  if (truncated || !isJson(contentType)) return bytes;
  try {
    return JSON.parse(bytes.toString('utf8'));
  } catch {
    return bytes;
  }
}

/**
 * A GetTask record as a producer reads it.
 *
 * @param {object} t dtq.v1.Task as decoded by proto-loader (snake_case)
 * @returns {object} the task with camelCase names, decoded payload/result and Dates
 */
function toTask(t) {
  return {
    taskId: t.task_id,
    queue: t.queue,
    taskType: t.task_type,
    status: t.status.replace(/^TASK_STATUS_/, ''),
    payload: decodeBytes(t.payload, t.content_type),
    contentType: t.content_type,
    // results carry no media type: the reference workers store JSON for non-bytes
    result: decodeBytes(t.result, 'application/json', t.result_truncated),
    resultTruncated: t.result_truncated,
    priority: t.priority,
    attempt: t.attempt,
    maxAttempts: t.max_attempts,
    timeoutMs: t.timeout_ms,
    attempts: t.attempts.map((a) => ({
      attempt: a.attempt,
      workerId: a.worker_id,
      startedAt: toDate(a.started_at_ms),
      finishedAt: toDate(a.finished_at_ms),
      outcome: a.outcome,
      errorMessage: a.error_message,
      errorClass: a.error_class,
    })),
    error: t.last_error,
    errorClass: t.last_error_class,
    workerId: t.worker_id,
    idempotencyKey: t.idempotency_key,
    metadata: { ...t.metadata },
    cancelRequested: t.cancel_requested,
    createdAt: toDate(t.created_at_ms),
    updatedAt: toDate(t.updated_at_ms),
    startedAt: toDate(t.started_at_ms),
    finishedAt: toDate(t.finished_at_ms),
    notBefore: toDate(t.not_before_ms),
    expiresAt: toDate(t.expires_at_ms),
    dueAt: toDate(t.due_at_ms),
    raw: t,
  };
}

/** EnqueueRequest fields for `enqueue` options (camelCase, durations in ms). */
const OPTION_FIELDS = {
  priority: 'priority',
  maxAttempts: 'max_attempts',
  timeoutMs: 'timeout_ms',
  idempotencyKey: 'idempotency_key',
  delayMs: 'delay_ms',
  notBeforeMs: 'not_before_ms',
  expiresAtMs: 'expires_at_ms',
  ttlMs: 'ttl_ms',
  metadata: 'metadata',
  retryPolicy: 'retry_policy',
  debounce: 'debounce',
};

/** Debounce modes by the names `enqueue` takes (docs/handlers.md, "Debounce"). */
const DEBOUNCE_MODES = { keep_first: 'DEBOUNCE_MODE_KEEP_FIRST', keep_last: 'DEBOUNCE_MODE_KEEP_LAST' };

/**
 * Build an EnqueueRequest.
 *
 * @param {string} queue queue name
 * @param {string} taskType handler name
 * @param {*} payload Buffer/Uint8Array sent as-is (application/octet-stream), else JSON
 * @param {object} options see Producer.enqueue
 * @returns {object} the request object
 */
function enqueueRequest(queue, taskType, payload, options = {}) {
  const binary = Buffer.isBuffer(payload) || payload instanceof Uint8Array;
  const req = {
    queue,
    task_type: taskType,
    payload: binary ? Buffer.from(payload) : Buffer.from(payload === undefined ? '' : JSON.stringify(payload), 'utf8'),
    content_type: options.contentType || (binary ? 'application/octet-stream' : 'application/json'),
  };
  for (const [name, value] of Object.entries(options)) {
    if (name === 'contentType' || value === undefined || value === null) continue;
    const field = OPTION_FIELDS[name];
    if (!field) throw new TypeError(`unknown enqueue option: ${name}`);
    if (name === 'retryPolicy') {
      req.retry_policy = { backoff_base_ms: value.backoffBaseMs || 0, backoff_cap_ms: value.backoffCapMs || 0 };
    } else if (name === 'debounce') {
      const mode = DEBOUNCE_MODES[value.mode];
      if (!mode) throw new TypeError(`debounce.mode: keep_first or keep_last (got ${value.mode})`);
      req.debounce = { key: value.key, window_ms: value.windowMs || 0, mode,
        max_delay_ms: value.maxDelayMs || 0 };
    } else if (name === 'metadata') {
      req.metadata = Object.fromEntries(Object.entries(value).map(([k, v]) => [k, String(v)]));
    } else {
      req[field] = value;
    }
  }
  return req;
}

class Producer {
  /**
   * @param {object} [options]
   * @param {string} [options.gateway] host:port (default DTQ_GATEWAY or 127.0.0.1:50051)
   * @param {string} [options.token] bearer token (default DTQ_TOKEN)
   * @param {boolean} [options.tls] use TLS (default DTQ_TLS, or on with a CA)
   * @param {string} [options.tlsCa] CA bundle PEM path (default DTQ_TLS_CA)
   * @param {string} [options.protoPath] dtq.proto (default DTQ_PROTO or the repository's)
   * @param {number} [options.deadlineMs] deadline of each call, ms (default 10000)
   */
  constructor(options = {}) {
    const env = process.env;
    this.gateway = options.gateway || (env.DTQ_GATEWAY || '').trim() || '127.0.0.1:50051';
    this.token = options.token !== undefined ? options.token : (env.DTQ_TOKEN || '').trim();
    const tlsCa = options.tlsCa !== undefined ? options.tlsCa : (env.DTQ_TLS_CA || '').trim();
    const tls = options.tls !== undefined ? options.tls
      : ['1', 'true', 'yes', 'on'].includes((env.DTQ_TLS || '').trim().toLowerCase()) || Boolean(tlsCa);
    this.deadlineMs = options.deadlineMs || 10000;
    const protoPath = options.protoPath || env.DTQ_PROTO
      || path.join(__dirname, '..', '..', '..', 'proto', 'dtq.proto');
    const dtq = loadDtq(protoPath);
    const creds = tls
      ? grpc.credentials.createSsl(tlsCa ? require('node:fs').readFileSync(tlsCa) : null)
      : grpc.credentials.createInsecure();
    this.broker = new dtq.Broker(this.gateway, creds, { 'grpc.primary_user_agent': 'dtq-node-producer/0.1.0' });
  }

  _metadata() {
    const md = new grpc.Metadata();
    if (this.token) md.set('authorization', `Bearer ${this.token}`);
    return md;
  }

  _call(method, request) {
    return unary(this.broker, method, request, this._metadata(), this.deadlineMs);
  }

  /**
   * Enqueue one task.
   *
   * @param {string} queue queue name
   * @param {string} taskType handler name
   * @param {*} [payload] JSON-encodable value, or a Buffer sent as-is
   * @param {object} [options] priority (0..9), delayMs, idempotencyKey, maxAttempts,
   *   timeoutMs, ttlMs, notBeforeMs, expiresAtMs, metadata, retryPolicy
   *   ({backoffBaseMs, backoffCapMs}), contentType, debounce ({key, windowMs, mode:
   *   'keep_first' | 'keep_last', maxDelayMs}: one task for a burst, docs/handlers.md)
   * @returns {Promise<{taskId: string, deduplicated: boolean, debounced: boolean, status: string}>}
   */
  async enqueue(queue, taskType, payload, options = {}) {
    const resp = await this._call('Enqueue', enqueueRequest(queue, taskType, payload, options));
    return { taskId: resp.task_id, deduplicated: resp.deduplicated, debounced: resp.debounced,
      status: resp.status.replace(/^TASK_STATUS_/, '') };
  }

  /**
   * Read a task (rejects with code NOT_FOUND (5) for an unknown one).
   *
   * @param {string} taskId task id
   * @returns {Promise<object>} the task (see the module comment)
   */
  async get(taskId) {
    return toTask((await this._call('GetTask', { task_id: taskId })).task);
  }

  /**
   * Poll until the task ends (20 ms growing to 500 ms apart).
   *
   * @param {string} taskId task id
   * @param {{timeoutMs?: number, raiseOnFailure?: boolean}} [options] timeoutMs (30000);
   *   raiseOnFailure false resolves with any terminal task
   * @returns {Promise<object>} the SUCCEEDED task
   * @throws {TaskFailed|TaskCancelled|TaskExpired} the task ended otherwise
   * @throws {TaskWaitTimeout} not ended within timeoutMs
   */
  async wait(taskId, { timeoutMs = 30000, raiseOnFailure = true } = {}) {
    const deadline = Date.now() + timeoutMs;
    let delay = POLL_FIRST_MS;
    for (;;) {
      const task = await this.get(taskId);
      if (TERMINAL.has(task.status)) {
        const Failure = FAILURES[task.status];
        if (raiseOnFailure && Failure) throw new Failure(task);
        return task;
      }
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new TaskWaitTimeout(task, timeoutMs);
      await new Promise((resolve) => { setTimeout(resolve, Math.min(delay, remaining)); });
      delay = Math.min(POLL_MAX_MS, delay * 1.5);
    }
  }

  /**
   * Cancel a queued, scheduled or running task.
   *
   * @param {string} taskId task id
   * @param {string} [reason] recorded in the audit stream
   * @returns {Promise<{status: string, cancelRequested: boolean, requestId: string}>}
   */
  async cancel(taskId, reason = '') {
    const resp = await this._call('CancelTask', { task_id: taskId, reason });
    return { status: resp.status.replace(/^TASK_STATUS_/, ''), cancelRequested: resp.cancel_requested,
      requestId: resp.request_id };
  }

  /** Close the channel. */
  close() {
    this.broker.close();
  }
}

module.exports = {
  Producer, TaskNotSucceeded, TaskFailed, TaskCancelled, TaskExpired, TaskWaitTimeout,
  enqueueRequest, toTask,
};
