'use strict';
/**
 * The worker: holds leases, runs handlers within the concurrency limit,
 * heartbeats every held lease, reports through the batching Reporter, and
 * drains on stop().
 *
 * A lease is "held" from the moment its LeasedTask arrives until the gateway
 * answered its Ack/Fail (or declared it lost before a result existed). Every held
 * lease, buffered, running or being reported, is listed in each Heartbeat.
 */
const log = require('./log');
const { LeaseSession } = require('./session');
const { Reporter } = require('./reporter');
const { unary } = require('./rpc');
const { FATAL, codeName } = require('./codes');
const { describeError } = require('./errors');
const { decodePayload, encodeResult, makeContext } = require('./task');
const { ProcessPool } = require('./procpool');
const { Batcher, isBatch, leaseConcurrency } = require('./batch');

const ABORT = Object.freeze({ TIMEOUT: 'timeout', CANCELLED: 'cancelled', LOST: 'lost', DRAIN: 'drain' });
const DEFAULT_HEARTBEAT_MS = 10000;
/** A progress report goes out on an early heartbeat this long after the previous one. */
const PROGRESS_DELAY_MS = 1000;
const REPORT_DRAIN_MS = 15000;
/** Shortest wait for the Lease stream to end after the draining heartbeat, in ms. */
const DRAIN_STREAM_MIN_MS = 2000;

/**
 * Whether a failure's answer means the task is retried: SCHEDULED or QUEUED after it,
 * or, for a duplicate answer (a resend of a Fail the gateway had applied, which gives
 * the task's status now), ACTIVE too: the retry was already leased again.
 */
function retriedAfter(res) {
  return res.status === 'TASK_STATUS_SCHEDULED' || res.status === 'TASK_STATUS_QUEUED'
    || (res.duplicate === true && res.status === 'TASK_STATUS_ACTIVE');
}

class Worker {
  /**
   * @param {object} config from loadConfig()
   * @param {{broker: object, metadata: () => object, handlers: object, handlersPath?: string}} deps
   *   handlersPath: with DTQ_POOL=process, the module (exporting `{ handlers }`) the
   *   children load; default src/handlers
   */
  constructor(config, { broker, metadata, handlers, handlersPath }) {
    this.config = config;
    this.broker = broker;
    this.metadata = metadata;
    this.handlers = handlers;
    this.state = 'running';
    this.held = new Map();
    this.buffer = [];
    this.running = new Map();
    this.heartbeatMs = DEFAULT_HEARTBEAT_MS;
    this.heartbeatTimer = null;
    this.progressTimer = null;
    this.lastProgressAt = 0;
    this.heartbeatBusy = false;
    this.stats = { processed: 0, failed: 0, retried: 0, released: 0, cancelled: 0, lost: 0,
      timeouts: 0, stale: 0, by_type: {} };
    this.exitCode = 0;
    this.reporter = new Reporter(broker, metadata,
      { flushMs: config.ackFlushMs, onFatal: (err) => this.fatal(err) });
    const batchTypes = Object.keys(handlers).filter((type) => isBatch(handlers[type]));
    if (config.pool === 'process' && batchTypes.length > 0) {
      throw new Error(`batch task ${batchTypes[0]}: batch handlers are not supported with `
        + 'DTQ_POOL=process (use the default loop pool)');
    }
    this.batcher = new Batcher(this, ABORT);
    const sessionConfig = { ...config, leaseConcurrency: leaseConcurrency(config.concurrency, handlers) };
    this.session = new LeaseSession({ config: sessionConfig, broker, metadata }, {
      onSession: (info) => this.onSession(info),
      onTasks: (tasks) => this.onTasks(tasks),
      onCancelled: (ids) => ids.forEach((id) => this.onCancelled(id)),
      onFatal: (err) => this.fatal(err),
    });
    this.done = new Promise((resolve) => { this.resolveDone = resolve; });
    /** DTQ_POOL=process: handlers run in child processes (src/procpool.js). */
    this.processes = config.pool === 'process' ? new ProcessPool({ size: config.concurrency,
      handlersPath, cancelGraceMs: config.cancelGraceMs, workerId: config.workerId }) : null;
  }

  /** Run until drained or a fatal error; resolves with the exit code. */
  async run() {
    log.info('worker starting', { worker_id: this.config.workerId, gateway: this.config.gateway,
      queues: this.config.queues, concurrency: this.config.concurrency,
      max_in_flight: this.config.maxInFlight, pool: this.config.pool });
    if (this.processes) this.processes.start();
    this.session.run();
    return this.done;
  }

  onSession(info) {
    if (info.heartbeat_interval_ms > 0) this.heartbeatMs = info.heartbeat_interval_ms;
    if (!this.heartbeatBusy) this.armHeartbeat(this.heartbeatMs);
  }

  /** Hold the tasks of one stream message (in order), then start what free slots allow. */
  onTasks(tasks) {
    for (const task of tasks) {
      const lease = { task, id: task.lease_id, phase: 'buffered', controller: null };
      this.held.set(lease.id, lease);
      if (this.state !== 'running') {
        this.release(lease, 'worker draining'); // in transit when the drain began: never runs
        continue;
      }
      const handler = this.handlers[task.task_type];
      if (isBatch(handler)) this.batcher.add(lease, handler);
      else this.buffer.push(lease);
    }
    this.pump();
  }

  /** Start closed batches (each in one slot), then buffered tasks, while slots are free. */
  pump() {
    while (this.state === 'running' && this.running.size < this.config.concurrency) {
      if (this.batcher.ready.length > 0) this.batcher.run(this.batcher.ready.shift());
      else if (this.buffer.length > 0) this.start(this.buffer.shift());
      else break;
    }
  }

  async start(lease) {
    lease.phase = 'running';
    lease.controller = new AbortController();
    this.running.set(lease.id, lease);
    const timeoutMs = lease.task.timeout_ms;
    const timer = timeoutMs > 0
      ? setTimeout(() => lease.controller.abort(ABORT.TIMEOUT), timeoutMs) : null;
    let outcome;
    try {
      outcome = await this.execute(lease);
    } finally {
      if (timer) clearTimeout(timer);
      this.running.delete(lease.id);
      this.pump();
    }
    await this.finish(lease, outcome);
  }

  /** Run the handler; returns {ok, value} | {error} | {aborted: reason}. */
  async execute(lease) {
    const { task } = lease;
    const { signal } = lease.controller;
    const handler = this.handlers[task.task_type];
    if (!handler) {
      return { error: Object.assign(new Error(`no handler for task type ${task.task_type}`),
        { name: 'UnknownTaskType', retryable: false }) };
    }
    const aborted = new Promise((resolve) => {
      signal.addEventListener('abort', () => resolve(), { once: true });
    });
    try {
      const payload = decodePayload(task);
      const onProgress = (report) => {
        lease.progress = report; // sent by an early heartbeat, at most one per second
        this.armProgress();
      };
      if (this.processes) return await this.processes.run(task, payload, signal, onProgress);
      const ctx = makeContext(task, this.config.workerId, signal, onProgress);
      const value = await Promise.race([Promise.resolve().then(() => handler(payload, ctx)), aborted]);
      if (signal.aborted) return { aborted: signal.reason };
      return { ok: true, value };
    } catch (err) {
      if (signal.aborted) return { aborted: signal.reason };
      return { error: err };
    }
  }

  /** Report a finished execution and update the counters. */
  async finish(lease, outcome) {
    const { task } = lease;
    if (outcome.aborted === ABORT.LOST) return this.drop(lease);
    if (outcome.aborted === ABORT.DRAIN) return this.release(lease, 'drain grace period passed');
    if (outcome.aborted === ABORT.CANCELLED) return this.reportCancelled(lease);
    lease.phase = 'reporting';
    if (outcome.ok) {
      let result;
      try {
        result = encodeResult(outcome.value);
      } catch (err) {
        return this.reportFailure(lease, { error: err });
      }
      const res = await this.reporter.ack(lease.id, result);
      this.held.delete(lease.id);
      if (res.ok) {
        this.stats.processed += 1;
        this.stats.by_type[task.task_type] = (this.stats.by_type[task.task_type] || 0) + 1;
      } else if (res.stale) this.stats.stale += 1;
      return undefined;
    }
    if (outcome.aborted === ABORT.TIMEOUT) {
      this.stats.timeouts += 1;
      const err = Object.assign(new Error(`handler exceeded timeout_ms=${task.timeout_ms}`),
        { name: 'Timeout' });
      return this.reportFailure(lease, { error: err });
    }
    return this.reportFailure(lease, outcome);
  }

  async reportFailure(lease, { error }) {
    lease.phase = 'reporting';
    const item = { lease_id: lease.id, mode: 'FAIL_MODE_FAILURE', ...describeError(error) };
    log.info('task failed', { task_id: lease.task.task_id, attempt: lease.task.attempt,
      error_class: item.error_class, retryable: item.retryable });
    const res = await this.reporter.fail(item);
    this.held.delete(lease.id);
    if (res.ok) {
      this.stats.failed += 1;
      if (retriedAfter(res)) this.stats.retried += 1;
    } else if (res.stale) this.stats.stale += 1;
  }

  async reportCancelled(lease) {
    lease.phase = 'reporting';
    const res = await this.reporter.fail({ lease_id: lease.id, mode: 'FAIL_MODE_CANCELLED',
      error_class: 'Cancelled', error_message: 'task cancelled' });
    this.held.delete(lease.id);
    if (res.ok) this.stats.cancelled += 1;
    else if (res.stale) this.stats.stale += 1;
  }

  async release(lease, why) {
    lease.phase = 'reporting';
    const res = await this.reporter.fail({ lease_id: lease.id, mode: 'FAIL_MODE_RELEASE',
      error_class: 'Released', error_message: why });
    this.held.delete(lease.id);
    if (res.ok) this.stats.released += 1;
    else if (res.stale) this.stats.stale += 1;
  }

  drop(lease) {
    this.held.delete(lease.id);
    this.stats.lost += 1;
    log.warn('lease lost; task dropped', { task_id: lease.task.task_id, lease_id: lease.id });
  }

  armHeartbeat(delayMs) {
    if (this.heartbeatTimer) clearTimeout(this.heartbeatTimer);
    if (this.state === 'stopped') return;
    this.heartbeatTimer = setTimeout(() => this.heartbeat(), delayMs);
  }

  /** Unsent progress reports (the latest per lease), cleared: each is sent once. */
  takeProgress() {
    const out = [];
    for (const [id, lease] of this.held) {
      if (lease.progress) {
        out.push({ lease_id: id, ...lease.progress });
        lease.progress = null;
      }
    }
    return out;
  }

  /** A HeartbeatRequest for these leases and progress reports. */
  heartbeatRequest(leaseIds, progress) {
    return {
      worker_id: this.config.workerId,
      lease_ids: leaseIds,
      progress,
      counters: { tasks_processed: this.stats.processed, tasks_failed: this.stats.failed,
        tasks_retried: this.stats.retried },
      active_tasks: this.running.size,
      concurrency: this.config.concurrency,
      hostname: this.config.hostname,
      // Once draining, every heartbeat says so: the gateway then sends nothing new.
      draining: this.state !== 'running',
    };
  }

  /** Schedule an early heartbeat for new progress reports, PROGRESS_DELAY_MS after the
   * previous one at the soonest (the regular heartbeat keeps its own schedule). */
  armProgress() {
    if (this.progressTimer || this.state === 'stopped') return;
    const waitMs = Math.max(0, this.lastProgressAt + PROGRESS_DELAY_MS - Date.now());
    this.progressTimer = setTimeout(() => this.progressHeartbeat(), waitMs);
  }

  /** An early Heartbeat carrying only the leases that have a new progress report. */
  async progressHeartbeat() {
    this.progressTimer = null;
    this.lastProgressAt = Date.now();
    const progress = this.takeProgress();
    if (progress.length === 0) return;
    const request = this.heartbeatRequest(progress.map((p) => p.lease_id), progress);
    try {
      const resp = await unary(this.broker, 'Heartbeat', request, this.metadata(),
        Math.max(1000, this.heartbeatMs));
      resp.lost_lease_ids.forEach((id) => this.onLost(id));
      resp.cancelled_lease_ids.forEach((id) => this.onCancelled(id));
    } catch (err) {
      // a report lost with a failed call is superseded by the handler's next one
      log.debug('progress heartbeat failed', { code: codeName(err.code) });
    }
  }

  /** One Heartbeat call; re-arms itself. */
  async heartbeat() {
    this.heartbeatTimer = null;
    this.heartbeatBusy = true;
    const request = this.heartbeatRequest([...this.held.keys()], this.takeProgress());
    try {
      const deadlineMs = Math.max(1000, this.heartbeatMs);
      const resp = await unary(this.broker, 'Heartbeat', request, this.metadata(), deadlineMs);
      if (resp.heartbeat_interval_ms > 0) this.heartbeatMs = resp.heartbeat_interval_ms;
      resp.lost_lease_ids.forEach((id) => this.onLost(id));
      resp.cancelled_lease_ids.forEach((id) => this.onCancelled(id));
    } catch (err) {
      if (FATAL.has(err.code) && err.code !== 3) this.fatal(err);
      else log.warn('heartbeat failed', { code: codeName(err.code), details: err.details });
    } finally {
      this.heartbeatBusy = false;
      this.armHeartbeat(this.heartbeatMs);
    }
  }

  onLost(id) {
    const lease = this.held.get(id);
    if (!lease) return;
    if (this.batcher.remove(lease)) {
      this.drop(lease);
    } else if (lease.phase === 'buffered') {
      this.buffer = this.buffer.filter((l) => l !== lease);
      this.drop(lease);
    } else if (lease.phase === 'running') {
      lease.controller.abort(ABORT.LOST);
    }
    // A result already with the reporter is still sent: the lease may be lost only
    // because an earlier send was applied and its reply never came (the resend is then
    // answered duplicate = true), else the gateway fences it (STALE_LEASE, nothing
    // changes). The answer, not this list, decides how it counts.
  }

  onCancelled(id) {
    const lease = this.held.get(id);
    if (!lease) return;
    if (this.batcher.remove(lease)) {
      this.reportCancelled(lease);
    } else if (lease.phase === 'buffered') {
      this.buffer = this.buffer.filter((l) => l !== lease);
      this.reportCancelled(lease);
    } else if (lease.phase === 'running') {
      lease.controller.abort(ABORT.CANCELLED);
    }
  }

  /**
   * Graceful drain: send a draining heartbeat at once (later ones repeat it),
   * release buffered leases and every task still arriving, read the Lease
   * stream until the gateway ends it with OK (bounded, for gateways without
   * the field), let running handlers finish within drainGraceMs (release them
   * after that), flush reports, exit 0.
   */
  async stop() {
    if (this.state !== 'running') {
      log.warn('second stop request: releasing running tasks now');
      this.abortRunning(ABORT.DRAIN);
      return this.done;
    }
    this.state = 'draining';
    log.info('draining', { running: this.running.size, buffered: this.buffer.length,
      grace_ms: this.config.drainGraceMs });
    const graceTimer = setTimeout(() => this.abortRunning(ABORT.DRAIN), this.config.drainGraceMs);
    const buffered = [...this.buffer.splice(0), ...this.batcher.takeWaiting()];
    buffered.forEach((lease) => this.release(lease, 'worker draining'));
    if (this.heartbeatTimer) clearTimeout(this.heartbeatTimer);
    if (this.progressTimer) clearTimeout(this.progressTimer);
    this.heartbeat(); // the draining heartbeat, now
    const interval = this.session.sessions > 0 ? this.heartbeatMs : 0; // 0: no session yet
    const waitMs = Math.max(DRAIN_STREAM_MIN_MS, 2 * interval);
    const ended = await this.session.finish(waitMs);
    if (!ended) log.warn('lease stream not ended by the gateway; closing it', { waited_ms: waitMs });
    this.session.close();
    await this.waitFor(() => this.held.size === 0, this.config.drainGraceMs + REPORT_DRAIN_MS);
    clearTimeout(graceTimer);
    this.shutdown(0);
    return this.done;
  }

  abortRunning(reason) {
    for (const lease of this.running.values()) lease.controller.abort(reason);
  }

  async waitFor(predicate, timeoutMs) {
    const deadline = Date.now() + timeoutMs;
    while (!predicate() && Date.now() < deadline && this.state !== 'stopped') {
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** Unrecoverable (auth, bad request): stop at once with exit code 3. */
  fatal(err) {
    log.error('fatal gRPC status; stopping', { code: codeName(err.code), details: err.details || err.message });
    this.abortRunning(ABORT.LOST);
    this.shutdown(3);
  }

  shutdown(code) {
    if (this.state === 'stopped') return;
    this.state = 'stopped';
    this.exitCode = code;
    this.session.close();
    if (this.heartbeatTimer) clearTimeout(this.heartbeatTimer);
    if (this.progressTimer) clearTimeout(this.progressTimer);
    if (this.held.size > 0) log.warn('exiting with unreported leases', { count: this.held.size });
    this.reporter.abandon();
    if (this.processes) this.processes.close();
    this.broker.close();
    this.resolveDone(code);
  }
}

module.exports = { Worker, ABORT };
