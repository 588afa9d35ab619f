# Sourced by bench/http_load.sh: the tools, the comparison server's build,
# its limits per scenario and wrk's request script.

# Installs each of the given Debian packages whose command is missing
# (as root, or through sudo).
install_missing() {
    local tool sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    for tool in "$@"; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            $sudo apt-get update -qq
            $sudo apt-get install -y -qq "$tool" >/dev/null
        fi
    done
}

# Builds the comparison server (benches/http_load_server.rs) in release
# and sets BIN to it; with BIN already set (a saved build, for an A/B of
# two builds), uses that.
build_load_server() {
    if [ -n "${BIN:-}" ]; then return 0; fi
    cargo build --release -p resource-broker-benches --bin http_load_server >&2
    BIN="${CARGO_TARGET_DIR:-target}/release/http_load_server"
}

# Sets LIMITS, the server's limits for SCENARIO: `admit` (every request
# admitted, with a concurrency limit), `admit-rate` (the same with rate
# limits only) or `deny` (the route at 100 rps: most requests answered
# 429).
scenario_limits() {
    case "$1" in
        admit) LIMITS=(--rps 1000000000 --concurrency 100000 --tenant-rpm 1000000000000) ;;
        admit-rate) LIMITS=(--rps 1000000000 --concurrency 0 --tenant-rpm 1000000000000) ;;
        deny) LIMITS=(--rps 100 --concurrency 200 --tenant-rpm 1000000000000) ;;
        *) echo "SCENARIO must be admit, admit-rate or deny" >&2; exit 2 ;;
    esac
}

# Writes to `file` wrk's script: a signed webhook POST for tenant acme.
write_post_lua() {
    local token
    token=$("$BIN" --print-token acme)
    cat > "$1" <<LUA
wrk.method = "POST"
wrk.body = '{"type":"invoice.paid"}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $token"
LUA
}

# Prints the port of the server whose output goes to `log`,
# once it has bound (at most 60 s); fails, with the log, if it has not.
server_port() {
    local port=""
    for _ in $(seq 1 600); do
        port=$(grep -o '127\.0\.0\.1:[0-9]*' "$1" 2>/dev/null | head -1 | cut -d: -f2 || true)
        [ -n "$port" ] && { echo "$port"; return 0; }
        sleep 0.1
    done
    echo "server did not start: $(cat "$1")" >&2
    return 1
}
