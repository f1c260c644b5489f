#!/usr/bin/env bash
# Many quorum queues on three nodes (issue 31): start 3 quorumq nodes (release
# build), declare N quorum queues (3 replicas each) and measure, in order:
#
#   1. sequential declares through one pika channel on node 1: rate overall and
#      per 1,000-queue slice (so a rate that falls with the count shows);
#   2. idle CPU of the three processes (/proc ticks over MEASURE_S after
#      SETTLE_S) and RSS per queue replica above the empty nodes;
#   3. `quorumqctl list_queues` time and the HTTP API's paged listing
#      (`/api/queues?page=1&page_size=100`) time;
#   4. restart-to-serving of node 1, which leads every queue (SIGTERM, start):
#      until its AMQP port accepts, it holds its N replicas again and the
#      leaders counted by `cluster_status` add up to N;
#   5. kill -9 of node 2: until nodes 1 and 3 lead all N; node 2 is started
#      again (and timed as in 4);
#   6. `quorumqctl rebalance quorum` time, and the longest confirm wait of a publisher on
#      another queue meanwhile;
#   7. sequential deletes (rate); then N declares and N deletes from 8
#      connections (one channel each) at once (rates), with pika and again
#      with the lean Rust client `quorumq-declares`;
#   8. log lines and bytes each node wrote (whole run and per phase).
#
# Node logs are counted through a pipe and only their first LOG_CAP bytes are
# kept (a log storm cannot fill the disk); the data directory is deleted at
# exit (KEEP_DATA=1 keeps it).
#
#   cluster-tests/bench/many_queues.sh 1000
#   SETTLE_S=20 MEASURE_S=30 cluster-tests/bench/many_queues.sh 10000
#   QUORUMQ_BIN_DIR=/work/main/target/release cluster-tests/bench/many_queues.sh 1000
#   PHASES=declare,idle cluster-tests/bench/many_queues.sh 10000   # a subset
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-1000}
SETTLE_S=${SETTLE_S:-20}
MEASURE_S=${MEASURE_S:-20}
AMQP_BASE=${AMQP_BASE:-5911}
CLUSTER_BASE=${CLUSTER_BASE:-5961}
HTTP_BASE=${HTTP_BASE:-15911}
LOG_CAP=${LOG_CAP:-200000000}
PHASES=${PHASES:-declare,idle,list,restart,kill,rebalance,delete,concurrent}
BIN_DIR=${QUORUMQ_BIN_DIR:-target/release}
BIN="$BIN_DIR/quorumq"
CTL="$BIN_DIR/quorumqctl"
if [ ! -x "$BIN" ] || [ ! -x "$CTL" ]; then cargo build --release --bins; fi
has() { [[ ",$PHASES," == *",$1,"* ]]; }
DECLARES=${DECLARES_BIN:-target/release/quorumq-declares}
if has concurrent && [ ! -x "$DECLARES" ]; then cargo build --release -p cluster-tests --bin quorumq-declares; fi
python3 -c 'import pika' 2>/dev/null || python3 -m pip install --quiet pika || python3 -m pip install --quiet --break-system-packages pika
DATA=$(mktemp -d /tmp/quorumq-many.XXXXXX)
export QUORUMQ_CLUSTER_SECRET_FILE="$DATA/cookie"
cleanup() {
  for f in "$DATA"/node-*.pid; do
    if [ -f "$f" ]; then kill -9 "$(cat "$f")" 2>/dev/null || true; fi
  done
  sleep 0.5
  if [ -z "${KEEP_DATA:-}" ]; then rm -rf "$DATA"; else echo "data kept in $DATA"; fi
}
trap cleanup EXIT

peers() { echo "1=127.0.0.1:$CLUSTER_BASE,2=127.0.0.1:$((CLUSTER_BASE + 1)),3=127.0.0.1:$((CLUSTER_BASE + 2))"; }
launches=0
# Starts node $1: its stderr goes through a counter that keeps the first
# LOG_CAP bytes in DATA/node-I.log and writes "lines bytes" to
# DATA/node-I.count.K once a second (K: the launch).
start_node() {
  local i=$1
  launches=$((launches + 1))
  local fifo="$DATA/node-$i.fifo.$launches"
  mkfifo "$fifo"
  python3 - "$fifo" "$DATA/node-$i.log" "$DATA/node-$i.count.$launches" "$LOG_CAP" <<'PY' &
import os, select, sys, time
src, log, count, cap = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
fd = os.open(src, os.O_RDONLY)
out = open(log, "ab", buffering=0)
kept = out.tell()
lines = size = 0
last = 0.0
dirty = True
def flush():
    with open(count + ".tmp", "w") as f:
        f.write(f"{lines} {size}\n")
    os.replace(count + ".tmp", count)
while True:
    ready, _, _ = select.select([fd], [], [], 0.5)
    if ready:
        b = os.read(fd, 1 << 16)
        if not b:
            break
        lines += b.count(b"\n")
        size += len(b)
        dirty = True
        if kept < cap:
            piece = b[: cap - kept]
            out.write(piece)
            kept += len(piece)
    now = time.monotonic()
    if dirty and now - last > 0.5:
        flush()
        last = now
        dirty = False
out.close()
flush()
PY
  NO_COLOR=1 "$BIN" --node-id "$i" --amqp-listen "127.0.0.1:$((AMQP_BASE + i - 1))" \
    --cluster-listen "127.0.0.1:$((CLUSTER_BASE + i - 1))" \
    --http-listen "127.0.0.1:$((HTTP_BASE + i - 1))" \
    --data-dir "$DATA" --peers "$(peers)" >"$fifo" 2>&1 </dev/null &
  echo $! >"$DATA/node-$i.pid"
}
pid_of() { cat "$DATA/node-$1.pid"; }
# Log lines and bytes node $1 wrote so far (all launches).
log_count() { cat "$DATA"/node-"$1".count.* 2>/dev/null | awk '{l += $1; b += $2} END {printf "%d %d\n", l, b}'; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
# Waits (up to $2 s) until node $1's AMQP port accepts a connection.
wait_amqp() {
  local port=$((AMQP_BASE + $1 - 1)) deadline=$((SECONDS + $2))
  until python3 -c "import socket,sys; socket.create_connection(('127.0.0.1', $port), 0.5).close()" 2>/dev/null; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}
ctl() { "$CTL" --node "http://127.0.0.1:$((CLUSTER_BASE + $1 - 1))" "${@:2}"; }
# Sum of the queue leaders every running node reports (cluster_status asked of node $1).
leaders_sum() {
  ctl "$1" --formatter json cluster_status 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(n.get("leaders") or 0 for n in d["nodes"] if n.get("running")))' 2>/dev/null || echo 0
}
# Leaders per node as "1:a 2:b 3:c" (cluster_status asked of node $1).
leaders_each() {
  ctl "$1" --formatter json cluster_status 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(" ".join("%s:%s" % (n["id"], n.get("leaders")) for n in d["nodes"]))' 2>/dev/null || echo "?"
}
# Replicas node $2 holds (cluster_status asked of node $1).
replicas_of() {
  ctl "$1" --formatter json cluster_status 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); print(sum(n.get("replicas") or 0 for n in d["nodes"] if n["id"] == '"$2"'))' 2>/dev/null || echo 0
}
# Waits (up to $3 s) until node $1 holds $2 replicas and the leaders add up to $2.
wait_serving() {
  local deadline=$((SECONDS + $3))
  until [ "$(replicas_of "$1" "$1")" -ge "$2" ] && [ "$(leaders_sum "$1")" -ge "$2" ]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}
# Waits (up to $3 s) until the leaders reported through node $1 add up to $2.
wait_leaders() {
  local deadline=$((SECONDS + $3))
  until [ "$(leaders_sum "$1")" -ge "$2" ]; do
    ((SECONDS < deadline)) || return 1
    sleep 0.2
  done
}
wait_ready_log() {
  local deadline=$((SECONDS + $2))
  until grep -q "quorumq ready" "$DATA/node-$1.log" 2>/dev/null && [ "$(grep -c "quorumq ready" "$DATA/node-$1.log")" -ge "$3" ]; do
    ((SECONDS < deadline)) || return 1
    kill -0 "$(pid_of "$1")" 2>/dev/null || { echo "node $1 exited"; tail -20 "$DATA/node-$1.log"; return 1; }
    sleep 0.1
  done
}
rss_kib() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# Waits (up to $1 s) until the running nodes together use under 20 % of a core over 2 s, so
# a phase does not start while the last one's catch-up is still running; prints how long.
settle() {
  local t deadline=$((SECONDS + $1)) hz a b i pids
  t=$(now)
  hz=$(getconf CLK_TCK)
  while ((SECONDS < deadline)); do
    pids=""
    for i in 1 2 3; do kill -0 "$(pid_of "$i")" 2>/dev/null && pids+=" $(pid_of "$i")"; done
    a=0; for i in $pids; do a=$((a + $(cpu_ticks "$i"))); done
    sleep 2
    b=0; for i in $pids; do b=$((b + $(cpu_ticks "$i"))); done
    (((b - a) * 100 / hz / 2 < 20)) && break
  done
  echo "  settled after $(since "$t") s"
}
phase_logs() {
  local out="" i
  for i in 1 2 3; do out+=" node$i=$(log_count "$i" | awk '{print $1 " lines/" int($2 / 1024) " KiB"}')"; done
  echo "logs so far:$out"
}

for i in 1 2 3; do start_node "$i"; done
for i in 1 2 3; do wait_ready_log "$i" 60 1 || { echo "node $i not ready in 60 s"; tail -5 "$DATA/node-$i.log"; exit 1; }; done
echo "3 nodes ready ($(git rev-parse --short HEAD 2>/dev/null), $BIN); N=$N"
sleep 3
declare -a empty_rss
for i in 1 2 3; do empty_rss[i]=$(rss_kib "$(pid_of "$i")"); done

# Declares (or deletes) queues mq.FIRST..mq.LAST-1 through node 1 from WORKERS connections
# of one channel each; prints the rate overall and per 1,000 (sequential only). Concurrent
# workers are processes (pika in threads of one process was bound by Python's GIL at
# ~1,000/s, the client measured instead of the broker), connected before the clock starts.
amqp() {
  python3 - "$AMQP_BASE" "$@" <<'PY'
import sys, time, multiprocessing as mp, pika
port, op, first, last, workers = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
args = {"x-queue-type": "quorum"}
def run(names, slices, start=None):
    c = pika.BlockingConnection(pika.ConnectionParameters(port=port, blocked_connection_timeout=300, heartbeat=0))
    ch = c.channel()
    if start is not None:
        start.wait()
    t = time.time()
    for k, name in enumerate(names, 1):
        if op == "declare":
            ch.queue_declare(name, durable=True, arguments=args)
        else:
            ch.queue_delete(name)
        if slices and k % 1000 == 0:
            now = time.time()
            print(f"  {op} {k - 999}..{k}: {1000 / (now - t):.0f}/s", flush=True)
            t = now
    c.close()
names = [f"mq.{i}" for i in range(first, last)]
if workers == 1:
    t0 = time.time()
    run(names, True)
else:
    start = mp.Barrier(workers + 1)
    ps = [mp.Process(target=run, args=(names[w::workers], False, start)) for w in range(workers)]
    for p in ps: p.start()
    start.wait()
    t0 = time.time()
    for p in ps: p.join()
    if any(p.exitcode != 0 for p in ps):
        sys.exit(f"a worker failed: exit codes {[p.exitcode for p in ps]}")
dt = time.time() - t0
print(f"{op} {len(names)} queues, {workers} connection(s): {dt:.1f} s, {len(names) / dt:.0f}/s", flush=True)
PY
}

if has declare; then
  echo "== sequential declares (one channel, node 1)"
  amqp declare 0 "$N" 1
  phase_logs
fi
hz=$(getconf CLK_TCK)
if has idle; then
  echo "== idle: settle ${SETTLE_S} s, measure ${MEASURE_S} s"
  sleep "$SETTLE_S"
  declare -a t0
  for i in 1 2 3; do t0[i]=$(cpu_ticks "$(pid_of "$i")"); done
  sleep "$MEASURE_S"
  total=0
  rss_delta=0
  for i in 1 2 3; do
    pid=$(pid_of "$i")
    pct=$(awk -v a="${t0[i]}" -v b="$(cpu_ticks "$pid")" -v hz="$hz" -v s="$MEASURE_S" 'BEGIN { printf "%.1f", (b - a) * 100 / hz / s }')
    rss=$(rss_kib "$pid")
    total=$(awk -v t="$total" -v p="$pct" 'BEGIN { print t + p }')
    rss_delta=$((rss_delta + rss - empty_rss[i]))
    echo "  node $i: cpu ${pct}% of a core, RSS ${rss} KiB (empty ${empty_rss[i]} KiB)"
  done
  echo "idle: queues=$N cpu_total=${total}% rss_per_replica=$((rss_delta / (N * 3))) KiB"
  phase_logs
fi
if has list; then
  echo "== listing"
  t=$(now)
  rows=$(ctl 1 --formatter json list_queues | grep -c '"name"' || true)
  echo "list_queues (node 1): $(since "$t") s, $rows rows"
  t=$(now)
  code=$(curl -s -o /dev/null -w '%{http_code}' -u guest:guest "http://127.0.0.1:$HTTP_BASE/api/queues?page=1&page_size=100")
  echo "GET /api/queues?page=1&page_size=100 (node 1): $(since "$t") s, HTTP $code"
  t=$(now)
  code=$(curl -s -o /dev/null -w '%{http_code}' -u guest:guest "http://127.0.0.1:$((HTTP_BASE + 1))/api/queues?page=1&page_size=100")
  echo "GET /api/queues?page=1&page_size=100 (node 2): $(since "$t") s, HTTP $code"
fi
if has restart; then
  settle 120
  echo "== restart node 1, which leads every queue (SIGTERM, start)"
  pid=$(pid_of 1)
  t=$(now)
  kill -TERM "$pid"
  while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  echo "  node 1 stopped in $(since "$t") s (leaders $(leaders_each 2))"
  t=$(now)
  start_node 1
  wait_amqp 1 300 && echo "  AMQP accepting after $(since "$t") s"
  wait_ready_log 1 300 2 && echo "  'quorumq ready' after $(since "$t") s"
  if wait_serving 1 "$N" 300; then echo "restart-to-serving: $(since "$t") s (leaders $(leaders_each 1))"; else echo "restart: not serving after 300 s (leaders $(leaders_each 1), node 1 replicas $(replicas_of 1 1))"; fi
  phase_logs
fi
if has kill; then
  settle 120
  echo "== kill -9 node 2 (leaders: $(leaders_each 3))"
  t=$(now)
  kill -9 "$(pid_of 2)"
  if wait_leaders 3 "$N" 300; then echo "leaderships moved: $(since "$t") s (leaders $(leaders_each 3))"; else echo "kill: leaders after 300 s: $(leaders_each 3)"; fi
  t=$(now)
  start_node 2
  wait_amqp 2 300 && echo "  node 2 AMQP accepting after $(since "$t") s"
  wait_ready_log 2 300 2 && echo "  node 2 ready after $(since "$t") s"
  wait_serving 2 "$N" 300 && echo "  node 2 back with every replica open, every queue led: $(since "$t") s"
  phase_logs
fi
if has rebalance; then
  settle 120
  # A publisher on a queue of its own (mq.probe, node 3) publishes one message at a time with
  # confirms through the rebalance: its longest wait for a confirm is the stall the rebalance
  # caused on other queues (issue 31: "without stalling confirms on other queues").
  python3 - "$((AMQP_BASE + 2))" "$DATA/probe.stop" "$DATA/probe.out" <<'PY' &
import os, sys, time, pika
port, stop, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
c = pika.BlockingConnection(pika.ConnectionParameters(port=port, heartbeat=0))
ch = c.channel()
ch.queue_declare("mq.probe", durable=True, arguments={"x-queue-type": "quorum"})
ch.confirm_delivery()
with open(out + ".ready", "w"):
    pass
n, longest, last = 0, 0.0, time.time()
while not os.path.exists(stop):
    ch.basic_publish("", "mq.probe", b"x" * 256, pika.BasicProperties(delivery_mode=2))
    now = time.time()
    longest, last, n = max(longest, now - last), now, n + 1
ch.queue_delete("mq.probe")
c.close()
with open(out, "w") as f:
    f.write(f"{n} {longest:.3f}\n")
PY
  probe=$!
  for _ in $(seq 100); do [ -f "$DATA/probe.out.ready" ] && break; sleep 0.1; done
  sleep 1
  echo "== rebalance quorum (leaders before: $(leaders_each 1))"
  t=$(now)
  ctl 1 rebalance quorum >"$DATA/rebalance.out" 2>&1 || echo "  rebalance failed: $(tail -3 "$DATA/rebalance.out")"
  echo "rebalance: $(since "$t") s (leaders after: $(leaders_each 1))"
  sleep 1
  touch "$DATA/probe.stop"
  wait "$probe" || true
  read -r pn pgap <"$DATA/probe.out" 2>/dev/null || { pn=0; pgap="?"; }
  echo "  confirmed publishes on another queue meanwhile: $pn, longest wait for a confirm: $pgap s"
  phase_logs
fi
if has delete; then
  echo "== sequential deletes"
  amqp delete 0 "$N" 1
  phase_logs
fi
if has concurrent; then
  echo "== 8 connections at once (pika)"
  amqp declare "$N" $((2 * N)) 8
  amqp delete "$N" $((2 * N)) 8
  # The same with the lean Rust client: pika spends ~0.4 ms of CPU per
  # declare, CPU the brokers do not get on a small box.
  echo "== 8 connections at once (quorumq-declares, lean client)"
  uri="amqp://guest:guest@127.0.0.1:$AMQP_BASE/%2f"
  "$DECLARES" --uri "$uri" --first "$((2 * N))" --queues "$N" --connections 8 --op declare
  "$DECLARES" --uri "$uri" --first "$((2 * N))" --queues "$N" --connections 8 --op delete
  phase_logs
fi
echo "== log lines written (whole run)"
for i in 1 2 3; do
  read -r l b < <(log_count "$i")
  echo "  node $i: $l lines, $((b / 1024)) KiB"
done
for i in 1 2 3; do
  echo "  node $i top messages:"
  sed -E 's/^[^ ]+ +//' "$DATA/node-$i.log" | cut -c1-110 | sed -E 's/[0-9]+/N/g' | sort | uniq -c | sort -rn | { head -4 || true; } | sed 's/^/    /' || true
done
