#!/usr/bin/env bash
# ruff and mypy over the package, tests and benchmarks (run after scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check locstatus tests bench
.venv/bin/mypy locstatus
