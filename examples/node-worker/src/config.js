'use strict';
/**
 * Worker configuration from DTQ_* environment variables.
 *
 * Every value is validated here so that a typo fails at startup with one clear
 * line instead of surfacing later as a gRPC INVALID_ARGUMENT.
 */
const os = require('node:os');
const path = require('node:path');
const crypto = require('node:crypto');

const QUEUE_RE = /^[A-Za-z0-9_.-]{1,64}$/;
const WORKER_ID_RE = /^[A-Za-z0-9_.:@-]{1,128}$/;
const TASK_TYPE_RE = /^[A-Za-z0-9_.:/-]{1,128}$/;

class ConfigError extends Error {}

/** Parse a positive integer env var; `fallback` when unset or empty. */
function intVar(env, name, fallback, min = 1) {
  const raw = env[name];
  if (raw === undefined || raw.trim() === '') return fallback;
  const value = Number(raw.trim());
  if (!Number.isInteger(value) || value < min) {
    throw new ConfigError(`${name} must be an integer >= ${min} (got ${JSON.stringify(raw)})`);
  }
  return value;
}

/** Split a comma list, dropping blanks. */
function listVar(env, name) {
  return (env[name] || '').split(',').map((s) => s.trim()).filter(Boolean);
}

function defaultWorkerId() {
  const host = os.hostname().replace(/[^A-Za-z0-9_.:@-]/g, '-').slice(0, 64) || 'host';
  return `${host}-${process.pid}-${crypto.randomBytes(3).toString('hex')}`;
}

/**
 * Build the worker configuration.
 *
 * @param {Record<string, string|undefined>} env environment (default process.env)
 * @returns {object} frozen configuration; durations are in ms
 * @throws {ConfigError} a variable is malformed
 */
function loadConfig(env = process.env) {
  const gateway = (env.DTQ_GATEWAY || '127.0.0.1:50051').trim();
  if (!/^[^\s]+:\d{1,5}$/.test(gateway)) {
    throw new ConfigError(`DTQ_GATEWAY must be host:port (got ${JSON.stringify(gateway)})`);
  }
  let queues = listVar(env, 'DTQ_QUEUES');
  if (queues.length === 0) queues = listVar(env, 'DTQ_QUEUE');
  if (queues.length === 0) throw new ConfigError('DTQ_QUEUES (or DTQ_QUEUE) is required');
  if (queues.length > 32) throw new ConfigError('DTQ_QUEUES names at most 32 queues');
  for (const q of queues) {
    if (!QUEUE_RE.test(q)) throw new ConfigError(`DTQ_QUEUES: bad queue name ${JSON.stringify(q)}`);
  }
  const workerId = (env.DTQ_WORKER_ID || '').trim() || defaultWorkerId();
  if (!WORKER_ID_RE.test(workerId)) {
    throw new ConfigError(`DTQ_WORKER_ID must match ${WORKER_ID_RE} (got ${JSON.stringify(workerId)})`);
  }
  const taskTypes = listVar(env, 'DTQ_TASK_TYPES');
  for (const t of taskTypes) {
    if (!TASK_TYPE_RE.test(t)) throw new ConfigError(`DTQ_TASK_TYPES: bad task type ${JSON.stringify(t)}`);
  }
  const concurrency = intVar(env, 'DTQ_CONCURRENCY', 4);
  const pool = (env.DTQ_POOL || 'loop').trim().toLowerCase();
  if (!['loop', 'process'].includes(pool)) {
    throw new ConfigError(`DTQ_POOL must be loop or process (got ${JSON.stringify(env.DTQ_POOL)})`);
  }
  const maxInFlight = intVar(env, 'DTQ_MAX_IN_FLIGHT', 2 * concurrency);
  if (maxInFlight > 10000) throw new ConfigError('DTQ_MAX_IN_FLIGHT must be <= 10000');
  const reconnectBaseMs = intVar(env, 'DTQ_RECONNECT_BASE_MS', 200);
  const reconnectMaxMs = intVar(env, 'DTQ_RECONNECT_MAX_MS', 5000);
  if (reconnectBaseMs > reconnectMaxMs) {
    throw new ConfigError('DTQ_RECONNECT_BASE_MS must not exceed DTQ_RECONNECT_MAX_MS');
  }
  const protoPath = path.resolve(env.DTQ_PROTO || path.join(__dirname, '..', '..', '..', 'proto', 'dtq.proto'));
  return Object.freeze({
    gateway,
    queues,
    taskTypes,
    workerId,
    concurrency,
    maxInFlight,
    pool,
    cancelGraceMs: intVar(env, 'DTQ_CANCEL_GRACE_MS', 2000, 0),
    drainGraceMs: intVar(env, 'DTQ_DRAIN_GRACE_MS', 30000, 0),
    ackFlushMs: intVar(env, 'DTQ_ACK_FLUSH_MS', 5, 0),
    reconnectBaseMs,
    reconnectMaxMs,
    token: (env.DTQ_TOKEN || '').trim(),
    tlsCa: (env.DTQ_TLS_CA || '').trim(),
    tls: ['1', 'true', 'yes', 'on'].includes((env.DTQ_TLS || '').trim().toLowerCase()) || Boolean(env.DTQ_TLS_CA),
    protoPath,
    logLevel: (env.DTQ_LOG_LEVEL || 'info').trim().toLowerCase(),
    hostname: os.hostname(),
  });
}

module.exports = { loadConfig, ConfigError };
