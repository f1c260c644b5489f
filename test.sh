#!/usr/bin/env bash
# The project's test command: build quorumq, run every workspace test (the
# cluster-tests integration tests spawn target/debug/quorumq themselves), then
# run the pika compatibility tests against a quorumq started for them.
set -euo pipefail
cd "$(dirname "$0")"
# The cluster tests must exercise quorumq here, not an external broker.
unset QUORUMQ_TEST_URI QUORUMQ_BIN
cargo build --bin quorumq --bin quorumqctl
cargo test --workspace
timeout 900 cluster-tests/compat/with-quorumq.sh python3 -m pytest -q -p no:cacheprovider cluster-tests/pika
