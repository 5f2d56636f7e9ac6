'use strict';
/**
 * The process pool (DTQ_POOL=process): each handler slot is a child process
 * (src/child.js, forked with `child_process.fork`), so a handler can be stopped
 * whatever it does. A handler past its time limit, or whose lease was lost, or that
 * was released by the drain, has its child killed (SIGKILL) at once; a cancelled one
 * has `ctx.signal` aborted in its child and is killed after `cancelGraceMs` unless
 * it returned. A child that dies under its handler (a crash, `process.abort()`, the
 * OOM killer) fails only that task, as `HandlerProcessDied` (retryable). Every
 * killed or dead child is replaced. The Lease stream, heartbeats and acks stay in
 * the worker process; `ctx.progress` travels over the IPC channel.
 */
const { fork } = require('node:child_process');
const path = require('node:path');
const log = require('./log');

const CHILD = path.join(__dirname, 'child.js');
/** The default handler registry, as src/handlers/index.js exports it. */
const DEFAULT_HANDLERS = path.join(__dirname, 'handlers', 'index.js');
const PROCESS_DIED = 'HandlerProcessDied';

/** "killed by signal SIGABRT" / "exit status 1". */
function exitStatus(code, signal) {
  return signal ? `killed by signal ${signal}` : `exit status ${code}`;
}

class ProcessPool {
  /**
   * @param {{size: number, handlersPath?: string, cancelGraceMs: number, workerId: string}} options
   *   size: children (the worker's concurrency, >= 1); handlersPath: module exporting
   *   `{ handlers }` that children load (default src/handlers); cancelGraceMs: how long a
   *   cancelled handler may finish before its child is killed (ms >= 0).
   */
  constructor({ size, handlersPath = DEFAULT_HANDLERS, cancelGraceMs, workerId }) {
    this.size = size;
    this.handlersPath = handlersPath;
    this.cancelGraceMs = cancelGraceMs;
    this.workerId = workerId;
    this.idle = [];
    this.waiters = [];
    this.slots = new Set();
    this.closed = false;
    /** Children forked so far (the first `size` plus replacements). */
    this.started = 0;
  }

  /** Fork every slot's child. */
  start() {
    for (let i = 0; i < this.size; i += 1) this.free(this.spawn());
  }

  spawn() {
    const child = fork(CHILD, [this.handlersPath],
      { serialization: 'advanced', stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    const slot = { child, pid: child.pid, call: null, killed: false };
    this.slots.add(slot);
    this.started += 1;
    child.on('message', (msg) => this.onMessage(slot, msg));
    child.on('exit', (code, signal) => this.onExit(slot, code, signal));
    child.on('error', (err) => log.warn('handler process error', { pid: slot.pid, error: err.message }));
    return slot;
  }

  /** A free slot: at once, or when one is freed or replaced. */
  acquire() {
    if (this.idle.length > 0) return Promise.resolve(this.idle.pop());
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  free(slot) {
    slot.call = null;
    if (this.closed) return this.kill(slot, 'SIGTERM');
    const waiter = this.waiters.shift();
    if (waiter) waiter(slot);
    else this.idle.push(slot);
    return undefined;
  }

  /**
   * Run the task's handler in a child.
   *
   * @param {object} task the LeasedTask
   * @param {*} payload its decoded payload
   * @param {AbortSignal} signal aborts with the reason the worker stops it for
   * @param {(report: object) => void} onProgress receives the child's ctx.progress reports
   * @returns {Promise<{ok: true, value: Buffer}|{error: Error}|{aborted: string}>}
   */
  async run(task, payload, signal, onProgress) {
    const slot = await this.acquire();
    if (signal.aborted) {
      this.free(slot);
      return { aborted: signal.reason };
    }
    return new Promise((resolve) => {
      const call = { id: task.lease_id, resolve, onProgress, settled: false, graceTimer: null };
      slot.call = call;
      const onAbort = () => this.stop(slot, call, signal.reason);
      call.cleanup = () => signal.removeEventListener('abort', onAbort);
      signal.addEventListener('abort', onAbort, { once: true });
      slot.child.send({ run: task, payload, workerId: this.workerId });
    });
  }

  settle(call, outcome) {
    if (call.settled) return;
    call.settled = true;
    call.cleanup();
    call.resolve(outcome);
  }

  stop(slot, call, reason) {
    this.settle(call, { aborted: reason });
    if (reason === 'cancelled' && this.cancelGraceMs > 0) {
      slot.child.send({ cancel: call.id });
      call.graceTimer = setTimeout(() => this.kill(slot, 'SIGKILL', reason), this.cancelGraceMs);
    } else {
      this.kill(slot, 'SIGKILL', reason);
    }
  }

  kill(slot, sig, reason) {
    if (slot.killed) return;
    slot.killed = true;
    if (reason) log.warn('handler process killed', { pid: slot.pid, stop: reason });
    slot.child.kill(sig);
  }

  onMessage(slot, msg) {
    const { call } = slot;
    if (!call || msg.id !== call.id) return;
    if (msg.progress) {
      if (!call.settled) call.onProgress(msg.progress);
      return;
    }
    if (!msg.done) return;
    if (call.graceTimer) clearTimeout(call.graceTimer); // it returned within the grace
    if (msg.error) {
      const { error_class: name, error_message: message, retryable, retry_after_ms: ms } = msg.error;
      this.settle(call, { error: Object.assign(new Error(message), { name, retryable, retryAfterMs: ms }) });
    } else {
      this.settle(call, { ok: true, value: Buffer.from(msg.value) });
    }
    if (!slot.killed) this.free(slot);
  }

  onExit(slot, code, signal) {
    this.slots.delete(slot);
    this.idle = this.idle.filter((s) => s !== slot);
    const { call } = slot;
    if (call && !call.settled) {
      const status = exitStatus(code, signal);
      log.error('handler process died', { pid: slot.pid, status, lease_id: call.id });
      this.settle(call, { error: Object.assign(
        new Error(`handler process ${slot.pid} died while running the task (${status})`),
        { name: PROCESS_DIED, retryable: true }) });
    }
    if (!this.closed) this.free(this.spawn());
  }

  /** Stop every child (idle ones exit when disconnected; busy ones are killed). */
  close() {
    this.closed = true;
    for (const slot of this.slots) {
      if (slot.call) this.kill(slot, 'SIGKILL');
      else if (slot.child.connected) slot.child.disconnect();
    }
  }
}

module.exports = { ProcessPool, PROCESS_DIED, DEFAULT_HANDLERS };
