#!/usr/bin/env bash
# Runs hafleet's whole test suite: unit tests, golden configs checked by haproxy -c, the
# real-server environment's self-tests and the end-to-end tests (kube-apiserver, NATS, sshd,
# HAProxy). Installs whatever is missing first (tests/setup.sh). Extra arguments go to
# `cargo test`, e.g. `./tests/run.sh -p hafleet-renderer`.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_env=$(bash tests/setup.sh)
eval "$setup_env"

# The end-to-end tests run the real binaries; build them first.
cargo build --workspace --bins --locked
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
[ $# -gt 0 ] || set -- --workspace
cargo test --locked "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# One closing line for the whole suite (cargo prints one per test binary, the last often a
# doc-test run with nothing in it).
awk '/^test result:/ { p += $4; f += $6 } END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
exit "$rc"
