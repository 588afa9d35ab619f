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
WORK=$(mktemp -d)
PIDS=()
BASE_TREE=""
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [ -n "$BASE_TREE" ]; then git worktree remove --force "$BASE_TREE" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ping() { for _ in $(seq 1 200); do redis-cli -p "$1" PING >/dev/null 2>&1 && return; sleep 0.05; done; exit 1; }
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
PORT=$(free_port)
valgrind --tool=callgrind --callgrind-out-file="$WORK/server.%p" redis-server --port "$PORT" \
    --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" --loglevel warning >"$WORK/vg.log" 2>&1 &
VG=$!
PIDS+=("$VG")
wait_ping "$PORT"
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
bench_bin() {
    cargo bench --bench redis_try_acquire --no-run 2>&1 \
        | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1
}
BINS=("$(bench_bin)")
LABELS=("tree")
if [ -n "${BASE_REV:-}" ]; then
    BASE_TREE="$WORK/base"
    git worktree add --detach "$BASE_TREE" "$BASE_REV" >&2
    BINS+=("$(cd "$BASE_TREE" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/base-rev" bench_bin)")
    LABELS+=("@ $BASE_REV")
fi
PORT=$(free_port)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$WORK" \
    --loglevel warning >/dev/null 2>&1 &
PIDS+=("$!")
wait_ping "$PORT"
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
