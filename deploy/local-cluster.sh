#!/usr/bin/env bash
# Runs an N-node quorumq cluster on this machine (127.0.0.1), one process per
# node, for development and fault experiments. See deploy/README.md.
#
#   deploy/local-cluster.sh start|stop|status|kill N|restart N [options]
#
# Options (before or after the subcommand, `--opt V` or `--opt=V`):
#   --nodes N          cluster size (default 3)
#   --amqp-base P      node i's AMQP port is P+i-1 (default 5672)
#   --cluster-base C   node i's cluster/admin gRPC port is C+i-1 (default 5680)
#   --data DIR         data root (default ./data): node i keeps its files under
#                      DIR/node-i/, its pid in DIR/node-i.pid, its log in DIR/node-i.log
#
# `start` remembers --nodes/--amqp-base/--cluster-base in DIR/local-cluster.conf;
# later subcommands on the same DIR use them unless given again.
# Binaries: target/release/{quorumq,quorumqctl} (built with cargo if missing),
# or the directory in $QUORUMQ_BIN_DIR. $QUORUMQ_START_TIMEOUT: seconds `start`
# waits for each node's "quorumq ready" log line (default 60).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
READY_LINE="quorumq ready"
STOP_TIMEOUT=30
START_TIMEOUT="${QUORUMQ_START_TIMEOUT:-60}"

NODES=""
AMQP_BASE=""
CLUSTER_BASE=""
DATA="./data"
CMD=""
TARGET=""

usage() {
    sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

die() {
    echo "local-cluster: $*" >&2
    exit 1
}

# Dies unless $2 is a decimal integer in $3..$4 (no leading zeros: bash would
# read 010 as octal); $1 names it in the message.
check_range() {
    if ! [[ "$2" =~ ^(0|[1-9][0-9]{0,5})$ ]] || (($2 < $3 || $2 > $4)); then
        die "$1 must be an integer in $3..$4, not '$2'"
    fi
}

# Dies when option $1 has no value (the rest of the arguments, $2..., is empty).
need_value() {
    (($# > 1)) || die "$1 needs a value"
}

# --- arguments ----------------------------------------------------------------

while (($# > 0)); do
    arg="$1"
    shift
    case "$arg" in
        --*=*) set -- "${arg%%=*}" "${arg#*=}" "$@" ;; # --opt=V is --opt V
        --nodes) need_value "$arg" "$@" && NODES="$1" && shift ;;
        --amqp-base) need_value "$arg" "$@" && AMQP_BASE="$1" && shift ;;
        --cluster-base) need_value "$arg" "$@" && CLUSTER_BASE="$1" && shift ;;
        --data) need_value "$arg" "$@" && DATA="$1" && shift ;;
        -h | --help)
            usage
            exit 0
            ;;
        -*) die "unknown option $arg (see --help)" ;;
        *)
            if [[ -z "$CMD" ]]; then
                CMD="$arg"
            elif [[ -z "$TARGET" ]]; then
                TARGET="$arg"
            else
                die "unexpected argument $arg"
            fi
            ;;
    esac
done

[[ -n "$CMD" ]] || {
    usage >&2
    exit 2
}
[[ -n "$DATA" ]] || die "--data must not be empty"
CONF="$DATA/local-cluster.conf"

# Options not given on the command line come from the last `start` on this
# data dir, else the defaults.
load_conf() {
    local key value
    [[ -f "$CONF" ]] || return 0
    while IFS='=' read -r key value; do
        case "$key" in
            nodes) [[ -n "$NODES" ]] || NODES="$value" ;;
            amqp_base) [[ -n "$AMQP_BASE" ]] || AMQP_BASE="$value" ;;
            cluster_base) [[ -n "$CLUSTER_BASE" ]] || CLUSTER_BASE="$value" ;;
        esac
    done <"$CONF"
}

load_conf
NODES="${NODES:-3}"
AMQP_BASE="${AMQP_BASE:-5672}"
CLUSTER_BASE="${CLUSTER_BASE:-5680}"
check_range --nodes "$NODES" 1 99
check_range --amqp-base "$AMQP_BASE" 1 $((65536 - NODES))
check_range --cluster-base "$CLUSTER_BASE" 1 $((65536 - NODES))
check_range QUORUMQ_START_TIMEOUT "$START_TIMEOUT" 1 86400

case "$CMD" in
    kill | restart)
        [[ -n "$TARGET" ]] || die "$CMD needs a node number (1..$NODES)"
        check_range "node number" "$TARGET" 1 "$NODES"
        ;;
    start | stop | status)
        [[ -z "$TARGET" ]] || die "$CMD takes no node number"
        ;;
    *)
        die "unknown subcommand '$CMD' (start|stop|status|kill N|restart N)"
        ;;
esac

# --- helpers ------------------------------------------------------------------

amqp_port() { echo $((AMQP_BASE + $1 - 1)); }
cluster_port() { echo $((CLUSTER_BASE + $1 - 1)); }
pid_file() { echo "$DATA/node-$1.pid"; }
log_file() { echo "$DATA/node-$1.log"; }

peers() {
    local i out=""
    for ((i = 1; i <= NODES; i++)); do
        out+="${out:+,}$i=127.0.0.1:$(cluster_port "$i")"
    done
    echo "$out"
}

bin_dir() {
    echo "${QUORUMQ_BIN_DIR:-$ROOT/target/release}"
}

# Makes sure the binaries named ($@: quorumq, quorumqctl) are in bin_dir;
# builds both (release) when one is missing, unless $QUORUMQ_BIN_DIR is set.
ensure_bins() {
    local dir b
    dir="$(bin_dir)"
    for b in "$@"; do
        [[ ! -x "$dir/$b" ]] || continue
        [[ -z "${QUORUMQ_BIN_DIR:-}" ]] || die "$b not found in QUORUMQ_BIN_DIR=$dir"
        echo "building quorumq and quorumqctl (release) ..." >&2
        cargo build --release --manifest-path "$ROOT/Cargo.toml" --bin quorumq --bin quorumqctl >&2
        [[ -x "$dir/$b" ]] || die "build left no $b in $dir"
    done
}

# True when PID is a live (not zombie) quorumq process.
alive() {
    local pid="$1" state comm
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || return 1
    if [[ -r "/proc/$pid/stat" ]]; then
        state="$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)" || return 1
        [[ "$state" != Z ]] || return 1
        comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
        [[ "$comm" == quorumq ]] || return 1
    fi
    return 0
}

# The pid of node $1 if it is running, else nothing (and status 1).
node_pid() {
    local f pid
    f="$(pid_file "$1")"
    [[ -f "$f" ]] || return 1
    pid="$(cat "$f")"
    alive "$pid" || return 1
    echo "$pid"
}

# Prints the last 30 lines node $1 logged since byte $2 of its log, up to a
# Rust backtrace (RUST_BACKTRACE) if there is one.
log_tail() {
    local log
    log="$(log_file "$1")"
    echo "--- last lines of $log ---" >&2
    tail -c +"$(($2 + 1))" "$log" | awk '/^[Ss]tack backtrace:$/ { print "(backtrace omitted)"; exit } { print }' |
        tail -n 30 >&2 || true
    echo "---" >&2
}

# Launches node $1 in the background; prints the byte offset its log had
# before the launch (readiness is looked for after it).
launch() {
    local i="$1" log offset pid
    local args=(
        --node-id "$i"
        --amqp-listen "127.0.0.1:$(amqp_port "$i")"
        --cluster-listen "127.0.0.1:$(cluster_port "$i")"
        --data-dir "$DATA"
        --peers "$(peers)"
    )
    log="$(log_file "$i")"
    printf '# %s local-cluster: %s %s\n' "$(date '+%Y-%m-%dT%H:%M:%S%z')" \
        "$(bin_dir)/quorumq" "${args[*]}" >>"$log"
    offset="$(wc -c <"$log" | tr -d ' ')"
    NO_COLOR=1 nohup "$(bin_dir)/quorumq" "${args[@]}" >>"$log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$(pid_file "$i")"
    echo "$offset"
}

# Waits until node $1 (pid $2) logs the ready line after byte $3 of its log.
wait_ready() {
    local i="$1" pid="$2" offset="$3" log deadline
    log="$(log_file "$i")"
    deadline=$((SECONDS + START_TIMEOUT))
    while true; do
        if tail -c +"$((offset + 1))" "$log" | grep -q "$READY_LINE"; then
            return 0
        fi
        if ! alive "$pid"; then
            echo "node $i (pid $pid) exited before it was ready" >&2
            log_tail "$i" "$offset"
            return 1
        fi
        if ((SECONDS >= deadline)); then
            echo "node $i (pid $pid) not ready after ${START_TIMEOUT}s" >&2
            log_tail "$i" "$offset"
            return 1
        fi
        sleep 0.2
    done
}

# Starts the given nodes that are not running, then waits for all of them
# (a node may only get ready once a quorum of its peers runs).
start_nodes() {
    local i pid failed=0
    local -a started=() offsets=()
    ensure_bins quorumq
    mkdir -p "$DATA"
    for i in "$@"; do
        if pid="$(node_pid "$i")"; then
            echo "node $i already running (pid $pid)"
            continue
        fi
        offsets[i]="$(launch "$i")"
        started+=("$i")
    done
    for i in ${started[@]+"${started[@]}"}; do
        pid="$(cat "$(pid_file "$i")")"
        if wait_ready "$i" "$pid" "${offsets[i]}"; then
            echo "node $i ready (pid $pid): amqp://guest:guest@127.0.0.1:$(amqp_port "$i")/%2f," \
                "admin http://127.0.0.1:$(cluster_port "$i")"
        else
            failed=1
        fi
    done
    return "$failed"
}

# Stops the given nodes: SIGTERM, then SIGKILL after $STOP_TIMEOUT seconds.
stop_nodes() {
    local i pid deadline
    local -a pids=() nodes=()
    for i in "$@"; do
        if pid="$(node_pid "$i")"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
            nodes+=("$i")
            echo "node $i: SIGTERM sent (pid $pid)"
        fi
    done
    deadline=$((SECONDS + STOP_TIMEOUT))
    for pid in ${pids[@]+"${pids[@]}"}; do
        while alive "$pid" && ((SECONDS < deadline)); do
            sleep 0.2
        done
        if alive "$pid"; then
            echo "pid $pid still running after ${STOP_TIMEOUT}s: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
    done
    for i in ${nodes[@]+"${nodes[@]}"}; do
        rm -f "$(pid_file "$i")"
        echo "node $i stopped"
    done
}

save_conf() {
    mkdir -p "$DATA"
    printf 'nodes=%s\namqp_base=%s\ncluster_base=%s\n' "$NODES" "$AMQP_BASE" "$CLUSTER_BASE" >"$CONF"
}

all_nodes() {
    seq 1 "$NODES"
}

# --- subcommands --------------------------------------------------------------

case "$CMD" in
    start)
        save_conf
        # shellcheck disable=SC2046 # node numbers, one word each
        start_nodes $(all_nodes)
        ;;
    stop)
        # shellcheck disable=SC2046
        stop_nodes $(all_nodes)
        ;;
    kill)
        if pid="$(node_pid "$TARGET")"; then
            kill -KILL "$pid"
            while alive "$pid"; do
                sleep 0.1
            done
            rm -f "$(pid_file "$TARGET")"
            echo "node $TARGET killed (kill -9, pid $pid)"
        else
            echo "node $TARGET is not running"
        fi
        ;;
    restart)
        stop_nodes "$TARGET"
        start_nodes "$TARGET"
        ;;
    status)
        first=""
        for i in $(all_nodes); do
            if pid="$(node_pid "$i")"; then
                echo "node $i: running (pid $pid) amqp 127.0.0.1:$(amqp_port "$i") cluster 127.0.0.1:$(cluster_port "$i")"
                first="${first:-$i}"
            else
                echo "node $i: not running"
            fi
        done
        if [[ -z "$first" ]]; then
            echo "no node running"
            exit 3
        fi
        ensure_bins quorumqctl
        echo
        "$(bin_dir)/quorumqctl" --node "http://127.0.0.1:$(cluster_port "$first")" cluster_status
        ;;
esac
