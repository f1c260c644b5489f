#!/usr/bin/env bash
# Idle cost of quorum queues (cluster issue §2): start NODES quorumq nodes
# (release build, with deploy/local-cluster.sh), declare QUEUES quorum queues
# (3 replicas each when NODES >= 3), let the cluster settle, then measure
# every process's CPU over MEASURE_S seconds (/proc/PID/stat utime+stime) and
# its RSS (VmRSS), and print them with the per-queue-replica RSS above an
# empty node's.
#
#   cluster-tests/bench/idle.sh                 # 3 nodes, 1000 queues
#   NODES=1 cluster-tests/bench/idle.sh         # one node
#   QUEUES=200 SETTLE_S=10 MEASURE_S=10 cluster-tests/bench/idle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
NODES=${NODES:-3}
QUEUES=${QUEUES:-1000}
SETTLE_S=${SETTLE_S:-60}
MEASURE_S=${MEASURE_S:-30}
AMQP_BASE=${AMQP_BASE:-5901}
CLUSTER_BASE=${CLUSTER_BASE:-5951}
BIN=${QUORUMQ_BIN:-target/release/quorumq}
[ -x "$BIN" ] || cargo build --release --bin quorumq
[ "$(basename "$BIN")" = quorumq ] || { echo "QUORUMQ_BIN must be a file named quorumq, not $BIN" >&2; exit 1; }
python3 -c 'import pika' 2>/dev/null || python3 -m pip install --quiet pika || python3 -m pip install --quiet --break-system-packages pika
DATA=$(mktemp -d /tmp/quorumq-idle.XXXXXX)
cleanup() {
  for f in "$DATA"/node-*.pid; do
    if [ -f "$f" ]; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
  done
  rm -rf "$DATA"
}
trap cleanup EXIT
# Nodes 1..NODES on --peers, each waited for until it logs "quorumq ready"
# (fails the run if one exits or is not ready in 60 s); pids in DATA/node-I.pid.
QUORUMQ_BIN_DIR=$(dirname "$BIN") deploy/local-cluster.sh start --data "$DATA" --nodes "$NODES" \
  --amqp-base "$AMQP_BASE" --cluster-base "$CLUSTER_BASE"
pids=()
for i in $(seq 1 "$NODES"); do pids+=("$(cat "$DATA/node-$i.pid")"); done
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
sleep 3
declare -a empty_rss
for i in "${!pids[@]}"; do empty_rss[i]=$(rss_kib "${pids[$i]}"); done
echo "declaring $QUEUES quorum queues through node 1 ..."
python3 - "$AMQP_BASE" "$QUEUES" <<'PY'
import sys, time, pika
port, n = int(sys.argv[1]), int(sys.argv[2])
c = pika.BlockingConnection(pika.ConnectionParameters(port=port, blocked_connection_timeout=60))
ch = c.channel()
t = time.time()
for i in range(n):
    ch.queue_declare(f"idle.{i}", durable=True, arguments={"x-queue-type": "quorum"})
print(f"declared {n} queues in {time.time() - t:.1f} s")
c.close()
PY
echo "settling ${SETTLE_S} s ..."
sleep "$SETTLE_S"
hz=$(getconf CLK_TCK)
declare -a t0
for i in "${!pids[@]}"; do t0[i]=$(cpu_ticks "${pids[$i]}"); done
sleep "$MEASURE_S"
total=0
replicas=$(( QUEUES * (NODES < 3 ? NODES : 3) ))
total_rss_delta=0
for i in "${!pids[@]}"; do
  t1=$(cpu_ticks "${pids[$i]}")
  pct=$(awk -v a="${t0[$i]}" -v b="$t1" -v hz="$hz" -v s="$MEASURE_S" 'BEGIN { printf "%.1f", (b - a) * 100 / hz / s }')
  rss=$(rss_kib "${pids[$i]}")
  total=$(awk -v t="$total" -v p="$pct" 'BEGIN { print t + p }')
  total_rss_delta=$(( total_rss_delta + rss - empty_rss[i] ))
  echo "node $((i + 1)): cpu ${pct}% of a core, RSS ${rss} KiB (empty node ${empty_rss[$i]} KiB)"
done
echo "idle: nodes=$NODES queues=$QUEUES cpu_total=${total}% rss_per_replica=$(( total_rss_delta / replicas )) KiB"
