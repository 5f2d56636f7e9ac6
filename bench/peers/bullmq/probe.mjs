// Handler-side recorder for the BullMQ peer: the same protocol as bench/peers/probe.py.
// Payload {k, t, n, pad}: k "w" warm-up, "d" drain, "l" latency; t = CLOCK_MONOTONIC ns.
import { writeFileSync, renameSync } from "node:fs";
import { join } from "node:path";

const state = { d: 0, first: 0n, lat: [], ready: false };
export const PAD = "x".repeat(60);

export function nowNs() {
  return process.hrtime.bigint();
}

export function payload(kind, count) {
  return { k: kind, t: Number(nowNs()), n: count, pad: PAD };
}

function write(name, data) {
  const out = process.env.BENCH_OUT_DIR;
  writeFileSync(join(out, name + ".part"), JSON.stringify(data));
  renameSync(join(out, name + ".part"), join(out, name));
}

export function hit(p) {
  const now = nowNs();
  if (p.k === "w") {
    if (!state.ready) {
      state.ready = true;
      write("ready.json", { t: Number(now) });
    }
  } else if (p.k === "d") {
    state.d += 1;
    if (state.d === 1) state.first = now;
    if (state.d === p.n) {
      write("drain.json", { first_ns: Number(state.first), last_ns: Number(now), n: state.d });
    }
  } else if (p.k === "l") {
    state.lat.push(Number(now - BigInt(p.t)) / 1e6);
    if (state.lat.length === p.n) write("latency.json", { latencies_ms: state.lat });
  }
}
