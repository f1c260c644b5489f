#!/usr/bin/env bash
# 3-node quorumq against 3-node RabbitMQ 3.10.8 on this machine, same client,
# same run (cluster issue, benchmark). One broker cluster runs at a time (the
# other's idle nodes would take CPU); rounds alternate quorumq, RabbitMQ.
#
# Per round and broker (quorum queues, 3 replicas, 1 KiB persistent, confirm
# window 256, prefetch 256, 1 producer + 1 consumer, quorumq-perf lean client):
#   leader    client on the queue leader's node (node 1), MESSAGES msgs
#   follower  queue declared through node 1, client on node 2 (forwarding)
#   dl        at-least-once dead-lettering, arrival in the DLX target, DL_MESSAGES
#   latency   fixed RATE msg/s for LAT_MESSAGES: e2e p50/p99
#   kill9     confirm gap when the leader's node is killed (-9) under a
#             sequential confirmed publisher on node 2 (failover.py)
#   sigstop   same with SIGSTOP (SIGCONT afterwards)
#
#   cluster-tests/bench/cluster-compare.sh          # ROUNDS=2
#   ROUNDS=1 SCENARIOS="leader follower" cluster-tests/bench/cluster-compare.sh
#   BROKERS=quorumq SCENARIOS=kill9 ROUNDS=3 cluster-tests/bench/cluster-compare.sh
# Needs: rabbitmq-server installed (apt), root (for ../shared/tools/rmq3-cluster.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-2}
SCENARIOS=${SCENARIOS:-"leader follower dl latency kill9 sigstop"}
BROKERS=${BROKERS:-"quorumq rabbitmq"}
MESSAGES=${MESSAGES:-50000}
DL_MESSAGES=${DL_MESSAGES:-20000}
RATE=${RATE:-2000}
LAT_MESSAGES=${LAT_MESSAGES:-20000}
RMQ3=${RMQ3:-$(cd .. && pwd)/shared/tools/rmq3-cluster.sh}
Q_AMQP=5701   # quorumq node i: AMQP 5700+i, cluster 5750+i (RabbitMQ's r1-r3 use 5681-5683)
Q_CLUSTER=5751
cargo build --release --quiet --bin quorumq --bin quorumqctl --bin quorumq-perf
python3 -c 'import pika' 2>/dev/null || python3 -m pip install --quiet pika \
  || python3 -m pip install --quiet --break-system-packages pika
DATA=$(mktemp -d /tmp/quorumq-cluster-bench.XXXXXX)
LC=(deploy/local-cluster.sh --nodes 3 --amqp-base "$Q_AMQP" --cluster-base "$Q_CLUSTER" --data "$DATA")
export QUORUMQ_BIN_DIR="${QUORUMQ_BIN_DIR:-$PWD/target/release}"
cleanup() {
  "${LC[@]}" stop >/dev/null 2>&1 || true
  "$RMQ3" stop >/dev/null 2>&1 || true
  if [ -n "${KEEP_DATA:-}" ]; then echo "data and logs kept in $DATA" >&2; else rm -rf "$DATA"; fi
}
trap cleanup EXIT
RESULTS="$DATA/results"

port_of() { # broker node -> AMQP port
  if [ "$1" = quorumq ]; then echo $((Q_AMQP + $2 - 1)); else echo $((5680 + $2)); fi
}
uri() { echo "amqp://guest:guest@127.0.0.1:$(port_of "$1" "$2")/%2f"; }
pid_of() { # broker node
  if [ "$1" = quorumq ]; then cat "$DATA/node-$2.pid"; else "$RMQ3" pid "$2"; fi
}
cpu_total() { # broker -> CPU ticks of its three nodes
  local t=0 p
  for n in 1 2 3; do p=$(pid_of "$1" "$n"); t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done
  echo "$t"
}
start() {
  if [ "$1" = quorumq ]; then rm -rf "${DATA:?}"/node-*; "${LC[@]}" start >/dev/null
  else "$RMQ3" start >/dev/null; fi
}
stop() {
  if [ "$1" = quorumq ]; then "${LC[@]}" stop >/dev/null; else "$RMQ3" stop >/dev/null; fi
}
restart_node() { # broker node
  if [ "$1" = quorumq ]; then "${LC[@]}" restart "$2" >/dev/null; else "$RMQ3" start1 "$2" >/dev/null; fi
}
declare_on() { # broker node queue [dlx args...]
  python3 - "$(port_of "$1" "$2")" "$3" <<'PY'
import sys, pika
c = pika.BlockingConnection(pika.ConnectionParameters(port=int(sys.argv[1])))
c.channel().queue_declare(sys.argv[2], durable=True, arguments={"x-queue-type": "quorum"})
c.close()
PY
}
perf() { # broker node label args...
  local b=$1 n=$2 label=$3 t0 t1 out
  shift 3
  t0=$(cpu_total "$b")
  out=$(./target/release/quorumq-perf --uri "$(uri "$b" "$n")" --size 1024 --confirm 256 --prefetch 256 "$@" 2>&1) || true
  t1=$(cpu_total "$b")
  local rate
  case "$label" in
    dl) rate=$(echo "$out" | grep -oP '^dead-letter arrival.*= \K[0-9]+' || echo 0) ;;
    *) rate=$(echo "$out" | grep -oP '^consume.*= \K[0-9]+' || echo 0) ;;
  esac
  local lat lost
  lat=$(echo "$out" | grep -oP '^latency: \K.*' | head -1 || true)
  lost=$(echo "$out" | grep -oP '^lost: \K[0-9]+' || echo "?")
  echo "$label $b rate=$rate lost=$lost cpu_s=$(awk -v a="$t0" -v b="$t1" -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", (b-a)/hz}') latency: ${lat:-?}" | tee -a "$RESULTS"
}
fault() { # broker scenario round
  local b=$1 s=$2 q="bench-$2-$3" pid
  declare_on "$b" 1 "$q"
  pid=$(pid_of "$b" 1)
  local cmd heal=""
  if [ "$s" = kill9 ]; then cmd="kill -9 $pid"; else cmd="kill -STOP $pid"; heal="kill -CONT $pid"; fi
  local out
  out=$(python3 cluster-tests/bench/failover.py "$(port_of "$b" 2)" "$(port_of "$b" 3)" "$q" "$cmd" ${heal:+"$heal"} 2>&1 | tail -1) || true
  echo "$s $b $out" | tee -a "$RESULTS"
  if [ -n "${KEEP_DATA:-}" ] && [ "$b" = quorumq ]; then # the nodes' logs of this fault
    mkdir -p "$DATA/$s-$3" && cp "$DATA"/node-*.log "$DATA/$s-$3/" 2>/dev/null || true
  fi
  if [ "$s" = kill9 ]; then restart_node "$b" 1 || true; fi
}

for r in $(seq "$ROUNDS"); do
  for b in $BROKERS; do
    echo "== round $r: $b" >&2
    start "$b"
    for s in $SCENARIOS; do
      case "$s" in
        leader) perf "$b" 1 leader --messages "$MESSAGES" --queue-prefix "bench-l-$r" ;;
        follower) declare_on "$b" 1 "bench-f-$r-0"
                  perf "$b" 2 follower --messages "$MESSAGES" --queue-prefix "bench-f-$r" ;;
        dl) perf "$b" 1 dl --messages "$DL_MESSAGES" --dead-letter --queue-prefix "bench-d-$r" ;;
        latency) perf "$b" 1 latency --rate "$RATE" --messages "$LAT_MESSAGES" --queue-prefix "bench-t-$r" ;;
        kill9|sigstop) fault "$b" "$s" "$r" ;;
      esac
    done
    stop "$b"
  done
done
echo "== summary (min-max over rounds)"
for s in $SCENARIOS; do
  for b in $BROKERS; do
    case "$s" in
      kill9|sigstop) grep "^$s $b " "$RESULTS" | grep -oP 'gap_s=\K[0-9.]+' | sort -n | sed -n '1p;$p' | paste -sd- | sed "s/^/$s $b gap_s /" ;;
      latency) grep "^$s $b " "$RESULTS" | grep -oP 'latency: \K.*' | sed "s/^/$s $b /" ;;
      *) grep "^$s $b " "$RESULTS" | grep -oP 'rate=\K[0-9]+' | sort -n | sed -n '1p;$p' | paste -sd- | sed "s/^/$s $b msg\/s /" ;;
    esac
  done
done
