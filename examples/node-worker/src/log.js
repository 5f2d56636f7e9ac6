'use strict';
/**
 * Structured logging: one JSON object per line on stderr (stdout carries only
 * the exit summary, so scripts can parse it).
 */
const LEVELS = { debug: 10, info: 20, warning: 30, warn: 30, error: 40 };
let threshold = LEVELS.info;

/** Set the lowest level written ("debug", "info", "warning", "error"). */
function setLevel(name) {
  threshold = LEVELS[name] ?? LEVELS.info;
}

function write(level, msg, fields) {
  if (LEVELS[level] < threshold) return;
  const line = { ts: new Date().toISOString(), level, logger: 'dtq.node-worker', msg, ...fields };
  process.stderr.write(`${JSON.stringify(line)}\n`);
}

module.exports = {
  setLevel,
  debug: (msg, fields = {}) => write('debug', msg, fields),
  info: (msg, fields = {}) => write('info', msg, fields),
  warn: (msg, fields = {}) => write('warning', msg, fields),
  error: (msg, fields = {}) => write('error', msg, fields),
};
