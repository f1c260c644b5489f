#!/usr/bin/env bash
# The fault-injection suite in one command (issue: fault-injection suite).
#
#   cluster-tests/faults/run.sh --profile short      # every workload and nemesis kind, a few minutes
#   cluster-tests/faults/run.sh --profile long       # 4 workloads x 450 s of random faults
#   cluster-tests/faults/run.sh --time 600 --nemesis all --seed 42 --profile long
#   cluster-tests/faults/run.sh --release ...        # against release builds
#
# Builds quorumq, quorumqctl and quorumq-faults, installs iproute2 and
# iptables when missing (Debian, as root), and runs quorumq-faults with the
# remaining flags (see `--help`). Nodes run in network namespaces when this
# runs as root; otherwise on 127.0.0.1 with process faults only. Results go
# to cluster-tests/faults/results/<time>-seed<S>/. The last line printed is
# the verdict; the exit status is 0 only when nothing was lost or unexpected.
set -euo pipefail
cd "$(dirname "$0")/../.."
profile_dir=debug
cargo_flags=()
args=()
for a in "$@"; do
  if [ "$a" = "--release" ]; then
    profile_dir=release
    cargo_flags=(--release)
  else
    args+=("$a")
  fi
done
if [ "$(id -u)" = 0 ] && { ! command -v iptables >/dev/null || ! command -v ip >/dev/null || ! command -v tc >/dev/null; }; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 iptables >/dev/null
fi
cargo build "${cargo_flags[@]}" --bin quorumq --bin quorumqctl --bin quorumq-faults
export QUORUMQ_BIN="$PWD/target/$profile_dir/quorumq"
export QUORUMQCTL_BIN="$PWD/target/$profile_dir/quorumqctl"
exec "target/$profile_dir/quorumq-faults" "${args[@]}"
