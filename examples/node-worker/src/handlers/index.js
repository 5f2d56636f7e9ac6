'use strict';
/** Registry of every task type this worker implements. */
const conf = require('./conf');
const demo = require('./demo');

module.exports = { handlers: { ...conf.handlers, ...demo.handlers } };
