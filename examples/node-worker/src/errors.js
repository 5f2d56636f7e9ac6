'use strict';
/**
 * Errors a handler may throw to steer what the worker reports.
 *
 * Any other thrown value is a retryable failure whose error_class is the
 * error's name. `retryable: false` on any error dead-letters the task at once;
 * `retryAfterMs` overrides the gateway's backoff (FailItem.retry_after_ms).
 */
class TaskError extends Error {
  /**
   * @param {string} message error text (FailItem.error_message)
   * @param {{retryable?: boolean, retryAfterMs?: number, errorClass?: string}} options
   */
  constructor(message, { retryable = true, retryAfterMs = 0, errorClass } = {}) {
    super(message);
    this.name = errorClass || new.target.name;
    this.retryable = retryable;
    this.retryAfterMs = retryAfterMs;
  }
}

/** Do not retry: the task goes to the dead-letter stream now. */
class PermanentError extends TaskError {
  constructor(message, options = {}) {
    super(message, { ...options, retryable: false });
  }
}

/** Retry after a given delay (ms) instead of the gateway's backoff. */
class RetryError extends TaskError {
  constructor(message, retryAfterMs, options = {}) {
    super(message, { ...options, retryable: true, retryAfterMs });
  }
}

/**
 * Cut a string to at most maxBytes bytes of UTF-8, at a character boundary (the
 * proto's limits are in bytes; String.prototype.slice counts UTF-16 units).
 *
 * @param {string} text the string to cut
 * @param {number} maxBytes limit in bytes of UTF-8
 * @returns {string} text itself when it fits, else its longest prefix that fits
 */
function cutUtf8(text, maxBytes) {
  const data = Buffer.from(text, 'utf8');
  if (data.length <= maxBytes) return text;
  let end = maxBytes;
  while (end > 0 && (data[end] & 0xc0) === 0x80) end -= 1; // continuation byte: back up
  return data.subarray(0, end).toString('utf8');
}

/** Fail item fields for an error thrown by a handler. */
function describeError(err) {
  const isError = err instanceof Error;
  let errorClass = isError ? err.name || err.constructor.name : typeof err;
  if (isError && err.code === 'ENOENT') errorClass = 'FileNotFoundError';
  const message = isError ? err.message : String(err);
  return {
    error_class: cutUtf8(errorClass, 128),
    error_message: cutUtf8(message, 4096),
    retryable: !(isError && (err.retryable === false || err.nonRetryable === true)),
    retry_after_ms: isError && Number.isFinite(err.retryAfterMs) ? Math.max(0, Math.round(err.retryAfterMs)) : 0,
  };
}

module.exports = { TaskError, PermanentError, RetryError, describeError, cutUtf8 };
