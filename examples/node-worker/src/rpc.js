'use strict';
/**
 * gRPC plumbing: load proto/dtq.proto at run time, build the Broker client,
 * attach the bearer token, and promisify unary calls.
 */
const fs = require('node:fs');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const LOADER_OPTIONS = {
  keepCase: true, // field names exactly as in the .proto (snake_case)
  longs: Number, // *_ms int64 values fit a double for the next 285000 years
  enums: String, // enum values as their names, e.g. "FAIL_MODE_RELEASE"
  bytes: Buffer,
  defaults: true,
  oneofs: true, // LeaseResponse.kind names the set member
};

/**
 * Load the dtq.v1 package from a .proto file.
 *
 * @param {string} protoPath path of proto/dtq.proto
 * @returns {object} the `dtq.v1` namespace (service constructors)
 */
function loadDtq(protoPath) {
  if (!fs.existsSync(protoPath)) {
    throw new Error(`proto file not found: ${protoPath} (set DTQ_PROTO)`);
  }
  const definition = protoLoader.loadSync(protoPath, LOADER_OPTIONS);
  return grpc.loadPackageDefinition(definition).dtq.v1;
}

/** Channel credentials: insecure, or TLS with an optional CA bundle. */
function channelCredentials(config) {
  if (!config.tls) return grpc.credentials.createInsecure();
  const ca = config.tlsCa ? fs.readFileSync(config.tlsCa) : null;
  return grpc.credentials.createSsl(ca);
}

/** HTTP/2 keepalive, in ms: a PING every 10 s even while the Lease stream is idle;
 * no answer within 5 s closes the connection, so a black-holed one is found in 15 s. */
const KEEPALIVE_TIME_MS = 10000;
const KEEPALIVE_TIMEOUT_MS = 5000;

/**
 * Channel options: message size, keepalive, and a connection backoff bounded by the
 * worker's own reconnect backoff (DTQ_RECONNECT_BASE_MS .. DTQ_RECONNECT_MAX_MS).
 * grpc-js alone backs off up to 120 s between connection attempts, during which
 * calls fail at once, so the worker came back long after its gateway did.
 *
 * @param {object} config from loadConfig()
 * @returns {object} grpc-js channel options
 */
function channelOptions(config) {
  return {
    'grpc.max_receive_message_length': 16 * 1024 * 1024,
    'grpc.primary_user_agent': 'dtq-node-worker/0.1.0',
    'grpc.keepalive_time_ms': KEEPALIVE_TIME_MS,
    'grpc.keepalive_timeout_ms': KEEPALIVE_TIMEOUT_MS,
    'grpc.keepalive_permit_without_calls': 1,
    'grpc.initial_reconnect_backoff_ms': config.reconnectBaseMs,
    'grpc.max_reconnect_backoff_ms': config.reconnectMaxMs,
  };
}

/**
 * Create the Broker client for a configuration.
 *
 * @param {object} config from loadConfig()
 * @returns {{broker: object, metadata: () => grpc.Metadata}}
 */
function createBroker(config) {
  const dtq = loadDtq(config.protoPath);
  const broker = new dtq.Broker(config.gateway, channelCredentials(config), channelOptions(config));
  const metadata = () => {
    const md = new grpc.Metadata();
    if (config.token) md.set('authorization', `Bearer ${config.token}`);
    return md;
  };
  return { broker, metadata };
}

/**
 * Call a unary Broker method and get a promise.
 *
 * @param {object} broker client from createBroker
 * @param {string} method e.g. "Ack"
 * @param {object} request plain request object
 * @param {grpc.Metadata} metadata call metadata
 * @param {number} deadlineMs call deadline from now, in ms
 * @returns {Promise<object>} the response; rejects with a grpc ServiceError
 */
function unary(broker, method, request, metadata, deadlineMs) {
  return new Promise((resolve, reject) => {
    const deadline = new Date(Date.now() + deadlineMs);
    broker[method](request, metadata, { deadline }, (err, response) => {
      if (err) reject(err);
      else resolve(response);
    });
  });
}

module.exports = { loadDtq, createBroker, channelOptions, unary, LOADER_OPTIONS };
