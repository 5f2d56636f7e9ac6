// One BullMQ worker process with a no-op handler (concurrency from BENCH_CONCURRENCY).
import { Worker } from "bullmq";
import { hit } from "./probe.mjs";
import { connection } from "./conn.mjs";

const worker = new Worker("bench", async (job) => { hit(job.data); }, {
  connection: connection(),
  concurrency: Number(process.env.BENCH_CONCURRENCY || "50"),
});
worker.on("error", (err) => console.error("worker error", err.message));
const stop = async () => { await worker.close(); process.exit(0); };
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
