// Drive the BullMQ peer: the same three measurements as bench/peers/runner.py.
// Usage: BENCH_REDIS_URL=redis://127.0.0.1:PORT/DB node bench.mjs SIZES_JSON OUT_DIR
// Last stdout line: BENCH_RESULT {json}.
import { Queue } from "bullmq";
import IORedis from "ioredis";
import { spawn } from "node:child_process";
import { existsSync, readFileSync, readdirSync, unlinkSync, mkdirSync, openSync } from "node:fs";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";
import { payload } from "./probe.mjs";
import { connection } from "./conn.mjs";

const here = dirname(fileURLToPath(import.meta.url));
const sizes = JSON.parse(process.argv[2]);
const out = process.argv[3];
const CONCURRENCY = 50;
mkdirSync(out, { recursive: true });
const redis = new IORedis(connection());
const queue = new Queue("bench", { connection: connection() });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };
const pct = (xs, q) => { const s = [...xs].sort((a, b) => a - b);
  return s[Math.max(0, Math.min(s.length - 1, Math.round((q / 100) * s.length + 0.5) - 1))]; };

async function flush() {
  await redis.flushdb();
  for (const f of readdirSync(out)) if (f.endsWith(".json")) unlinkSync(join(out, f));
}

function startWorker() {
  const log = openSync(join(out, "worker.log"), "a");
  return spawn(process.execPath, [join(here, "worker.mjs")], {
    env: { ...process.env, BENCH_OUT_DIR: out, BENCH_CONCURRENCY: String(CONCURRENCY) },
    stdio: ["ignore", log, log], detached: true,
  });
}

async function stopWorker(child) {
  if (child.exitCode !== null) return;
  const exited = new Promise((r) => child.once("exit", r));
  process.kill(-child.pid, "SIGTERM");
  const t = setTimeout(() => process.kill(-child.pid, "SIGKILL"), 10000);
  await exited;
  clearTimeout(t);
}

async function waitFile(name, timeoutS, child) {
  const deadline = Date.now() + timeoutS * 1000;
  while (!existsSync(join(out, name))) {
    if (child.exitCode !== null) throw new Error(`worker exited with ${child.exitCode}`);
    if (Date.now() > deadline) throw new Error(`no ${name} within ${timeoutS} s`);
    await sleep(10);
  }
  return JSON.parse(readFileSync(join(out, name), "utf8"));
}

async function enqueueOne() {
  await flush();
  const n = sizes.enqueue_n;
  const t0 = performance.now();
  for (let i = 0; i < n; i++) await queue.add("noop", payload("x", n));
  return n / ((performance.now() - t0) / 1000);
}

async function drain() {
  await flush();
  const n = sizes.backlog_n;
  const items = Array.from({ length: n }, () => ({ name: "noop", data: payload("d", n) }));
  const t0 = performance.now();
  for (let i = 0; i < n; i += 500) await queue.addBulk(items.slice(i, i + 500));
  const batch = n / ((performance.now() - t0) / 1000);
  const child = startWorker();
  try {
    const done = await waitFile("drain.json", sizes.timeout_s, child);
    return { enqueue_batch_per_s: batch, drain_per_s: (done.n - 1) / ((done.last_ns - done.first_ns) / 1e9) };
  } finally {
    await stopWorker(child);
  }
}

async function latency(windows) {
  await flush();
  const child = startWorker();
  try {
    const deadline = Date.now() + 60000;
    while (!existsSync(join(out, "ready.json")) && Date.now() < deadline && child.exitCode === null) {
      await queue.add("noop", payload("w", 1));
      await sleep(50);
    }
    const rate = sizes.latency_rate, count = Math.round(rate * sizes.latency_s);
    const p50s = [], p99s = [];
    for (let w = 0; w < windows; w++) {
      if (existsSync(join(out, "latency.json"))) unlinkSync(join(out, "latency.json"));
      const t0 = performance.now();
      for (let i = 0; i < count; i++) {
        const delay = t0 + (i * 1000) / rate - performance.now();
        if (delay > 0) await sleep(delay);
        await queue.add("noop", payload("l", (w + 1) * count));
      }
      const lat = (await waitFile("latency.json", 60, child)).latencies_ms.slice(-count);
      p50s.push(pct(lat, 50));
      p99s.push(pct(lat, 99));
    }
    return { e2e_p50_ms: median(p50s), e2e_p99_ms: median(p99s) };
  } finally {
    await stopWorker(child);
  }
}

async function main() {
  const rep = sizes.repeat;
  const version = JSON.parse(readFileSync(createRequire(import.meta.url).resolve("bullmq/package.json"), "utf8")).version;
  const result = { peer: "bullmq", version: `bullmq ${version}`,
    config: `Worker concurrency ${CONCURRENCY}, job defaults (completed jobs kept), addBulk of 500` };
  const one = [];
  for (let r = 0; r < rep; r++) one.push(await enqueueOne());
  result.enqueue_one_per_s = Math.round(median(one) * 10) / 10;
  const drains = [];
  for (let r = 0; r < rep; r++) drains.push(await drain());
  for (const k of Object.keys(drains[0])) result[k] = Math.round(median(drains.map((d) => d[k])) * 1000) / 1000;
  Object.assign(result, await latency(rep));
  await flush();
  await queue.close();
  redis.disconnect();
  console.log("BENCH_RESULT " + JSON.stringify(result));
}

main().catch((err) => { console.error(err); process.exit(1); });
