'use strict';
/**
 * The Lease stream: open it, hand SessionInfo and the leased tasks to the worker,
 * and reconnect with jittered exponential backoff when it ends.
 *
 * Batched delivery (docs/protocol.md 3.2): the request asks for up to MAX_BATCH
 * tasks per stream message (max_batch = max_in_flight, at most 256); a gateway that
 * grants it sends LeasedTaskBatch messages, one that does not (or an older one) sends
 * one LeasedTask per message. Both reach the worker as onTasks(tasks), in order.
 *
 * Cancel notices (docs/protocol.md 8): the request sets accept_cancel_notices, so a
 * CancelTask of a running task reaches onCancelled(leaseIds) at once; the worker
 * treats it as a heartbeat answer's cancelled_lease_ids.
 *
 * Reconnect rules (docs/protocol.md): a transient status (UNAVAILABLE,
 * CANCELLED, DEADLINE_EXCEEDED, INTERNAL, ... or a clean end while the worker
 * still runs) reconnects; UNAUTHENTICATED, PERMISSION_DENIED and
 * INVALID_ARGUMENT are configuration problems: stop and report.
 */
const log = require('./log');
const { Backoff, sleep } = require('./backoff');
const { FATAL, codeName } = require('./codes');

/** Most tasks per Lease stream message (LeaseRequest.max_batch, 0..256). */
const MAX_BATCH = 256;

class LeaseSession {
  /**
   * @param {object} deps {config, broker, metadata}
   * @param {object} callbacks {onSession(info), onTasks(tasks), onCancelled(leaseIds),
   *   onFatal(err)}: onCancelled gets the lease ids of a cancel notice
   *   (LeaseResponse.cancelled, asked for with accept_cancel_notices)
   */
  constructor({ config, broker, metadata }, callbacks) {
    this.config = config;
    this.broker = broker;
    this.metadata = metadata;
    this.callbacks = callbacks;
    this.backoff = new Backoff(config.reconnectBaseMs, config.reconnectMaxMs);
    this.closed = new AbortController();
    this.call = null;
    this.live = false; // the current call has its SessionInfo: leases may be in transit
    this.sessions = 0;
    this.draining = false;
    this.ended = null; // resolves when the current stream ends
  }

  /** The LeaseRequest this worker sends. */
  request() {
    const c = this.config;
    return {
      worker_id: c.workerId,
      queues: c.queues,
      task_types: c.taskTypes,
      max_in_flight: c.maxInFlight,
      hostname: c.hostname,
      labels: { language: 'node', node_version: process.version },
      concurrency: c.leaseConcurrency || c.concurrency, // a batch counts its maxSize tasks
      sdk: 'dtq-node-worker/0.1.0',
      max_batch: Math.min(MAX_BATCH, c.maxInFlight), // a batch never exceeds the credit
      accept_cancel_notices: true, // a cancel arrives on the stream, not a heartbeat later
    };
  }

  /** Run sessions until close() or a fatal status; resolves when done. */
  async run() {
    while (!this.closed.signal.aborted && !this.draining) {
      const status = await this.once();
      if (this.closed.signal.aborted) break;
      if (this.draining) { // OK after the draining heartbeat: every lease sent has arrived
        log.info('lease stream ended while draining', { code: codeName(status.code) });
        break;
      }
      if (FATAL.has(status.code)) {
        const err = new Error(`Lease refused: ${codeName(status.code)}: ${status.details}`);
        err.code = status.code;
        this.callbacks.onFatal(err);
        break;
      }
      const delayMs = this.backoff.next();
      log.warn('lease stream ended; reconnecting',
        { code: codeName(status.code), details: status.details, delay_ms: delayMs });
      await sleep(delayMs, this.closed.signal);
    }
  }

  /** Open one Lease stream; resolves with its final status. */
  once() {
    return new Promise((resolve) => {
      // wait for the channel to (re)connect instead of failing at once while it backs
      // off: the stream opens as soon as the gateway serves again
      const md = this.metadata();
      md.setOptions({ waitForReady: true });
      const call = this.broker.Lease(this.request(), md);
      this.call = call;
      this.live = false;
      this.ended = new Promise((r) => call.on('status', () => r(true)));
      call.on('data', (msg) => this.onMessage(msg));
      call.on('error', () => {}); // the 'status' event below carries the same information
      call.on('status', (status) => {
        this.call = null;
        this.live = false;
        resolve(status);
      });
    });
  }

  onMessage(msg) {
    if (msg.kind === 'session') {
      this.live = true;
      this.sessions += 1;
      this.backoff.reset();
      log.info('lease session open', {
        session_id: msg.session.session_id, gateway_id: msg.session.gateway_id,
        heartbeat_interval_ms: msg.session.heartbeat_interval_ms,
        visibility_timeout_ms: msg.session.visibility_timeout_ms,
        max_in_flight: msg.session.max_in_flight, max_batch: msg.session.max_batch,
      });
      this.callbacks.onSession(msg.session);
    } else if (msg.kind === 'batch') {
      this.callbacks.onTasks(msg.batch.tasks);
    } else if (msg.kind === 'task') {
      this.callbacks.onTasks([msg.task]);
    } else if (msg.kind === 'cancelled') {
      this.callbacks.onCancelled(msg.cancelled.lease_ids);
    }
  }

  /**
   * Drain: stop reconnecting, keep reading the open stream until it ends (the
   * gateway ends it with OK after a draining heartbeat) or `timeoutMs` passes.
   *
   * @param {number} timeoutMs longest wait, in ms
   * @returns {Promise<boolean>} true when the stream ended (or none was open)
   */
  async finish(timeoutMs) {
    this.draining = true;
    // between sessions (backoff), or a call still waiting for its gateway (no
    // SessionInfo yet): nothing in transit, no stream end to wait for
    if (!this.call || !this.live) return true;
    let timer;
    const timedOut = new Promise((r) => { timer = setTimeout(() => r(false), timeoutMs); });
    const ended = await Promise.race([this.ended, timedOut]);
    clearTimeout(timer);
    return ended;
  }

  /** End the stream and stop reconnecting (drain or shutdown). */
  close() {
    this.closed.abort();
    if (this.call) this.call.cancel();
  }
}

module.exports = { LeaseSession, MAX_BATCH };
