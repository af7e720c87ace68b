#!/usr/bin/env bash
# Set up a development environment: system packages the tests need (Debian's zookeeper,
# chromium for the status-page test, faketime (libfaketime) for the clock-skew tests, spin and
# gcc for the protocol model in model/, Node.js for clients/node/ and for the stand-in Backbeat
# processor of the bridge tests, redis-server for those tests, prometheus for promtool to check
# deploy/prometheus/), the npm packages of that processor (tests/node, from its lock file), a
# virtualenv in .venv and the package with its dev extra.
# Idempotent; safe to run on a fresh machine (as root, or with sudo available).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/share/zookeeper/bin/zkServer.sh ] || need+=(zookeeper)
command -v java >/dev/null 2>&1 || need+=(default-jre-headless)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || need+=(faketime)  # skew tests
command -v spin >/dev/null 2>&1 || need+=(spin)    # model/check.sh
command -v gcc >/dev/null 2>&1 || need+=(gcc)      # model/check.sh compiles spin's verifier
command -v node >/dev/null 2>&1 || need+=(nodejs)  # clients/node (Node >= 18) and its tests
command -v npm >/dev/null 2>&1 || need+=(npm)  # tests/node: the stand-in Backbeat processor
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)  # the Backbeat bridge tests
command -v promtool >/dev/null 2>&1 || need+=(prometheus)  # promtool checks deploy/prometheus
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING' || true
.venv/bin/python -m pip install -q -e '.[dev]' 2>&1 | grep -v '^WARNING' || true
.venv/bin/python -c "import locstatus, kazoo, pymongo, fastapi, redis" # fail loudly if the install did not take
# the stand-in Backbeat queue processor of the bridge tests: Backbeat's own npm clients
(cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
