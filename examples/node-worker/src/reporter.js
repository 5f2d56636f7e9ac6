'use strict';
/**
 * Batched Ack/Fail reporting.
 *
 * Results are coalesced for up to `flushMs` ms (or MAX_BATCH items) and sent as
 * one Ack and one Fail call. Every item is answered on its own (LeaseResult):
 * - no error: done (duplicate=true is a harmless repeat);
 * - FAILED_PRECONDITION (STALE_LEASE) or NOT_FOUND: the lease is no longer
 *   ours, the result is dropped, nothing changed on the gateway;
 * - UNAVAILABLE: transient, the item is sent again after a backoff.
 * A call-level transient error (gateway restarting) re-sends the whole batch
 * after a jittered backoff; a single-item call carries that item's own error as
 * the call status, which is handled like the per-item error above.
 * An item is sent until answered even when a heartbeat reports its lease lost:
 * an item the gateway applied whose reply was lost also makes the lease lost, and
 * only the resend's answer (duplicate=true) says it was applied.
 */
const log = require('./log');
const { Backoff, sleep } = require('./backoff');
const { RETRYABLE, FATAL, codeName, status } = require('./codes');
const { unary } = require('./rpc');

const MAX_BATCH = 256;
const CALL_DEADLINE_MS = 10000;

class Reporter {
  /**
   * @param {object} broker Broker client
   * @param {() => object} metadata call metadata factory
   * @param {{flushMs: number, onFatal: (err: Error) => void}} options
   */
  constructor(broker, metadata, { flushMs, onFatal }) {
    this.broker = broker;
    this.metadata = metadata;
    this.flushMs = flushMs;
    this.onFatal = onFatal;
    this.queues = { Ack: [], Fail: [] };
    this.timers = { Ack: null, Fail: null };
    this.backoff = new Backoff(100, 5000);
    this.pending = new Map(); // lease_id -> entry
    this.stopSignal = new AbortController();
  }

  /** Queue a successful completion; resolves to an outcome object. */
  ack(leaseId, result) {
    return this.enqueue('Ack', { lease_id: leaseId, result });
  }

  /** Queue a Fail item (failure, release or cancelled); resolves to an outcome. */
  fail(item) {
    return this.enqueue('Fail', item);
  }

  /** Items queued or in flight. */
  get size() {
    return this.pending.size;
  }

  /** Resolve every unsettled report as abandoned (shutdown deadline passed). */
  abandon() {
    this.stopSignal.abort();
    for (const entry of [...this.pending.values()]) this.settle(entry, { abandoned: true });
    this.queues = { Ack: [], Fail: [] };
  }

  enqueue(kind, item) {
    return new Promise((resolve) => {
      const entry = { kind, item, resolve, sent: false };
      this.pending.set(item.lease_id, entry);
      this.queues[kind].push(entry);
      this.schedule(kind, this.queues[kind].length >= MAX_BATCH ? 0 : this.flushMs);
    });
  }

  schedule(kind, delayMs) {
    if (this.timers[kind]) {
      if (delayMs > 0) return;
      clearTimeout(this.timers[kind]);
    }
    this.timers[kind] = setTimeout(() => {
      this.timers[kind] = null;
      this.flush(kind);
    }, delayMs);
  }

  settle(entry, outcome) {
    if (this.pending.get(entry.item.lease_id) === entry) this.pending.delete(entry.item.lease_id);
    entry.resolve(outcome);
  }

  async flush(kind) {
    while (this.queues[kind].length > 0) {
      const batch = this.queues[kind].splice(0, MAX_BATCH);
      for (const e of batch) e.sent = true;
      await this.send(kind, batch);
    }
  }

  async send(kind, batch) {
    let response;
    try {
      response = await unary(this.broker, kind, { items: batch.map((e) => e.item) },
        this.metadata(), CALL_DEADLINE_MS);
    } catch (err) {
      await this.callFailed(kind, batch, err);
      return;
    }
    this.backoff.reset();
    const retry = [];
    batch.forEach((entry, i) => {
      const result = response.results[i] || {};
      const code = result.error ? result.error.code : status.OK;
      if (code === status.UNAVAILABLE) retry.push(entry);
      else this.settle(entry, this.outcome(kind, entry, code, result));
    });
    if (retry.length) await this.requeue(kind, retry);
  }

  outcome(kind, entry, code, result) {
    if (code === status.OK) return { ok: true, duplicate: result.duplicate, status: result.status };
    const reason = result.error?.reason || codeName(code);
    if (code === status.FAILED_PRECONDITION || code === status.NOT_FOUND) {
      log.info('lease no longer ours; result dropped',
        { kind, lease_id: entry.item.lease_id, reason });
      return { stale: true, reason };
    }
    log.error('report refused', { kind, lease_id: entry.item.lease_id, code: codeName(code),
      reason, message: result.error?.message });
    return { refused: true, reason };
  }

  async callFailed(kind, batch, err) {
    const code = err.code ?? status.UNKNOWN;
    if (batch.length === 1 && !RETRYABLE.has(code) && !FATAL.has(code)) {
      // Single-item call: the item's own error is the call status.
      this.settle(batch[0], this.outcome(kind, batch[0], code, { error: { reason: '', message: err.details } }));
      return;
    }
    if (FATAL.has(code)) {
      log.error('report call refused', { kind, code: codeName(code), details: err.details });
      for (const e of batch) this.settle(e, { refused: true, reason: codeName(code) });
      if (code !== status.INVALID_ARGUMENT) this.onFatal(err);
      return;
    }
    log.warn('report call failed; will resend', { kind, code: codeName(code), items: batch.length });
    await this.requeue(kind, batch);
  }

  async requeue(kind, batch) {
    await sleep(this.backoff.next(), this.stopSignal.signal);
    if (this.stopSignal.signal.aborted) return;
    const live = batch.filter((e) => this.pending.get(e.item.lease_id) === e);
    for (const e of live) e.sent = false;
    this.queues[kind].unshift(...live);
  }
}

module.exports = { Reporter, MAX_BATCH };
