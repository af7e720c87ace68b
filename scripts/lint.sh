#!/usr/bin/env bash
# ruff over the package, tests and benchmarks, mypy --strict over the package, and the import
# contracts of pyproject.toml ([tool.importlinter]: layers only look down, no cycles) with
# import-linter. Run after scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check locstatus tests bench
.venv/bin/mypy locstatus
.venv/bin/lint-imports --no-cache --no-logo
