#!/usr/bin/env bash
# The demo's smoke test and the end-to-end tests that drive the applier (refusals, recovery,
# drift, routing, TLS, pods, Gateway API; and what the template does with fleet settings,
# filters and long-lived connections) with the test hosts on HAProxy 3.0, which
# tests/setup.sh builds; ./tests/run.sh runs every test on Debian's 2.6. CI runs both.
# Arguments replace the test filters, e.g. `./tests/run-haproxy30.sh refusals::`.
set -euo pipefail
cd "$(dirname "$0")/.."

setup_env=$(bash tests/setup.sh)
eval "$setup_env"
export HAFLEET_HAPROXY="${HAFLEET_HAPROXY30:?tests/setup.sh prints it}"
echo "HAProxy on the test hosts: HAFLEET_HAPROXY=$HAFLEET_HAPROXY"

[ $# -gt 0 ] || set -- refusals:: recovery:: drift:: routing:: tls:: settings:: filters:: traffic:: pods:: gateway::
./deploy/local/demo.sh --smoke
./tests/run.sh -p hafleet-tests --test e2e -- "$@"
