#!/usr/bin/env bash
# Benchmark quorumq against RabbitMQ in one run (README "Benchmark").
#
# Builds the release binaries, then for each mode runs quorumq-perf ROUNDS
# times (default 3) against each broker, alternating: quorumq (started here
# on 127.0.0.1:$QUORUMQ_PORT, default 5673, fresh data dir per round) and
# RabbitMQ (expected running at $RABBITMQ_URL, default
# amqp://guest:guest@127.0.0.1:5672/%2f). Prints each run's rates, the broker's
# CPU seconds (from /proc, when the RabbitMQ node runs on this machine) and
# the client's, then min–max per broker. Each measured run follows a warm-up
# run of the same mode (20k messages) on the same broker.
#
# Modes (override with MODES): dl = 50k dead-letter arrival in the DLX target,
# dlc = 50k dead-letter with --consume-target, plain = 100k publish+consume;
# latency at a fixed rate: lat1k, lat2k, lat5k, lat10k (10 s each; e2e and
# confirm p50/p90/p99/p99.9/max), e.g. MODES="lat1k lat2k lat5k lat10k".
# Extra quorumq-perf flags: PERF_ARGS (e.g. "--client lapin").
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds="${ROUNDS:-3}"
modes="${MODES:-dl dlc plain}"
port="${QUORUMQ_PORT:-5673}"
rabbit_url="${RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
cargo build --release --quiet --bin quorumq --bin quorumq-perf
data="$(mktemp -d)"
qpid=""
cleanup() { [ -n "$qpid" ] && kill "$qpid" 2>/dev/null; rm -rf "$data"; }
trap cleanup EXIT

mode_args() {
  case "$1" in
    dl) echo "--messages ${2:-50000} --dead-letter" ;;
    dlc) echo "--messages ${2:-50000} --dead-letter --consume-target" ;;
    plain) echo "--messages ${2:-100000}" ;;
    lat*k) local r=$(( ${1//[!0-9]/} * 1000 )); echo "--messages ${2:-$((r * 10))} --rate $r" ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
  esac
}
# The rate a mode is judged by: dead-letter arrival, else consume.
headline() {
  case "$1" in
    dl) grep -oP '^dead-letter arrival.*= \K[0-9]+' ;;
    *) grep -oP '^consume.*= \K[0-9]+' ;;
  esac
}
cpu_of() { [ -n "$1" ] && awk '{print $14+$15}' "/proc/$1/stat" 2>/dev/null || echo 0; }

# The mode with 20k messages, not measured: a fresh process first faults in and
# zeroes the memory it then reuses (perf: clear_page_erms was 25 % of a first run).
warm_up() { # uri mode (a latency mode warms up with plain: no 20 s at a fixed rate)
  local mode=$2
  case "$mode" in lat*) mode=plain ;; esac
  ./target/release/quorumq-perf --uri "$1" --size 1024 --confirm 256 --prefetch 256 \
    $(mode_args "$mode" 20000) ${PERF_ARGS:-} >/dev/null 2>&1 || true
}

run_one() { # broker-label uri pid mode
  local t0 t1 out rate lost
  t0=$(cpu_of "$3")
  out=$( { /usr/bin/time -f "client_cpu_s=%U+%S" ./target/release/quorumq-perf --uri "$2" \
      --size 1024 --confirm 256 --prefetch 256 $(mode_args "$4") ${PERF_ARGS:-} ; } 2>&1 ) || true
  t1=$(cpu_of "$3")
  rate=$(echo "$out" | headline "$4" || echo 0)
  lost=$(echo "$out" | grep -oP '^lost: \K[0-9]+' || echo "?")
  echo "$4 $1 rate=${rate:-0} lost=$lost broker_cpu_s=$(awk -v a="$t0" -v b="$t1" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.2f", (b-a)/hz}') $(echo "$out" | grep -o 'client_cpu_s=.*')"
  case "$4" in lat*)
    echo "$4 $1 e2e: $(echo "$out" | grep -oP '^latency: \K.*')"
    echo "$4 $1 confirm: $(echo "$out" | grep -oP '^confirm latency: \K.*')" ;;
  esac
}

if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "port $port is taken; stop what listens there or set QUORUMQ_PORT" >&2
  exit 2
fi
results="$data/results"
for mode in $modes; do
  for r in $(seq "$rounds"); do
    rm -rf "$data/q"
    ./target/release/quorumq --amqp-listen "127.0.0.1:$port" --cluster-listen "127.0.0.1:$((port + 8))" \
      --data-dir "$data/q" >"$data/quorumq.log" 2>&1 &
    qpid=$!
    for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
    kill -0 "$qpid" 2>/dev/null || { cat "$data/quorumq.log" >&2; exit 1; }
    warm_up "amqp://guest:guest@127.0.0.1:$port/%2f" "$mode"
    run_one quorumq "amqp://guest:guest@127.0.0.1:$port/%2f" "$qpid" "$mode" | tee -a "$results"
    kill "$qpid"; wait "$qpid" 2>/dev/null || true; qpid=""
    rpid=$(pgrep -f beam.smp | head -1 || true)
    warm_up "$rabbit_url" "$mode"
    run_one rabbitmq "$rabbit_url" "$rpid" "$mode" | tee -a "$results"
  done
done
echo "=== summary (msg/s, min-max of $rounds; dl: arrival in the DLX target, else consume)"
for mode in $modes; do
  case "$mode" in lat*) grep -E "^$mode [a-z]+ (e2e|confirm):" "$results"; continue ;; esac
  q=$(awk -v m="$mode" '$1==m && $2=="quorumq" {sub("rate=","",$3); print $3}' "$results" | sort -n | sed -n '1p;$p' | paste -sd-)
  b=$(awk -v m="$mode" '$1==m && $2=="rabbitmq" {sub("rate=","",$3); print $3}' "$results" | sort -n | sed -n '1p;$p' | paste -sd-)
  echo "$mode: quorumq $q  RabbitMQ $b"
done
