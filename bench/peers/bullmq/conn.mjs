// ioredis connection options from BENCH_REDIS_URL (redis://host:port/db).
export function connection() {
  const url = new URL(process.env.BENCH_REDIS_URL);
  return {
    host: url.hostname,
    port: Number(url.port),
    db: Number(url.pathname.slice(1) || "0"),
    maxRetriesPerRequest: null,
  };
}
