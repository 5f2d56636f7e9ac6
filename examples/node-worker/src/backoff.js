'use strict';
/**
 * Exponential backoff with jitter for reconnects and report retries.
 *
 * Delay n (0-based) is drawn uniformly from [d/2, d] with
 * d = min(maxMs, baseMs * 2^n) ("equal jitter": never zero, so a fleet of
 * workers cut off by the same gateway restart spreads out without hammering it).
 */
class Backoff {
  /**
   * @param {number} baseMs first delay ceiling in ms
   * @param {number} maxMs largest delay ceiling in ms
   * @param {() => number} random uniform [0, 1) source (tests inject one)
   */
  constructor(baseMs, maxMs, random = Math.random) {
    this.baseMs = baseMs;
    this.maxMs = maxMs;
    this.random = random;
    this.attempt = 0;
  }

  /** Next delay in ms; grows until maxMs. */
  next() {
    const ceiling = Math.min(this.maxMs, this.baseMs * 2 ** Math.min(this.attempt, 30));
    this.attempt += 1;
    return Math.round(ceiling / 2 + (this.random() * ceiling) / 2);
  }

  /** Start over after a success. */
  reset() {
    this.attempt = 0;
  }
}

/** Promise resolving after `ms` ms, or early (resolving) when `signal` aborts. */
function sleep(ms, signal) {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}

module.exports = { Backoff, sleep };
