// rate-limiter-flexible's RateLimiterRedis.consume over ioredis, the
// peer users would pick instead of this crate's RedisBackend: `INFLIGHT`
// consumers on one key for `SECONDS`, then decisions per second, latency
// and Redis commands per decision (INFO commandstats).
//
// Usage: node bench/redis_rlf.js PORT INFLIGHT SECONDS
// (run by bench/redis_compare.sh, which installs the packages).
'use strict';

const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');

const [port, inflight, seconds] = process.argv.slice(2).map(Number);

function commandstats(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const m = /^cmdstat_([^:]+):calls=(\d+)/.exec(line.trim());
    // Leave out the control connection's own commands.
    if (m && !/^(config|info)/.test(m[1])) out[m[1]] = Number(m[2]);
  }
  return out;
}

async function run(limiter, n, ms) {
  const latencies = [];
  let allowed = 0;
  let denied = 0;
  const end = Date.now() + ms;
  async function worker() {
    while (Date.now() < end) {
      const t0 = process.hrtime.bigint();
      try {
        await limiter.consume('bench', 1);
        allowed++;
      } catch (e) {
        if (e instanceof Error) throw e;
        denied++;
      }
      latencies.push(Number(process.hrtime.bigint() - t0) / 1000);
    }
  }
  const started = process.hrtime.bigint();
  await Promise.all(Array.from({ length: n }, worker));
  const elapsed = Number(process.hrtime.bigint() - started) / 1e9;
  return { allowed, denied, elapsed, latencies };
}

(async () => {
  const redis = new Redis({ host: '127.0.0.1', port, enableOfflineQueue: true });
  const control = new Redis({ host: '127.0.0.1', port });
  // Same quota as the other runs: large enough that every call is allowed.
  const limiter = new RateLimiterRedis({
    storeClient: redis,
    keyPrefix: 'rlf',
    points: 1e9,
    duration: 60,
  });
  await run(limiter, inflight, 500); // warm-up (script load, JIT)
  await control.config('RESETSTAT');
  const r = await run(limiter, inflight, seconds * 1000);
  const info = await control.info('commandstats');
  const stats = commandstats(info);
  const usec = /cmdstat_evalsha:[^\n]*usec_per_call=([0-9.]+)/.exec(info);
  const decisions = r.allowed + r.denied;
  r.latencies.sort((a, b) => a - b);
  const pct = (p) => r.latencies[Math.min(r.latencies.length - 1, Math.floor(p * r.latencies.length))];
  const mean = r.latencies.reduce((a, b) => a + b, 0) / r.latencies.length;
  const perDecision = Object.fromEntries(
    Object.entries(stats).map(([k, v]) => [k, +(v / decisions).toFixed(3)]),
  );
  console.log(JSON.stringify({
    who: 'rate-limiter-flexible',
    inflight,
    decisions,
    allowed: r.allowed,
    per_sec: Math.round(decisions / r.elapsed),
    mean_us: +mean.toFixed(1),
    p50_us: +pct(0.5).toFixed(1),
    p99_us: +pct(0.99).toFixed(1),
    commands_per_decision: perDecision,
    evalsha_usec_per_call: usec ? Number(usec[1]) : null,
  }));
  redis.disconnect();
  control.disconnect();
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
