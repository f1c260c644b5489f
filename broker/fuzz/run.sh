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
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  if [ -d "seeds/$t" ]; then cp -n "seeds/$t"/* "corpus/$t/" 2>/dev/null || true; fi
  # Built first, with the shell's stack limit, so that a failed build prints
  # cargo's errors (and the free space); tried twice, in case a download failed.
  for attempt in 1 2; do
    if cargo fuzz build --sanitizer none "$t" >"$log" 2>&1; then
      break
    fi
    echo "== building fuzz target $t failed (attempt $attempt):"
    tail -n 60 "$log"
    df -h . /dev/shm 2>/dev/null || true
    [ "$attempt" = 2 ] && exit 1
  done
  echo "== fuzzing $t for ${secs}s"
  # The main thread gets a tokio worker's 2 MiB stack, so that input which
  # would overflow a worker in the broker crashes the fuzzer too.
  # wal_records writes segment files each run, connection runs a broker: keep their
  # files in memory (/dev/shm).
  if ! (ulimit -s 2048 && TMPDIR=/dev/shm cargo fuzz run --sanitizer none "$t" "corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048) >"$log" 2>&1; then
    echo "== fuzz target $t failed:"
    tail -n 80 "$log"
    # The crash input, so that a CI log is enough to reproduce it.
    for f in "artifacts/$t"/*; do
      [ -f "$f" ] || continue
      echo "== $f ($(stat -c %s "$f") bytes), base64 (first 64 KiB):"
      head -c 65536 "$f" | base64 -w 0
      echo
    done
    exit 1
  fi
  tail -n 4 "$log"
done
