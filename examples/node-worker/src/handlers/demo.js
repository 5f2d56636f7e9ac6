'use strict';
/**
 * Demo task types (queue "demo"), the same contract as the Python demo
 * handlers so that a task gives the same result whichever language ran it.
 */
const fs = require('node:fs/promises');
const crypto = require('node:crypto');
const { TaskError, PermanentError } = require('../errors');

const WORD_RE = /[A-Za-z_][A-Za-z0-9_]*/g;
// Line boundaries of Python's str.splitlines().
const LINE_BREAK_RE = /\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/;
const TOP_WORDS = 20;

/** Number of lines as Python's len(text.splitlines()) counts them. */
function countLines(text) {
  if (text === '') return 0;
  const parts = text.split(LINE_BREAK_RE);
  return parts[parts.length - 1] === '' ? parts.length - 1 : parts.length;
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
  return fileStats(payload?.path);
}

async function flaky(payload, ctx) {
  const failAttempts = Number(payload?.fail_attempts ?? 0);
  if (ctx.attempt <= failAttempts) {
    throw new TaskError(`flaky failure on attempt ${ctx.attempt} of ${failAttempts} planned`,
      { errorClass: 'FlakyError' });
  }
  return fileStats(payload?.path);
}

async function poison(payload) {
  throw new TaskError(`poison task for ${payload?.path}`, { errorClass: 'PoisonError' });
}

async function corrupt(payload) {
  throw new PermanentError(`corrupt input ${payload?.path}`, { errorClass: 'CorruptFileError' });
}

module.exports = {
  handlers: { 'file.stats': stats, 'file.flaky': flaky, 'file.poison': poison, 'file.corrupt': corrupt },
  countLines,
  topWords,
  fileStats,
};
