#!/usr/bin/env bash
# Instruction counts for one lone try decision, under valgrind's callgrind:
# unlike wall-clock figures, they hold on a shared, busy machine.
#   server  redis-server's instructions per EVALSHA (everything the server
#           does for it: reading, the script, the reply), sent by
#           redis-benchmark with 1 client: lua/try_flat.lua (the lone try of
#           a resource with one rate limit) with the arguments RedisBackend
#           sends, rate-limiter-flexible's script (RateLimiterRedis.consume),
#           and bench/token_bucket.lua.
#   client  the redis_try_acquire bench's instructions per decision, 1 in
#           flight: ours (RedisBackend, coalescing on) and the redis crate's
#           ConnectionManager with the minimal script; the difference of a
#           4 s and a 1 s run, so that start-up and warm-up cancel out.
# Usage: bench/redis_callgrind.sh
#   SCRIPT_REV=<rev>  also try_flat.lua as of that revision
#   BASE_REV=<rev>    the client figures also for the bench built at that
#                     revision (it must know WHO: 7e7b6d4 or later)
#   CALLS=3000        EVALSHA calls counted per server figure
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null && command -v callgrind_control >/dev/null \
    || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
CALLS=${CALLS:-3000}
. bench/redis_bench_lib.sh
need_redis
total() { awk '/^(summary|totals):/ {print $2; exit}' "$1"; }

# --- server ---
cp broker-redis/src/lua/try_flat.lua "$WORK/try_flat.lua"
if [ -n "${SCRIPT_REV:-}" ]; then
    git show "$SCRIPT_REV:broker-redis/src/lua/try_flat.lua" > "$WORK/try_flat_rev.lua"
fi
# rate-limiter-flexible 11, lib/RateLimiterRedis.js, incrTtlLuaScript.
cat > "$WORK/rlf.lua" <<'LUA'
redis.call('set', KEYS[1], 0, 'EX', ARGV[2], 'NX')
local consumed = redis.call('incrby', KEYS[1], ARGV[1])
local ttl = redis.call('pttl', KEYS[1])
if ttl == -1 then
  redis.call('expire', KEYS[1], ARGV[2])
  ttl = 1000 * ARGV[2]
end
return {consumed, ttl}
LUA
cp bench/token_bucket.lua "$WORK/minimal.lua"
start_redis valgrind --tool=callgrind --callgrind-out-file="$WORK/server.%p"
VG=$SERVER_PID
server_cost() { # name script args...
    local name=$1 script=$2; shift 2
    local sha
    sha=$(redis-cli -p "$PORT" SCRIPT LOAD "$(cat "$script")")
    redis-benchmark -p "$PORT" -c 1 -n 500 EVALSHA "$sha" "$@" >/dev/null
    callgrind_control -z "$VG" >/dev/null
    redis-benchmark -p "$PORT" -c 1 -n "$CALLS" EVALSHA "$sha" "$@" >/dev/null
    rm -f "$WORK"/server."$VG".*
    callgrind_control -d "$VG" >/dev/null
    local dump
    dump=$(ls -t "$WORK"/server."$VG".* | head -1)
    echo "server  $name: $(( $(total "$dump") / CALLS )) instructions per EVALSHA"
}
# One rate limit of 1000/s with a burst of 10^9 (never full again, never
# denied), server TIME, 1 s TTL margin: what the bench's RedisBackend sends.
OURS_ARGS=(2 'rb:{bench}:b' 'rb:{bench}:l' '' 1000 1 1000000000 1000 1000000 1)
server_cost "try_flat.lua (tree)" "$WORK/try_flat.lua" "${OURS_ARGS[@]}"
if [ -n "${SCRIPT_REV:-}" ]; then
    redis-cli -p "$PORT" DEL 'rb:{bench}:b' >/dev/null
    server_cost "try_flat.lua @ $SCRIPT_REV" "$WORK/try_flat_rev.lua" "${OURS_ARGS[@]}"
fi
server_cost "rate-limiter-flexible" "$WORK/rlf.lua" 1 'rlf:bench' 1 60 1000000000 60
server_cost "bench/token_bucket.lua" "$WORK/minimal.lua" 1 'tb:{bench}' 1000000000 0.001
kill "$VG"; wait "$VG" 2>/dev/null || true

# --- client ---
BINS=("$(bench_bin)")
LABELS=("tree")
if [ -n "${BASE_REV:-}" ]; then
    base_bench_bin "$BASE_REV"
    BINS+=("$BASE_BIN")
    LABELS+=("@ $BASE_REV")
fi
start_redis
for i in "${!BINS[@]}"; do
    for who in ours minimal; do
        for s in 1 4; do
            REDIS_URL="redis://127.0.0.1:$PORT/" WHO=$who INFLIGHT=1 RUN_SECONDS=$s \
                valgrind --tool=callgrind --callgrind-out-file="$WORK/client.$s" "${BINS[$i]}" 2>/dev/null \
                | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["decisions"])' \
                > "$WORK/decisions.$s"
        done
        python3 - "$who" "${LABELS[$i]}" "$(total "$WORK/client.1")" "$(total "$WORK/client.4")" \
            "$(cat "$WORK/decisions.1")" "$(cat "$WORK/decisions.4")" <<'PY'
import sys
who, label = sys.argv[1:3]
t1, t4, d1, d4 = map(int, sys.argv[3:7])
name = {"ours": "RedisBackend try_acquire", "minimal": "redis crate + minimal script"}[who]
print(f"client  {name} ({label}): {round((t4 - t1) / (d4 - d1))} instructions per decision")
PY
    done
done
