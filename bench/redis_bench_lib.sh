# What bench/redis_compare.sh uses (sourced from the project root, after
# `set -euo pipefail`):
#   WORK        a temporary directory, removed on exit with everything below;
#   PIDS        processes to stop on exit (start_redis adds its server);
#   BASE_TREE   the worktree base_bench_bin made, removed on exit.

WORK=$(mktemp -d)
PIDS=()
BASE_TREE=""
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    if [ -n "$BASE_TREE" ]; then git worktree remove --force "$BASE_TREE" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
need_apt() { # package...
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "$@" >/dev/null
}

# Installs redis-server, redis-cli and redis-benchmark when one is missing.
need_redis() {
    command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null \
        && command -v redis-cli >/dev/null || need_apt redis-server redis-tools
}

# The redis_try_acquire bench executable built from the tree in the
# current directory (cargo's output goes to stderr). The bench is in the
# package resource-broker-benches; in trees older than that package, in
# the root package.
bench_bin() {
    local package=()
    if [ -f benches/Cargo.toml ]; then package=(-p resource-broker-benches); fi
    cargo bench "${package[@]}" --bench redis_try_acquire --no-run 2>&1 | tee /dev/stderr \
        | sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1
}

# base_bench_bin REV: builds the bench at REV in a worktree of its own and
# sets BASE_BIN to a copy of it. The base is built in a target dir of its
# own: cargo takes a build of the same crates from another tree for fresh
# when their sources are older.
base_bench_bin() {
    local target="${CARGO_TARGET_DIR:-$PWD/target}/base-rev" built
    BASE_TREE="$WORK/base"
    git worktree add --detach "$BASE_TREE" "$1" >&2
    built=$(cd "$BASE_TREE" && CARGO_TARGET_DIR="$target" bench_bin)
    [ -x "$built" ] || { echo "could not build the bench at $1" >&2; exit 1; }
    BASE_BIN="$WORK/base-bench"
    cp "$built" "$BASE_BIN"
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Sets SERVER_PIN and CLIENT_PIN: the server on core 0 and the clients on
# core 1, when there are two cores and taskset (PIN=0: no pinning).
pin_cores() {
    SERVER_PIN=(); CLIENT_PIN=()
    if [ "${PIN:-1}" = 1 ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null; then
        SERVER_PIN=(taskset -c 0); CLIENT_PIN=(taskset -c 1)
    fi
}

# start_redis [COMMAND...]: starts a redis-server of our own on a free
# loopback port, run through COMMAND (taskset) if given, and
# waits until it answers. Sets PORT and SERVER_PID.
start_redis() {
    PORT=$(free_port)
    "$@" redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$WORK" --loglevel warning > "$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
    for _ in $(seq 1 200); do
        redis-cli -p "$PORT" PING >/dev/null 2>&1 && return
        sleep 0.05
    done
    echo "redis-server did not start: $(cat "$WORK/server.log")" >&2
    exit 1
}
