#!/usr/bin/env bash
# The long suite: every test of scripts/test.sh at full length (LOCSTATUS_TEST_SUITE=long,
# tests/support/suite.py): hypothesis profile `thorough` (every property test at its full
# example count), the reliability scenarios at LOCSTATUS_RELIABILITY_SECONDS=1200 (unless set),
# the large-scale tests at full size. Same tests, same assertions as CI, larger sizes.
# Extra arguments go to pytest (e.g. a path: `scripts/long.sh tests/test_fsm.py`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export LOCSTATUS_TEST_SUITE=long
export LOCSTATUS_RELIABILITY_SECONDS="${LOCSTATUS_RELIABILITY_SECONDS:-1200}"
start=$(date +%s)
status=0
.venv/bin/python -m pytest -p no:cacheprovider "$@" || status=$?
echo "long suite finished in $(( $(date +%s) - start )) s"
exit "$status"
