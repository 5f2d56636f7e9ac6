'use strict';
/**
 * Batch handlers: leases of one task type gathered into one handler call.
 *
 * A task type whose handler is `batch(fn, { maxSize, maxWaitMs })` gathers its leases
 * until `maxSize` are held or `maxWaitMs` passed since the first; the batch then waits
 * for one of the worker's `concurrency` slots and calls `fn(payloads, ctxs)` once
 * (same order). Each task stays its own lease: heartbeated while it gathers and runs,
 * acked or failed on its own (its own retries).
 */
const { decodePayload, makeContext } = require('./task');

const BATCH = Symbol.for('dtq.batchHandler');
const MAX_BATCH_SIZE = 10000;
const MAX_BATCH_WAIT_MS = 60000;
const ALL_ABORTED = Symbol('all items aborted');

/**
 * Mark `fn(payloads, ctxs)` as a batch handler (export it in `handlers` under its
 * task type). `fn` returns (or resolves to) undefined (every task succeeds with an
 * empty result) or an array of one result per task, in order, where an Error fails
 * that task alone as if its own handler had thrown it; a throw fails every task.
 *
 * @param {Function} fn the handler
 * @param {{maxSize?: number, maxWaitMs?: number}} options maxSize: most tasks per
 *   call, an integer 1..10000 (default 100); maxWaitMs: longest a batch waits for more
 *   tasks after its first, in ms, 0..60000 (default 50)
 * @returns {object} the handler entry
 * @throws {TypeError} fn is not a function
 * @throws {RangeError} naming maxSize or maxWaitMs when out of range
 */
function batch(fn, { maxSize = 100, maxWaitMs = 50 } = {}) {
  if (typeof fn !== 'function') throw new TypeError('batch: fn must be a function');
  if (!Number.isInteger(maxSize) || maxSize < 1 || maxSize > MAX_BATCH_SIZE) {
    throw new RangeError(`maxSize: an integer in 1..${MAX_BATCH_SIZE}, got ${maxSize}`);
  }
  if (typeof maxWaitMs !== 'number' || !(maxWaitMs >= 0 && maxWaitMs <= MAX_BATCH_WAIT_MS)) {
    throw new RangeError(`maxWaitMs: a number of ms in 0..${MAX_BATCH_WAIT_MS}, got ${maxWaitMs}`);
  }
  return Object.freeze({ [BATCH]: true, fn, maxSize, maxWaitMs });
}

/** True for an entry made by batch(). */
function isBatch(handler) {
  return Boolean(handler && handler[BATCH]);
}

/** What a task reports from a batch handler's return value (one outcome per task). */
function mapResults(value, n) {
  if (value === undefined) return Array.from({ length: n }, () => ({ ok: true, value: undefined }));
  if (!Array.isArray(value) || value.length !== n) {
    const got = Array.isArray(value) ? `${value.length} results` : `a ${typeof value}`;
    const err = Object.assign(new Error(
      `batch handler returned ${got} for ${n} tasks (want an array, same order)`),
    { name: 'BatchResultError', retryable: false });
    return Array.from({ length: n }, () => ({ error: err }));
  }
  return value.map((v) => (v instanceof Error ? { error: v } : { ok: true, value: v }));
}

/** Gathers, queues and runs the batches of one worker (see the module comment). */
class Batcher {
  /**
   * @param {object} worker the Worker (its running map, pump(), finish(), stats)
   * @param {object} abort the Worker's ABORT reasons
   */
  constructor(worker, abort) {
    this.worker = worker;
    this.abort = abort;
    this.gathering = new Map(); // task type -> batch still taking leases
    this.ready = []; // closed batches waiting for a slot, oldest first
    this.seq = 0;
  }

  add(lease, spec) {
    const type = lease.task.task_type;
    let b = this.gathering.get(type);
    if (!b) {
      b = { type, spec, leases: [], timer: null, key: '', controller: null };
      b.timer = setTimeout(() => this.close(b), spec.maxWaitMs);
      this.gathering.set(type, b);
    }
    lease.phase = 'gathering';
    lease.batch = b;
    b.leases.push(lease);
    if (b.leases.length >= spec.maxSize) this.close(b);
  }

  close(b) {
    if (this.gathering.get(b.type) !== b) return; // taken by a drain meanwhile
    this.gathering.delete(b.type);
    clearTimeout(b.timer);
    if (b.leases.length > 0) {
      this.ready.push(b);
      this.worker.pump();
    }
  }

  /** Take a gathering or waiting lease out of its batch (lost, cancelled): true if it was. */
  remove(lease) {
    if (lease.phase !== 'gathering') return false;
    lease.batch.leases = lease.batch.leases.filter((l) => l !== lease);
    return true;
  }

  /** Every lease of a batch not started yet; the batches are forgotten (drain). */
  takeWaiting() {
    const out = [];
    for (const b of [...this.gathering.values(), ...this.ready]) {
      clearTimeout(b.timer);
      out.push(...b.leases);
    }
    this.gathering.clear();
    this.ready = [];
    return out;
  }

  /** Run batch `b` in one slot, under the smallest timeout_ms of its tasks; report each. */
  async run(b) {
    const w = this.worker;
    b.key = `batch-${++this.seq}`;
    // abort(reason) stops every item: the drain grace is over, or a fatal status
    b.controller = { abort: (reason) => b.leases.forEach((l) => l.controller.abort(reason)) };
    for (const lease of b.leases) {
      lease.phase = 'running';
      lease.controller = new AbortController();
    }
    w.running.set(b.key, b);
    const limits = b.leases.map((l) => l.task.timeout_ms).filter((ms) => ms > 0);
    const timeoutMs = limits.length ? Math.min(...limits) : 0;
    const timer = timeoutMs > 0 ? setTimeout(() => b.controller.abort(this.abort.TIMEOUT), timeoutMs) : null;
    let outcomes;
    try {
      outcomes = await this.execute(b, timeoutMs);
    } finally {
      if (timer) clearTimeout(timer);
      w.running.delete(b.key);
      w.pump();
    }
    await Promise.all(b.leases.map((lease, i) => outcomes[i] && w.finish(lease, outcomes[i])));
  }

  /** Outcome per lease (null: already reported at its cancel or loss). */
  async execute(b, timeoutMs) {
    const w = this.worker;
    const outcomes = b.leases.map(() => null);
    const live = [];
    const payloads = [];
    const ctxs = [];
    b.leases.forEach((lease, i) => {
      try {
        payloads.push(decodePayload(lease.task));
      } catch (err) {
        outcomes[i] = { error: err };
        return;
      }
      live.push(i);
      ctxs.push(makeContext(lease.task, w.config.workerId, lease.controller.signal, (report) => {
        lease.progress = report;
        w.armProgress();
      }));
    });
    if (live.length === 0) return outcomes;
    const allAborted = Promise.all(live.map((i) => this.settleOnAbort(b.leases[i])));
    let value;
    let thrown = null;
    try {
      value = await Promise.race([Promise.resolve().then(() => b.spec.fn(payloads, ctxs)),
        allAborted.then(() => ALL_ABORTED)]);
    } catch (err) {
      thrown = { error: err };
    }
    const results = thrown || value === ALL_ABORTED ? null : mapResults(value, live.length);
    live.forEach((i, k) => {
      const lease = b.leases[i];
      const { signal } = lease.controller;
      if (lease.settled) return;
      if (signal.aborted && signal.reason === this.abort.TIMEOUT) {
        w.stats.timeouts += 1;
        outcomes[i] = { error: Object.assign(new Error(`batch handler exceeded timeout_ms=${timeoutMs} `
          + `(the smallest of its ${live.length} tasks)`), { name: 'Timeout' }) };
      } else if (signal.aborted) outcomes[i] = { aborted: signal.reason };
      else outcomes[i] = thrown || results[k];
    });
    return outcomes;
  }

  /** Resolves when `lease` is aborted; a cancelled or lost item is reported at once. */
  settleOnAbort(lease) {
    const { signal } = lease.controller;
    return new Promise((resolve) => {
      const onAbort = () => {
        if (signal.reason === this.abort.CANCELLED || signal.reason === this.abort.LOST) {
          lease.settled = true;
          this.worker.finish(lease, { aborted: signal.reason });
        }
        resolve();
      };
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
  }
}

/** Tasks a worker can run at once (its LeaseRequest's concurrency): the slots plus
 * maxSize - 1 per batch handler, so the gateway's unread window lets a batch fill. */
function leaseConcurrency(concurrency, handlers) {
  return concurrency + Object.values(handlers).filter(isBatch)
    .reduce((sum, h) => sum + h.maxSize - 1, 0);
}

module.exports = { batch, isBatch, Batcher, leaseConcurrency, mapResults };
