#!/usr/bin/env bash
# Runs the pika compatibility tests (cluster-tests/pika) twice and prints both
# results: against RabbitMQ (expected running at $RABBITMQ_URL, default
# amqp://guest:guest@127.0.0.1:5672/%2f) and against a quorumq this script
# starts itself (port $QUORUMQ_PORT, default 5673 if free). Exit 0 only if both pass.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
pika_dir="$here/../pika"
rabbit_url="${RABBITMQ_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}"
# 5673 unless it is taken (then with-quorumq.sh picks a free port).
if [ -z "${QUORUMQ_PORT:-}" ] && ! (exec 3<>/dev/tcp/127.0.0.1/5673) 2>/dev/null; then
  export QUORUMQ_PORT=5673
fi

echo "=== pika tests against RabbitMQ ($rabbit_url)"
AMQP_URL="$rabbit_url" timeout 600 python3 -m pytest -q -p no:cacheprovider "$pika_dir"
rabbit_rc=$?

echo "=== pika tests against quorumq (port ${QUORUMQ_PORT:-any free})"
timeout 600 "$here/with-quorumq.sh" python3 -m pytest -q -p no:cacheprovider "$pika_dir"
quorumq_rc=$?

verdict() { if [ "$1" = 0 ]; then echo "PASS"; else echo "FAIL (exit $1)"; fi; }
echo "=== summary"
echo "RabbitMQ: $(verdict $rabbit_rc)"
echo "quorumq:  $(verdict $quorumq_rc)"
[ "$rabbit_rc" = 0 ] && [ "$quorumq_rc" = 0 ]
