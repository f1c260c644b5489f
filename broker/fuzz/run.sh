#!/usr/bin/env bash
# Fuzz quorumq's untrusted-input parsers with libFuzzer on the stable toolchain.
#
#   broker/fuzz/run.sh            # every target for 60 s (what .ci/run does)
#   broker/fuzz/run.sh 3600       # every target for an hour
#   broker/fuzz/run.sh 600 wal_records
#
# cargo-fuzz is installed when missing. `--sanitizer none` keeps the build on
# stable Rust (the address sanitizer needs nightly's -Zsanitizer); libFuzzer's
# coverage instrumentation and panics-as-crashes work without it. Crashes land
# in broker/fuzz/artifacts/<target>/ and fail the run; each becomes a
# regression test. Seeds: broker/fuzz/seeds/<target>/ (copied into the corpus).
set -euo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(frame_reader field_table x_death_rewrite wal_records connection)
fi
# libfuzzer-sys compiles libFuzzer (C++).
if ! command -v c++ >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install cargo-fuzz --locked
fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  if [ -d "seeds/$t" ]; then cp -n "seeds/$t"/* "corpus/$t/" 2>/dev/null || true; fi
  echo "== fuzzing $t for ${secs}s"
  # wal_records writes segment files each run, connection runs a broker: keep their
  # files in memory (/dev/shm).
  TMPDIR=/dev/shm cargo fuzz run --sanitizer none "$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 2>&1 | tail -n 4
done
