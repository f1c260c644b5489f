#!/usr/bin/env bash
# Usage: kombu-integration.sh  (AMQP_URL / QUORUMQ_AMQP_PORT set by
# cluster-tests/compat/with-quorumq.sh)
# Runs kombu's own AMQP integration tests (t/integration/test_py_amqp.py from
# the sdist of the installed kombu version, fetched from PyPI once into
# target/kombu-sdist) against the broker on 127.0.0.1:$QUORUMQ_AMQP_PORT.
# Their `flaky` reruns are not installed: a failure fails the run.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
version="$(python3 -c 'import kombu; print(kombu.__version__)')"
dir="$root/target/kombu-sdist"
src="$dir/kombu-$version"
if [ ! -f "$src/t/integration/test_py_amqp.py" ]; then
  mkdir -p "$dir"
  python3 -m pip download --quiet --no-deps --no-binary :all: "kombu==$version" -d "$dir"
  tar -xzf "$dir/kombu-$version.tar.gz" -C "$dir"
fi
cd "$src"
RABBITMQ_HOST=127.0.0.1 RABBITMQ_5672_TCP="${QUORUMQ_AMQP_PORT:?}" \
  python3 -m pytest -q -p no:cacheprovider -W ignore::pytest.PytestUnknownMarkWarning \
  -o python_classes='test_*' t/integration/test_py_amqp.py
