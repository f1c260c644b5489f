#!/usr/bin/env bash
# Usage: with-quorumq.sh COMMAND [ARGS...]
# Starts quorumq on a free 127.0.0.1 port with a fresh data dir, waits (<= 30 s)
# for the AMQP port, runs COMMAND with AMQP_URL pointing at it, then stops
# quorumq with SIGTERM (SIGKILL after 30 s). Exits with COMMAND's status, or
# non-zero if quorumq could not start. Binary: $QUORUMQ_BIN, else
# <workspace>/target/debug/quorumq. Port: $QUORUMQ_PORT, else a free one. The
# management HTTP API listens on a free port too, given to COMMAND as MGMT_PORT.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
bin="${QUORUMQ_BIN:-$root/target/debug/quorumq}"
[ -x "$bin" ] || { echo "with-quorumq: no quorumq binary at $bin (cargo build --bin quorumq)" >&2; exit 1; }
port="${QUORUMQ_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
http_port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
work="$(mktemp -d -t quorumq-compat-XXXXXX)"
log="$work/quorumq.stderr.log"
"$bin" --amqp-listen "127.0.0.1:$port" --data-dir "$work/data" --cluster-listen 127.0.0.1:0 --http-listen "127.0.0.1:$http_port" 2>"$log" >&2 &
pid=$!
stop() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
trap stop EXIT
up=0
for _ in $(seq 300); do
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then up=1; break; fi
  sleep 0.1
done
if [ "$up" != 1 ]; then
  echo "with-quorumq: quorumq did not open 127.0.0.1:$port within 30 s; stderr tail:" >&2
  tail -n 40 "$log" >&2 || true
  exit 1
fi
echo "with-quorumq: quorumq pid $pid on 127.0.0.1:$port (log $log)" >&2
set +e
AMQP_URL="amqp://guest:guest@127.0.0.1:$port/%2f" QUORUMQ_AMQP_PORT="$port" MGMT_PORT="$http_port" "$@"
rc=$?
set -e
if [ "$rc" != 0 ]; then
  echo "with-quorumq: command failed ($rc); quorumq stderr tail:" >&2
  tail -n 40 "$log" >&2 || true
fi
exit "$rc"
