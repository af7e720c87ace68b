#!/usr/bin/env bash
# The reliability suite (issue 8, docs/reliability.md): fault and consistency scenarios on
# SQLite, a 3-node ZooKeeper ensemble and MongoDB, bad-input properties, and the end report.
#
#   scripts/reliability.sh                 # CI length: LOCSTATUS_RELIABILITY_SECONDS=120 (~3 min)
#   scripts/reliability.sh --long          # ~20-25 minutes (LOCSTATUS_RELIABILITY_SECONDS=1200)
#   scripts/reliability.sh --duration 600  # any budget in seconds
#   scripts/reliability.sh --with-reused   # also the existing single-scenario tests it builds on
#
# Extra arguments after `--` go to pytest. The report is printed at the end and written as JSON
# to $LOCSTATUS_RELIABILITY_REPORT (default: ${TMPDIR:-/tmp}/locstatus-reliability-report.json).
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${LOCSTATUS_RELIABILITY_SECONDS:-120}"
targets=(tests/reliability)
while [ $# -gt 0 ]; do
  case "$1" in
    --long) duration=1200; shift ;;
    --duration) duration="${2:?--duration needs seconds}"; shift 2 ;;
    --duration=*) duration="${1#--duration=}"; shift ;;
    --with-reused)
      targets+=(tests/test_zk_faults.py tests/test_no_lost_updates.py tests/test_bad_input.py
                tests/test_schemathesis.py tests/test_check_processes.py)
      shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$duration" in
  ''|*[!0-9.]*) echo "--duration must be a number of seconds, got '$duration'" >&2; exit 2 ;;
esac

scripts/setup.sh
export LOCSTATUS_RELIABILITY_SECONDS="$duration"
export LOCSTATUS_RELIABILITY_REPORT="${LOCSTATUS_RELIABILITY_REPORT:-${TMPDIR:-/tmp}/locstatus-reliability-report.json}"
start=$(date +%s)
status=0
.venv/bin/python -m pytest "${targets[@]}" -p no:cacheprovider -q "$@" || status=$?
echo "reliability suite (LOCSTATUS_RELIABILITY_SECONDS=$duration) finished in $(( $(date +%s) - start )) s; report: $LOCSTATUS_RELIABILITY_REPORT"
exit "$status"
