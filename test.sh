#!/usr/bin/env bash
# The project's test command: build quorumq, run every workspace test (the
# cluster-tests integration tests spawn target/debug/quorumq themselves), then
# run the pika compatibility tests, the rabbitmqadmin tests, the management UI's
# browser tests and the Celery end-to-end tests against a quorumq started for them,
# then the fault-injection suite's short profile.
set -euo pipefail
cd "$(dirname "$0")"
# The cluster tests must exercise quorumq here, not an external broker.
unset QUORUMQ_TEST_URI QUORUMQ_TEST_HTTP QUORUMQ_BIN
# The pika tests need pika and pytest, the Celery end-to-end tests Celery 5.5
# (with kombu 5.5); install them on a fresh machine.
if ! python3 -c 'import pika, pytest, celery, kombu; assert celery.__version__.startswith("5.5")' 2>/dev/null; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-pip
  fi
  python3 -m pip install --quiet pika pytest 'celery>=5.5,<5.6' \
    || python3 -m pip install --quiet --break-system-packages pika pytest 'celery>=5.5,<5.6'
fi
# The management API tests drive the HTTP API with curl; the TLS tests make
# certificates with deploy/gen-certs.sh (openssl).
if ! command -v curl >/dev/null || ! command -v openssl >/dev/null; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y curl openssl
fi
# The partition test and the fault suite need ip (iproute2) and iptables.
if [ "$(id -u)" = 0 ] && { ! command -v iptables >/dev/null || ! command -v ip >/dev/null || ! command -v tc >/dev/null; }; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y iproute2 iptables
fi
# The same binaries as cluster-tests/faults/run.sh builds, so that both resolve
# features alike and share one build of the broker.
cargo build --bin quorumq --bin quorumqctl --bin quorumq-faults
cargo test --workspace
timeout 900 cluster-tests/compat/with-quorumq.sh python3 -m pytest -q -p no:cacheprovider cluster-tests/pika
# rabbitmqadmin (RabbitMQ 3.10.8's, from Debian's rabbitmq-server package, which CI
# installs for its differential run anyway) against quorumq's management HTTP API.
if ! command -v rabbitmqadmin >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y rabbitmq-server
fi
timeout 300 cluster-tests/compat/with-quorumq.sh python3 -m pytest -q -p no:cacheprovider cluster-tests/rabbitmqadmin
# The management web UI in a real browser: Playwright for Python (PyPI) driving Debian's
# chromium (Playwright's own browser download is not used). A failed test leaves a
# screenshot in cluster-tests/ui/failures/.
if [ ! -x /usr/bin/chromium ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
fi
if ! python3 -c 'import playwright.sync_api' 2>/dev/null; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y python3-pip
  fi
  python3 -m pip install --quiet playwright \
    || python3 -m pip install --quiet --break-system-packages playwright
fi
timeout 300 cluster-tests/compat/with-quorumq.sh python3 -m pytest -q -p no:cacheprovider cluster-tests/ui
# Our per-panel queries of RabbitMQ's Grafana dashboards
# (cluster-tests/prometheus/dashboard_queries.py) and every expression of quorumq's
# dead-letter dashboard return data from Debian's Prometheus scraping a 3-node
# cluster under load; with RABBITMQ_DASHBOARDS_DIR set to a directory holding
# RabbitMQ's RabbitMQ-Overview.json and RabbitMQ-Quorum-Queues-Raft.json (not in
# this repository), every expression of those as well.
if ! command -v prometheus >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update
  DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus
fi
timeout 300 python3 -m pytest -q -s -p no:cacheprovider cluster-tests/prometheus
# A real Celery 5.5 worker on quorum queues (native delayed delivery, retries, acks_late).
timeout 600 cluster-tests/compat/with-quorumq.sh python3 -m pytest -q -p no:cacheprovider cluster-tests/celery
# kombu's own AMQP integration tests (its sdist's t/integration/test_py_amqp.py).
timeout 600 cluster-tests/compat/with-quorumq.sh cluster-tests/celery/kombu-integration.sh
# The fault-injection suite, short profile: every workload and nemesis kind.
timeout 900 cluster-tests/faults/run.sh --profile short
