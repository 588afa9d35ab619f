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
#        RUN_SECONDS=3 BASE_REV=c74f623 PIN=1)
# Installs redis-server/redis-tools with apt-get when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGETS=${BUDGETS:-0,2,20,50,200}
ROUNDS=${ROUNDS:-2}
RUN_SECONDS=${RUN_SECONDS:-3}
BASE_REV=${BASE_REV:-c74f623}

. bench/redis_bench_lib.sh
need_redis

# The base gets this tree's bench source (for its CPU figures).
base_bench_bin "$BASE_REV" benches/redis_try_acquire.rs
BIN=$(bench_bin)
[ -x "$BIN" ] || { echo "could not build the bench" >&2; exit 1; }

pin_cores
start_redis "${SERVER_PIN[@]}"

for round in $(seq 1 "$ROUNDS"); do
    for us in ${BUDGETS//,/ }; do
        for who in guard "no guard"; do
            bin="$BIN"; [ "$who" = "no guard" ] && bin="$BASE_BIN"
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
