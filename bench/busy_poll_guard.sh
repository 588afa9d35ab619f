#!/usr/bin/env bash
# Busy polling with and without the backoff guard, one lone call at a time:
# our bench (benches/redis_try_acquire.rs, WHO=ours INFLIGHT=1) built from
# this tree ("guard") and, with the same bench source, from BASE_REV
# ("no guard", default c74f623: busy_poll without the guard), each run at
# every budget in BUDGETS (µs; 0 is off) against one redis-server of our own
# on a free loopback port (pinned to core 0, the clients to core 1). Prints
# one line per run: latency, and the bench process's CPU time per decision
# and as a share of one core.
#
# Usage: bench/busy_poll_guard.sh   (env: BUDGETS=0,2,20,50,200 ROUNDS=2
#        RUN_SECONDS=3 BASE_REV=c74f623)
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGETS=${BUDGETS:-0,2,20,50,200}
ROUNDS=${ROUNDS:-2}
RUN_SECONDS=${RUN_SECONDS:-3}
BASE_REV=${BASE_REV:-c74f623}

bench_bin() { # the bench executable built from the tree in the current directory
    cargo bench --bench redis_try_acquire --no-run 2>&1 | tee /dev/stderr \
        | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1
}

WORK=$(mktemp -d)
SERVER_PID=""
BASE_TREE="$WORK/base"
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    git worktree remove --force "$BASE_TREE" 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# The base gets this tree's bench source (for its CPU figures), and a
# target dir of its own.
git worktree add --detach "$BASE_TREE" "$BASE_REV" >&2
cp benches/redis_try_acquire.rs "$BASE_TREE/benches/redis_try_acquire.rs"
built=$(cd "$BASE_TREE" && CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/base-rev" bench_bin)
[ -x "$built" ] || { echo "could not build the bench at $BASE_REV" >&2; exit 1; }
cp "$built" "$WORK/base-bench"
built=$(bench_bin)
[ -x "$built" ] || { echo "could not build the bench" >&2; exit 1; }
cp "$built" "$WORK/bench"

SERVER_PIN=(); CLIENT_PIN=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
    SERVER_PIN=(taskset -c 0); CLIENT_PIN=(taskset -c 1)
fi
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"${SERVER_PIN[@]}" redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --dir "$WORK" --loglevel warning > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
    redis-cli -p "$PORT" PING >/dev/null 2>&1 && break
    sleep 0.05
done
redis-cli -p "$PORT" PING >/dev/null || { echo "redis-server did not start: $(cat "$WORK/server.log")" >&2; exit 1; }

for round in $(seq 1 "$ROUNDS"); do
    for us in ${BUDGETS//,/ }; do
        for who in guard "no guard"; do
            bin="$WORK/bench"; [ "$who" = "no guard" ] && bin="$WORK/base-bench"
            REDIS_URL="redis://127.0.0.1:$PORT/" WHO=ours INFLIGHT=1 RUN_SECONDS=$RUN_SECONDS \
                BUSY_POLL_US=$us "${CLIENT_PIN[@]}" "$bin" \
                | python3 -c "
import json, sys
r = json.loads(sys.stdin.read())
print(f\"round $round  busy_poll {$us:>4} us  {'$who':8}  mean {r['mean_us']:6} us  p50 {r['p50_us']:4}  \"
      f\"p99 {r['p99_us']:5}  client CPU {r['client_cpu_us_per_decision']:6} us/decision, \"
      f\"{r['client_cpu_share']:.3f} of a core  {r['per_sec']:.0f}/s\")"
        done
    done
done
