'use strict';
/**
 * How the worker reacts to gRPC status codes (docs/protocol.md, "Reconnecting").
 */
const { status } = require('@grpc/grpc-js');

/** Transient: reconnect / resend after a jittered backoff. */
const RETRYABLE = new Set([
  status.UNAVAILABLE, status.CANCELLED, status.DEADLINE_EXCEEDED, status.INTERNAL,
  status.UNKNOWN, status.RESOURCE_EXHAUSTED, status.ABORTED, status.OK,
]);

/** Configuration or credential problems: stop and report, retrying cannot help. */
const FATAL = new Set([
  status.UNAUTHENTICATED, status.PERMISSION_DENIED, status.INVALID_ARGUMENT,
  status.UNIMPLEMENTED,
]);

/** Name of a numeric status code, e.g. 14 -> "UNAVAILABLE". */
function codeName(code) {
  return Object.keys(status).find((k) => status[k] === code) || String(code);
}

module.exports = { RETRYABLE, FATAL, codeName, status };
