#!/usr/bin/env bash
# hafleet on loopback: etcd + kube-apiserver, NATS JetStream, two HAProxy hosts behind their own
# sshd, the three hafleet binaries, two fake nodes with a sample app, and an Ingress routing
# hello.local to it. Prints how to send traffic through HAProxy and writes .demo/env for
# `source`. Runs until Ctrl-C, then stops everything it started.
#
#   ./deploy/local/demo.sh            run until Ctrl-C
#   ./deploy/local/demo.sh --smoke    prove one request through every HAProxy host, stop, exit 0/1
#   ./deploy/local/demo.sh --endpoints pods    hello.local served straight from two fake pods
#
# The hosts run Debian's HAProxy (2.6), or the binary HAFLEET_HAPROXY names: tests/setup.sh
# builds 3.0, so `eval "$(bash tests/setup.sh)"; HAFLEET_HAPROXY=$HAFLEET_HAPROXY30 ./deploy/local/demo.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."

setup_env=$(bash tests/setup.sh)
eval "$setup_env"

cargo build --workspace --bins --locked --quiet
exec "${CARGO_TARGET_DIR:-target}/debug/hafleet-demo" "$@"
