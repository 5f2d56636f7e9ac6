'use strict';
// Shared by the worker tests: a scripted in-process fake Broker, tasks, workers, polls.
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const { loadConfig } = require('../src/config');
const { createBroker, LOADER_OPTIONS } = require('../src/rpc');
const { Worker } = require('../src/worker');
const { handlers: defaultHandlers } = require('../src/handlers');

const PROTO = loadConfig({ DTQ_QUEUE: 'q' }).protoPath;

/** A fake Broker whose answers each test scripts through `script`. */
async function fakeBroker(script) {
  const def = protoLoader.loadSync(PROTO, LOADER_OPTIONS);
  const { Broker } = grpc.loadPackageDefinition(def).dtq.v1;
  const seen = { heartbeats: [], draining: [], acks: [], fails: [], leases: 0, ended: 0, at: {} };
  const open = new Set();
  const server = new grpc.Server();
  server.addService(Broker.service, {
    Lease(call) {
      seen.leases += 1;
      if (script.leaseError) {
        call.emit('error', { code: script.leaseError, details: 'scripted' });
        return;
      }
      seen.request = call.request;
      // script.batch: honour max_batch (LeasedTaskBatch messages); else one task per message
      const maxBatch = script.batch && call.request.max_batch > 1 ? call.request.max_batch : 0;
      call.write({ session: { session_id: 's', heartbeat_interval_ms: script.heartbeatMs || 50,
        visibility_timeout_ms: 1000, max_batch: maxBatch,
        max_in_flight: 4, gateway_id: 'fake', result_max_bytes: 8192, lease_grace_ms: 0 } });
      const tasks = script.tasks || [];
      seen.messages = [];
      for (let i = 0; i < tasks.length; i += Math.max(1, maxBatch)) {
        const chunk = tasks.slice(i, i + Math.max(1, maxBatch));
        seen.messages.push(chunk.length);
        call.write(maxBatch ? { batch: { tasks: chunk } } : { task: chunk[0] });
      }
      open.add(call);
      call.on('cancelled', () => open.delete(call));
    },
    Heartbeat(call, cb) {
      seen.heartbeats.push(call.request.lease_ids);
      seen.progress = [...(seen.progress || []), ...call.request.progress];
      seen.draining.push(call.request.draining);
      if (call.request.draining && script.honorDraining !== false) {
        // like the gateway: what was already sent (scripted in transit), then OK
        for (const lease of open) {
          for (const t of script.inTransit || []) lease.write({ task: t });
          lease.end();
          seen.ended += 1;
        }
        open.clear();
      }
      cb(null, { lost_lease_ids: script.lost?.(call.request.lease_ids) || [],
        cancelled_lease_ids: script.cancelled?.(call.request.lease_ids) || [],
        heartbeat_interval_ms: script.heartbeatMs || 50 });
    },
    Ack(call, cb) {
      seen.acks.push(...call.request.items);
      for (const i of call.request.items) seen.at[i.lease_id] = Date.now();
      if (script.ackError) return cb({ code: script.ackError, details: 'stale lease' });
      return cb(null, { results: call.request.items.map((i) => ({ lease_id: i.lease_id,
        status: 'TASK_STATUS_SUCCEEDED' })) });
    },
    Fail(call, cb) {
      seen.fails.push(...call.request.items);
      for (const i of call.request.items) seen.at[i.lease_id] = Date.now();
      cb(null, { results: call.request.items.map((i) => script.failResult?.(i) || {
        lease_id: i.lease_id, status: 'TASK_STATUS_QUEUED' }) });
    },
  });
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(),
      (err, p) => (err ? reject(err) : resolve(p)));
  });
  return { seen, port, close: () => server.forceShutdown() };
}

function task(n, taskType, payload, extra = {}) {
  return { lease_id: `lease-${n}`, task_id: `${n}`.padStart(32, '0'), queue: 'q', task_type: taskType,
    payload: Buffer.from(JSON.stringify(payload)), content_type: 'application/json', attempt: 1,
    max_attempts: 3, timeout_ms: 60000, ...extra };
}

function startWorker(port, env = {}, deps = {}) {
  const config = loadConfig({ DTQ_QUEUE: 'q', DTQ_GATEWAY: `127.0.0.1:${port}`, DTQ_WORKER_ID: 'w1',
    DTQ_LOG_LEVEL: 'error', DTQ_DRAIN_GRACE_MS: '5000', ...env });
  const { broker, metadata } = createBroker(config);
  const worker = new Worker(config, { broker, metadata, handlers: defaultHandlers, ...deps });
  return { worker, done: worker.run() };
}

async function until(predicate, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error('condition not reached');
    await new Promise((r) => setTimeout(r, 10));
  }
}

module.exports = { fakeBroker, task, startWorker, until };
