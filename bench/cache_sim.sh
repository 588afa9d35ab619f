#!/usr/bin/env bash
# Cache misses per request of examples/webhook_server with this crate's
# layers, with no limiter, and with tower_governor (+ tower's concurrency
# limit), from valgrind's cachegrind: instructions (Ir), first-level
# instruction-cache misses (I1mr) and data-cache read and write misses
# (D1mr, D1mw) of the server's user-space code, on a simulated cache of
# fixed geometry (32 KiB 8-way first-level caches, 64-byte lines), so the
# figures do not depend on the machine.
#
# A server handles a request in ~29,000 instructions over more code and
# data than a first-level cache holds, so each request finds most of
# what it runs and reads evicted by the one before: a layer costs the
# lines it touches, not only the instructions it runs. (bench/http_load.sh
# measures the time and, with CALLGRIND=1, the instructions.)
#
# cachegrind cannot zero its counts in a running process, so each server
# runs twice under load, for SHORT and for LONG seconds, and the figures
# are the difference of the two runs divided by the difference of their
# requests: start-up, warm-up and shut-down cancel out.
#
# Usage: bench/cache_sim.sh   (env: SCENARIO=admit|admit-rate|deny SHORT=4 LONG=12 CONNS=32 LAYERS="none pressure governor"; BIN=<a saved webhook_server build> to measure it instead of building)
# Needs root or sudo for `apt-get install wrk valgrind` when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

SCENARIO=${SCENARIO:-admit}
SHORT=${SHORT:-4}
LONG=${LONG:-12}
CONNS=${CONNS:-32}
read -r -a LAYERS <<< "${LAYERS:-none pressure governor}"

. bench/webhook_lib.sh
install_missing wrk valgrind
build_webhook_server
scenario_limits "$SCENARIO"

WORK=$(mktemp -d)
SERVER=""
cleanup() {
    if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

write_post_lua "$WORK/post.lua"

# The server on one core (one tokio worker), wrk on the other.
SERVER_PIN=(); WRK_PIN=()
if [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null 2>&1; then
    SERVER_PIN=(taskset -c 0); WRK_PIN=(taskset -c 1)
fi

# Runs `layer`'s server under cachegrind with `secs` seconds of load;
# prints the requests served and cachegrind's totals
# (Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw).
measure() {
    local layer=$1 secs=$2 out="$WORK/cg.$1.$2" log="$WORK/server.$1.$2" port
    TOKIO_WORKER_THREADS=1 "${SERVER_PIN[@]}" valgrind --tool=cachegrind --cache-sim=yes \
        --I1=32768,8,64 --D1=32768,8,64 --LL=33554432,16,64 \
        --cachegrind-out-file="$out" "$BIN" --port 0 --layer "$layer" "${LIMITS[@]}" > "$log" 2>&1 &
    SERVER=$!
    port=$(server_port "$log") || exit 1
    "${WRK_PIN[@]}" wrk -t1 -c"$CONNS" -d"${secs}s" -s "$WORK/post.lua" \
        "http://127.0.0.1:$port/api/v1/webhooks/stripe" > "$WORK/wrk.$layer.$secs"
    # SIGTERM: the example shuts down gracefully and cachegrind writes its counts.
    kill -TERM "$SERVER"
    wait "$SERVER" || true
    SERVER=""
    local requests
    requests=$(grep -o '[0-9]* requests in' "$WORK/wrk.$layer.$secs" | awk '{print $1}')
    echo "$requests $(awk '/^summary:/ {$1 = ""; print}' "$out")"
}

echo "scenario $SCENARIO, loads of $SHORT s and $LONG s, $CONNS connections" >&2
for layer in "${LAYERS[@]}"; do
    echo "$layer $(measure "$layer" "$SHORT") $(measure "$layer" "$LONG")"
done > "$WORK/results"

python3 - "$WORK/results" <<'PY'
import sys
events = "Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw".split()
shown = ["Ir", "I1mr", "D1mr", "D1mw"]
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    layer, short, long = f[0], list(map(int, f[1:11])), list(map(int, f[11:21]))
    n = long[0] - short[0]
    rows[layer] = {e: (long[i + 1] - short[i + 1]) / n for i, e in enumerate(events)}
    rows[layer]["requests"] = n
print("| layer | requests counted | " + " | ".join(f"{e}/request" for e in shown) + " |")
print("| --- | ---: | " + " | ".join("---:" for _ in shown) + " |")
for layer, r in rows.items():
    print(f"| {layer} | {r['requests']} | " + " | ".join(f"{r[e]:,.1f}" for e in shown) + " |")
base = rows.get("none")
if base:
    print()
    for layer, r in rows.items():
        if layer != "none":
            print(f"{layer} - none: " + ", ".join(f"{e} {r[e] - base[e]:+,.1f}" for e in shown))
if "pressure" in rows and "governor" in rows:
    p, g = rows["pressure"], rows["governor"]
    print("pressure - governor: " + ", ".join(f"{e} {p[e] - g[e]:+,.1f}" for e in shown))
PY
