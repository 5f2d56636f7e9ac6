'use strict';
/**
 * Demo task types (queue "demo"), the same contract as the Python demo
 * handlers (examples/demo/handlers.py, textstats.py) so that a task gives the
 * same result whichever language ran it; only "worker_lang" differs.
 */
const fs = require('node:fs/promises');
const crypto = require('node:crypto');
const { TaskError, PermanentError } = require('../errors');

const WORD_RE = /[A-Za-z_][A-Za-z0-9_]*/g;
const TOP_WORDS = 20;
const WORKER_LANG = 'node';

/** Lines: newline characters, plus one for a last line without a newline. */
function countLines(text) {
  let count = 0;
  for (let i = text.indexOf('\n'); i !== -1; i = text.indexOf('\n', i + 1)) count += 1;
  return count + (text !== '' && !text.endsWith('\n') ? 1 : 0);
}

/**
 * Word counts, most common first; ties keep first-seen order (as Python's
 * Counter.most_common does).
 */
function topWords(words, limit = TOP_WORDS) {
  const counts = new Map();
  for (const w of words) counts.set(w, (counts.get(w) || 0) + 1);
  return [...counts.entries()].sort((a, b) => b[1] - a[1]).slice(0, limit);
}

/**
 * Statistics of a text file.
 *
 * @param {string} path file to read (decoded as UTF-8, bad bytes replaced)
 * @returns {Promise<object>} {path, lines, words, sha256, top_words}
 */
async function fileStats(path) {
  if (typeof path !== 'string' || path === '') {
    throw new PermanentError('payload.path must be a non-empty string', { errorClass: 'ValueError' });
  }
  const data = await fs.readFile(path);
  const text = data.toString('utf8');
  const words = (text.match(WORD_RE) || []).map((w) => w.toLowerCase());
  return {
    path,
    lines: countLines(text),
    words: words.length,
    sha256: crypto.createHash('sha256').update(data).digest('hex'),
    top_words: topWords(words),
  };
}

async function stats(payload) {
  return { ...(await fileStats(payload?.path)), worker_lang: WORKER_LANG };
}

async function flaky(payload, ctx) {
  const failAttempts = Number(payload?.fail_attempts ?? 1);
  if (ctx.attempt <= failAttempts) {
    throw new TaskError(`flaky failure on attempt ${ctx.attempt}`, { errorClass: 'FlakyError' });
  }
  return stats(payload);
}

async function poison(_payload, ctx) {
  throw new TaskError(`poison task failed on attempt ${ctx.attempt} of ${ctx.maxAttempts}`,
    { errorClass: 'FlakyError' });
}

async function corrupt(payload) {
  throw new PermanentError(`refusing ${payload?.path ?? '?'}: marked corrupt`);
}

module.exports = {
  handlers: { 'file.stats': stats, 'file.flaky': flaky, 'file.poison': poison, 'file.corrupt': corrupt },
  countLines,
  topWords,
  fileStats,
};
