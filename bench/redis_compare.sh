#!/usr/bin/env bash
# Redis comparison: one redis-server of our own on a free loopback port,
# and against it, round after round:
#   raw   redis-benchmark running a minimal token bucket (bench/token_bucket.lua)
#         by EVALSHA: 1 client, 50 clients, and 50 clients pipelined (-P 16);
#   rlf   rate-limiter-flexible's RateLimiterRedis.consume on ioredis
#         (bench/redis_rlf.js), 1 and 50 in flight;
#   ours  ResourceBroker::try_acquire through RedisBackend
#         (benches/redis_try_acquire.rs), 1 and 50 in flight, with
#         coalescing on (the default) and off, and beside it the same
#         minimal token bucket by EVALSHA through the redis crate's
#         ConnectionManager (the client library alone).
# Every run uses one key and a quota that allows every call. Redis commands
# per decision come from INFO commandstats (reset before each run); the
# other commands listed run inside the script. Without coalescing, EVALSHA
# calls per decision are the round trips (1). With coalescing, one EVALSHA
# carries several concurrent decisions (each still waits for one round
# trip): EVALSHA calls per decision fall below 1, and the summary gives
# decisions per EVALSHA and the server's EVALSHA time per decision. The server is pinned to one core and the clients to
# the other. Prints one JSON line per run, then a summary with the ratios.
#
# Usage: bench/redis_compare.sh     (env: RUN_SECONDS=3 ROUNDS=2 PIN=1)
# BASE_REV=<git revision> also runs the bench built at that revision (in a
# temporary worktree), right after ours in every round, labelled "@base":
# before and after a change, against the same server in the same run.
# Every run of the bench reports the client process's CPU time per decision.
# Installs redis-server/redis-tools and node/npm with apt-get when missing,
# and the two npm packages into bench-tools/node (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."

RUN_SECONDS=${RUN_SECONDS:-3}
ROUNDS=${ROUNDS:-2}
NODE_DIR=bench-tools/node

. bench/redis_bench_lib.sh
need_redis
command -v node >/dev/null && command -v npm >/dev/null || need_apt nodejs npm
if [ ! -d "$NODE_DIR/node_modules/rate-limiter-flexible" ] || [ ! -d "$NODE_DIR/node_modules/ioredis" ]; then
    mkdir -p "$NODE_DIR"
    npm install --prefix "$NODE_DIR" --no-audit --no-fund --silent rate-limiter-flexible@11 ioredis@5 >&2
fi

BASE_BIN=""
if [ -n "${BASE_REV:-}" ]; then
    base_bench_bin "$BASE_REV"
fi
BIN=$(bench_bin)
[ -x "$BIN" ] || { echo "could not find the redis_try_acquire bench binary" >&2; exit 1; }

pin_cores
start_redis "${SERVER_PIN[@]}"
CLI=(redis-cli -h 127.0.0.1 -p "$PORT")
SHA=$("${CLI[@]}" SCRIPT LOAD "$(cat bench/token_bucket.lua)")

# redis-benchmark is bounded by count: about RUN_SECONDS at the expected rate.
raw() { # clients pipeline requests-per-second-estimate
    local clients=$1 pipeline=$2 n=$(( $3 * RUN_SECONDS ))
    "${CLI[@]}" CONFIG RESETSTAT >/dev/null
    local csv
    csv=$("${CLIENT_PIN[@]}" redis-benchmark -h 127.0.0.1 -p "$PORT" -c "$clients" -P "$pipeline" -n "$n" --csv \
        EVALSHA "$SHA" 1 'tb:{bench}' 1000000000 0.001 | tail -1)
    local stats
    stats=$("${CLI[@]}" INFO commandstats | tr -d '\r')
    python3 - "$clients" "$pipeline" "$n" "$csv" "$stats" <<'PY'
import csv, json, sys
clients, pipeline, n = map(int, sys.argv[1:4])
row = next(csv.reader([sys.argv[4]]))
calls = {}
usec = None
for line in sys.argv[5].splitlines():
    if line.startswith("cmdstat_evalsha:"):
        usec = float(line.split("usec_per_call=")[1].split(",")[0])
    if line.startswith("cmdstat_"):
        name, rest = line[len("cmdstat_"):].split(":", 1)
        if not name.startswith(("config", "info")):
            calls[name] = int(rest.split(",")[0].split("=")[1])
print(json.dumps({
    "who": "raw EVALSHA", "inflight": clients * pipeline, "clients": clients, "pipeline": pipeline,
    "decisions": n, "per_sec": round(float(row[1])), "mean_us": round(float(row[2]) * 1000, 1),
    "p50_us": round(float(row[4]) * 1000, 1), "p99_us": round(float(row[6]) * 1000, 1),
    "commands_per_decision": {k: round(v / n, 3) for k, v in sorted(calls.items())},
    "evalsha_usec_per_call": usec,
    "decisions_per_evalsha": round(n / calls["evalsha"], 2) if calls.get("evalsha") else None,
    "server_usec_per_decision": round(usec * calls.get("evalsha", 0) / n, 2) if usec else None,
}, sort_keys=True))
PY
}

RESULTS="$WORK/results.jsonl"
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round of $ROUNDS" >&2
    {
        raw 1 1 15000
        raw 50 1 60000
        raw 50 16 120000
        for n in 1 50; do
            NODE_PATH="$PWD/$NODE_DIR/node_modules" "${CLIENT_PIN[@]}" node bench/redis_rlf.js "$PORT" "$n" "$RUN_SECONDS"
        done
        REDIS_URL="redis://127.0.0.1:$PORT/" INFLIGHT=1,50 RUN_SECONDS=$RUN_SECONDS \
            "${CLIENT_PIN[@]}" env -u BUSY_POLL_US "$BIN"
        if [ -n "$BASE_BIN" ]; then
            REDIS_URL="redis://127.0.0.1:$PORT/" INFLIGHT=1,50 RUN_SECONDS=$RUN_SECONDS \
                "${CLIENT_PIN[@]}" env -u BUSY_POLL_US "$BASE_BIN" | sed 's/"who":"\([^"]*\)"/"who":"\1 @base"/'
        fi
    } | sed "s/^{/{\"round\": $round, /" | tee -a "$RESULTS"
done

python3 - "$RESULTS" <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def rows(who, inflight, pipeline=None):
    return [r for r in runs if r["who"] == who and r["inflight"] == inflight
            and (pipeline is None or r.get("pipeline") == pipeline)]
OURS, OFF = "resource-broker RedisBackend", "resource-broker RedisBackend coalescing off"
RLF, RAW, RS = "rate-limiter-flexible", "raw EVALSHA", "redis-rs minimal script"
print()
print("per round: decisions/s (mean latency); EVALSHA calls per decision and decisions per EVALSHA;")
print("server (EVALSHA) time per decision")
for rnd in sorted({r["round"] for r in runs}):
    get = lambda who, n, p=None: next(r for r in rows(who, n, p) if r["round"] == rnd)
    ours1, ours50 = get(OURS, 1), get(OURS, 50)
    off1, off50 = get(OFF, 1), get(OFF, 50)
    rlf1, rlf50 = get(RLF, 1), get(RLF, 50)
    raw1, raw50, rawp = get(RAW, 1, 1), get(RAW, 50, 1), get(RAW, 800, 16)
    rs1, rs50 = get(RS, 1), get(RS, 50)
    for r in (raw1, raw50, rawp, rlf1, rlf50, rs1, rs50, off1, off50, ours1, ours50):
        label = r["who"] + (f" -c {r['clients']} -P {r['pipeline']}" if "clients" in r else f" {r['inflight']} in flight")
        evalsha = r["commands_per_decision"].get("evalsha", 0)
        per = r.get("decisions_per_evalsha") or (round(1 / evalsha, 2) if evalsha else None)
        server = r.get("server_usec_per_decision")
        if server is None and r.get("evalsha_usec_per_call") is not None:
            server = round(r["evalsha_usec_per_call"] * evalsha, 2)
        print(f"  round {rnd}  {label:56} {r['per_sec']:>8}/s  ({r['mean_us']} us)  "
              f"evalsha/decision {evalsha}  decisions/evalsha {per}  server us/decision {server}")
    print(f"  round {rnd}  ours 50 / rate-limiter-flexible 50      = {ours50['per_sec'] / rlf50['per_sec']:.2f}")
    print(f"  round {rnd}  ours 50 / raw EVALSHA -c 50 -P 16       = {ours50['per_sec'] / rawp['per_sec']:.2f}")
    print(f"  round {rnd}  ours 50 / raw EVALSHA -c 50             = {ours50['per_sec'] / raw50['per_sec']:.2f}")
    print(f"  round {rnd}  ours 50 / redis-rs minimal script 50    = {ours50['per_sec'] / rs50['per_sec']:.2f}")
    print(f"  round {rnd}  ours 50 / ours coalescing off 50        = {ours50['per_sec'] / off50['per_sec']:.2f}")
    print(f"  round {rnd}  latency, 1 in flight: ours {ours1['mean_us']} us, rate-limiter-flexible "
          f"{rlf1['mean_us']} us (ratio {ours1['mean_us'] / rlf1['mean_us']:.2f}), coalescing off "
          f"{off1['mean_us']} us, raw {raw1['mean_us']} us, redis-rs minimal script {rs1['mean_us']} us")
    cpu = lambda r: r.get("client_cpu_us_per_decision")
    print(f"  round {rnd}  ours (default): 1 in flight {ours1['mean_us']} us, p50 {ours1['p50_us']} us, "
          f"p99 {ours1['p99_us']} us, client CPU {cpu(ours1)} us/decision; 50 in flight {ours50['per_sec']}/s, "
          f"client CPU {cpu(ours50)} us/decision")
    if rows(OURS + " @base", 1):
        base1, base50 = get(OURS + " @base", 1), get(OURS + " @base", 50)
        print(f"  round {rnd}  @base: 1 in flight {base1['mean_us']} us (ratio to rate-limiter-flexible "
              f"{base1['mean_us'] / rlf1['mean_us']:.2f}, server us/decision {base1.get('server_usec_per_decision')}); "
              f"50 in flight {base50['per_sec']}/s ({base50['per_sec'] / rlf50['per_sec']:.2f} of rate-limiter-flexible)")
        print(f"  round {rnd}  ours / @base, mean latency at 1 in flight = {ours1['mean_us'] / base1['mean_us']:.2f}")
PY
