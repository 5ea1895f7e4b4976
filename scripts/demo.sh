#!/usr/bin/env bash
# README command 1: install, then run the demo end to end on the embedded sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export RAY_AUTH_MODE="${RAY_AUTH_MODE:-disabled}" RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/convsts demo --out "${1:-runs/demo}" "${@:2}"
