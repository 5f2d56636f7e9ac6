#!/usr/bin/env node
'use strict';
/**
 * dtq Node.js worker. Configuration through DTQ_* environment variables (see
 * README.md); prints a one-line JSON summary to stdout on exit.
 *
 * Required as a module (`require('dtq-node-worker')`) it runs nothing and exports
 * the Producer (enqueue, get, wait, cancel), the Worker and the handler errors.
 */
const log = require('./src/log');
const { loadConfig, ConfigError } = require('./src/config');
const { createBroker } = require('./src/rpc');
const { Worker } = require('./src/worker');
const { handlers } = require('./src/handlers');

function summary(worker, config, exitCode) {
  return JSON.stringify({ worker: 'node', worker_id: config.workerId, ...worker.stats, exit_code: exitCode });
}

async function main() {
  let config;
  try {
    config = loadConfig();
  } catch (err) {
    if (!(err instanceof ConfigError)) throw err;
    process.stderr.write(`dtq-node-worker: ${err.message}\n`);
    return 2;
  }
  log.setLevel(config.logLevel);
  const { broker, metadata } = createBroker(config);
  const taskTypes = config.taskTypes.length ? config.taskTypes : Object.keys(handlers);
  const worker = new Worker({ ...config, taskTypes }, { broker, metadata, handlers });
  const onSignal = (name) => {
    log.info('signal received', { signal: name });
    worker.stop();
  };
  process.on('SIGTERM', () => onSignal('SIGTERM'));
  process.on('SIGINT', () => onSignal('SIGINT'));
  const code = await worker.run();
  process.stdout.write(`${summary(worker, config, code)}\n`);
  return code;
}

if (require.main === module) {
  main().then(
    (code) => { process.exitCode = code; },
    (err) => {
      process.stderr.write(`dtq-node-worker: ${err.stack || err}\n`);
      process.exitCode = 1;
    },
  );
}

const producer = require('./src/producer');
const errors = require('./src/errors');
const { batch } = require('./src/batch');

module.exports = {
  ...producer,
  Worker,
  batch,
  PermanentError: errors.PermanentError,
  RetryError: errors.RetryError,
  TaskError: errors.TaskError,
};
