#!/usr/bin/env bash
# Load run of the HTTP layer: the webhook route of examples/webhook_server
# (served by benches/http_load_server.rs) with this crate's layers, with no
# limiter, and with tower_governor (+ tower's concurrency limit)
# configured with the same numbers, measured with wrk in one run:
# one server per variant, started and warmed up once, then measured over
# several rounds. In a round, every variant is loaded at the same time
# (`TOGETHER=1`, the default with two or more cores): the servers share
# one core, the wrk processes the other, so a slow spell on the machine
# slows every variant alike, and the ratios within a round are the
# figures to read. `TOGETHER=0` loads the variants one after another.
# A server keeps its place in memory and on the core for the whole run,
# and runs of the same binaries differed by ~1% depending on the order
# the servers were started in: `RESTART=1` starts them afresh before
# every round, in an order rotated each round, so that each variant
# starts first, second and third equally often (use a multiple of 3
# rounds). Without it, the servers start once, in the order of `LAYERS`.
# Limits are far above the offered load,
# so every request is admitted and the run measures what the limiter
# costs; `SCENARIO=deny` sets the route limit to 100 rps instead, so most
# requests are answered 429 and the run measures the denial path.
# `SCENARIO=admit-rate` is `admit` without a concurrency limit on either
# side (rate limits only: what tower_governor itself expresses; tower's
# concurrency limit frees its slot when the response head is ready, this
# crate's permit when the body ends).
#
# Usage: bench/http_load.sh            (env: DURATION=10s CONNS=64 ROUNDS=3 SCENARIO=admit TOGETHER=1 RESTART=0; SERVER_WORKERS=1: a pinned server's tokio workers)
# Needs root or sudo for `apt-get install wrk` when wrk is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
ROUNDS=${ROUNDS:-3}
SCENARIO=${SCENARIO:-admit}
RESTART=${RESTART:-0}
read -r -a LAYERS <<< "${LAYERS:-none pressure governor}"

. bench/webhook_lib.sh
install_missing wrk
build_load_server
scenario_limits "$SCENARIO"

WORK=$(mktemp -d)
declare -A PORT PID CPU0 WRK_PID
cleanup() {
    for pid in "${PID[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PID[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

write_post_lua "$WORK/post.lua"

# With two or more cores, the server gets one core and wrk the other; as
# root, both run at a raised priority so other work on the machine disturbs
# the comparison less. On its one core the server runs one tokio worker
# (`SERVER_WORKERS`, default 1 there): two workers on one core only take
# turns, and their hand-offs made the rounds vary more.
CORES=$(nproc)
PRIO=()
if [ "$(id -u)" -eq 0 ]; then PRIO=(nice -n -10); fi
if [ "$CORES" -ge 2 ] && command -v taskset >/dev/null 2>&1; then
    SERVER_PIN=(taskset -c 0); WRK_PIN=(taskset -c 1); WRK_THREADS=1
    export TOKIO_WORKER_THREADS=${SERVER_WORKERS:-1}
else
    SERVER_PIN=(); WRK_PIN=(); WRK_THREADS=2
fi

# Without a core of their own for the servers, the variants run one after
# another.
TOGETHER=${TOGETHER:-1}
if [ -z "${SERVER_PIN[*]}" ]; then TOGETHER=0; fi

TICKS=$(getconf CLK_TCK)
# utime + stime of a process, in clock ticks.
cpu_ticks() {
    awk '{print $14 + $15}' "/proc/$1/stat"
}

# Starts `layer`'s server on the servers' core and warms it up; every
# variant's server is started once, before the rounds, so no round pays
# for a start or a warm-up.
start_server() {
    local layer=$1
    local out="$WORK/server.$layer.out"
    "${PRIO[@]}" "${SERVER_PIN[@]}" "$BIN" --port 0 --layer "$layer" "${LIMITS[@]}" > "$out" 2>&1 &
    PID[$layer]=$!
    PORT[$layer]=$(server_port "$out") || exit 1
    "${PRIO[@]}" "${WRK_PIN[@]}" wrk -t"$WRK_THREADS" -c"$CONNS" -d2s -s "$WORK/post.lua" "$(url "$layer")" > /dev/null
}

stop_server() {
    kill "${PID[$1]}" 2>/dev/null || true
    wait "${PID[$1]}" 2>/dev/null || true
}

url() {
    echo "http://127.0.0.1:${PORT[$1]}/api/v1/webhooks/stripe"
}

# Starts wrk on `layer`'s server, in the background.
load_start() {
    local layer=$1
    CPU0[$layer]=$(cpu_ticks "${PID[$layer]}")
    "${PRIO[@]}" "${WRK_PIN[@]}" wrk -t"$WRK_THREADS" -c"$CONNS" -d"$DURATION" -s "$WORK/post.lua" "$(url "$layer")" > "$WORK/wrk.$layer.out" &
    WRK_PID[$layer]=$!
}

# Waits for `layer`'s wrk and prints its line: layer, requests/s, non-2xx
# responses, and the server's CPU µs per request.
load_finish() {
    local layer=$1
    local pid=${PID[$layer]}
    wait "${WRK_PID[$layer]}"
    local cpu1
    cpu1=$(cpu_ticks "$pid")
    local out="$WORK/wrk.$layer.out" rps non2xx total
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
    total=$(awk '/requests in/ {print $1}' "$out")
    non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out")
    if [ -z "$rps" ]; then
        echo "wrk gave no result for $layer:" >&2; cat "$out" >&2; exit 1
    fi
    local per_req
    per_req=$(python3 -c "print(f'{($cpu1 - ${CPU0[$layer]}) / $TICKS * 1e6 / $total:.2f}')")
    echo "$layer $rps ${non2xx:-0} $per_req"
}

echo "scenario=$SCENARIO duration=$DURATION connections=$CONNS rounds=$ROUNDS cores=$CORES together=$TOGETHER restart=$RESTART" >&2
for layer in "${LAYERS[@]}"; do start_server "$layer"; done
for round in $(seq 1 "$ROUNDS"); do
    # Every round rotates the order the variants are loaded in, so that no
    # variant always starts first (one after another) or last (together).
    n=${#LAYERS[@]}
    ORDER=()
    for i in $(seq 0 $((n - 1))); do ORDER+=("${LAYERS[$(((i + round - 1) % n))]}"); done
    if [ "$RESTART" = 1 ] && [ "$round" -gt 1 ]; then
        for layer in "${LAYERS[@]}"; do stop_server "$layer"; done
        for layer in "${ORDER[@]}"; do start_server "$layer"; done
    fi
    if [ "$TOGETHER" = 1 ]; then
        for layer in "${ORDER[@]}"; do load_start "$layer"; done
    fi
    for layer in "${ORDER[@]}"; do
        if [ "$TOGETHER" != 1 ]; then load_start "$layer"; fi
        # Not in a subshell: it waits for wrk, a child of this shell.
        load_finish "$layer" > "$WORK/line"
        line=$(cat "$WORK/line")
        echo "round $round: $line" >&2
        echo "$line" >> "$WORK/results"
    done
done

python3 - "$WORK/results" <<'PY'
import statistics, sys
unit = "CPU µs/request"
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
by = {}
for layer, rps, non2xx, cpu in rows:
    by.setdefault(layer, []).append((float(rps), int(non2xx), float(cpu)))
med = {k: statistics.median(r for r, _, _ in v) for k, v in by.items()}
cpu = {k: statistics.median(c for _, _, c in v) for k, v in by.items()}
print(f"| layer | requests/s (median) | all rounds | server {unit} (median) | non-2xx (last round) |")
print("| --- | ---: | --- | ---: | ---: |")
for k in ("none", "pressure", "governor"):
    v = by.get(k)
    if not v:
        continue
    per = f"{cpu[k]:.2f}"
    print(f"| {k} | {med[k]:.0f} | {', '.join(f'{r:.0f}' for r, _, _ in v)} | {per} | {v[-1][1]} |")
print()
PAIRS = (("pressure", "none"), ("pressure", "governor"), ("governor", "none"))
for a, b in PAIRS:
    if a in med and b in med:
        print(f"throughput {a} / {b} = {med[a] / med[b]:.3f}   {unit} {a} / {b} = {cpu[a] / cpu[b]:.3f}")
# The same ratios taken within each round (the variants of one round run
# back to back, so a slow spell on the machine tends to hit all of them):
# the median, and how many rounds had the first variant at least as fast.
print()
for a, b in PAIRS:
    pairs = [x[0] / y[0] for x, y in zip(by.get(a, []), by.get(b, []))]
    if pairs:
        ahead = sum(r >= 1 for r in pairs)
        print(f"per round: throughput {a} / {b} median {statistics.median(pairs):.3f}, "
              f"range {min(pairs):.3f}-{max(pairs):.3f}, {a} >= {b} in {ahead} of {len(pairs)}")
# Sharing the servers' core (`TOGETHER=1`), a variant's throughput is its
# share of that core over its CPU per request, and the scheduler need not
# give the servers equal shares (a few percent apart in a round is
# common): the CPU per request, per round, is the cost of the layer
# itself, and the shares say how much of a throughput ratio they made.
print()
for a, b in PAIRS:
    pairs = [x[2] / y[2] for x, y in zip(by.get(a, []), by.get(b, []))]
    if pairs:
        below = sum(r <= 1 for r in pairs)
        print(f"per round: {unit} {a} / {b} median {statistics.median(pairs):.3f}, "
              f"range {min(pairs):.3f}-{max(pairs):.3f}, {a} <= {b} in {below} of {len(pairs)}")
shares = {k: statistics.median(r * c / 1e6 for r, _, c in v) for k, v in by.items()}
print("server CPU share (cores, median per round): "
      + ", ".join(f"{k} {shares[k]:.3f}" for k in ("none", "pressure", "governor") if k in shares))
# Each variant's fastest round: other work on the machine only slows a
# round down, so the best round of each is the nearest to a quiet machine.
print()
for a, b in PAIRS:
    if a in by and b in by:
        best_a, best_b = max(r for r, _, _ in by[a]), max(r for r, _, _ in by[b])
        print(f"best round: throughput {a} / {b} = {best_a:.0f} / {best_b:.0f} = {best_a / best_b:.3f}")
PY
